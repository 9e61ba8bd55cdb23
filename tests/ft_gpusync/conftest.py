"""Fake GPU runtimes for the ft_gpusync tests: built from fakes/*.c with the C compiler."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

FAKES = Path(__file__).parent / "fakes"
ENV = {"cuda": "FT_GPUSYNC_CUDA_LIB", "hip": "FT_GPUSYNC_HIP_LIB"}
BACKENDS = ["cuda", "hip"]


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("the fault-injection tests need a C compiler (cc) to build the fake runtimes")
    out = tmp_path_factory.mktemp("fakes")
    libs = {}
    for backend in BACKENDS:
        lib = out / f"libfake_{backend}.so"
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(FAKES / f"fake_{backend}.c")], check=True
        )
        libs[backend] = lib
    return libs


@pytest.fixture
def fake(fake_libs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """Points ft_gpusync at the fake runtime of `backend` with a clean sticky-error state."""
    backend = request.param
    monkeypatch.setenv(ENV[backend], str(fake_libs[backend]))
    monkeypatch.delenv("FT_FAKE_FAIL", raising=False)
    monkeypatch.delenv("FT_FAKE_PENDING", raising=False)
    hip = ctypes.CDLL(str(fake_libs["hip"]))  # the same handle ft_gpusync gets from dlopen
    hip.fake_hip_reset()
    return backend, hip
