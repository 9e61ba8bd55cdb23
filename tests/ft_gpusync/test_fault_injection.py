"""Probes against fake CUDA driver / HIP runtime libraries that fail chosen calls (no GPU needed).

The fakes (fakes/*.c) are compiled here and loaded through the same dlopen path as the real runtimes,
selected with FT_GPUSYNC_CUDA_LIB / FT_GPUSYNC_HIP_LIB.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ft_gpusync import _ft_gpusync as native

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


def both(f):
    return pytest.mark.parametrize("fake", BACKENDS, indirect=True)(f)


@both
def test_fake_runtime_loads_and_the_probe_passes(fake) -> None:
    backend, _ = fake
    st = native.runtime_status(backend)
    assert st["available"] and st["reason"] == "" and st["library"].endswith(f"libfake_{backend}.so")
    r = native.probe_memop_graph(backend)
    assert r == {"supported": True, "detail": "64-bit stream write/wait captured and replayed"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_runtime_is_reported_not_raised(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV[backend], str(tmp_path / "libnothing.so"))
    st = native.runtime_status(backend)
    assert not st["available"] and "cannot load" in st["reason"]
    assert native.probe_memop_graph(backend) == {"supported": False, "detail": st["reason"]}


@pytest.mark.parametrize(
    ("calls", "detail"),
    [
        ({"cuda": "cuStreamBeginCapture", "hip": "hipStreamBeginCapture"}, "begin capture failed"),
        (
            {"cuda": "cuStreamWriteValue64", "hip": "hipStreamWriteValue64"},
            "stream write value failed.* under capture",
        ),
        (
            {"cuda": "cuStreamWaitValue64", "hip": "hipStreamWaitValue64"},
            "stream wait value failed.* under capture",
        ),
        ({"cuda": "cuStreamEndCapture", "hip": "hipStreamEndCapture"}, "end capture failed"),
        ({"cuda": "cuGraphInstantiate", "hip": "hipGraphInstantiate"}, "graph instantiate failed"),
        ({"cuda": "cuGraphLaunch", "hip": "hipGraphLaunch"}, "graph replay failed"),
        ({"cuda": "cuMemHostAlloc", "hip": "hipHostMalloc"}, "mapped host alloc failed"),
    ],
)
@both
def test_a_failing_call_makes_the_probe_report_unsupported_and_clean_up(
    fake, monkeypatch, calls, detail
) -> None:
    backend, hip = fake
    monkeypatch.setenv("FT_FAKE_FAIL", f"{calls[backend]}=700")
    r = native.probe_memop_graph(backend)
    assert not r["supported"]
    assert re.search(detail, r["detail"]), r["detail"]
    assert "error 700" in r["detail"]
    # The error scope consumed the sticky error the failed call left (HIP), so eager work goes on.
    assert hip.fake_hip_sticky() == 0
    monkeypatch.delenv("FT_FAKE_FAIL")
    assert native.probe_memop_graph(backend)["supported"]


def test_end_capture_failure_leaves_no_last_error_behind(fake_libs, monkeypatch) -> None:
    monkeypatch.setenv(ENV["hip"], str(fake_libs["hip"]))
    hip = ctypes.CDLL(str(fake_libs["hip"]))
    hip.fake_hip_reset()
    monkeypatch.setenv("FT_FAKE_FAIL", "hipStreamEndCapture=901")
    assert "end capture failed: hip error 901" in native.probe_memop_graph("hip")["detail"]
    assert hip.fake_hip_sticky() == 0


def test_an_error_pending_before_the_probe_is_raised_and_left_in_place(fake_libs, monkeypatch) -> None:
    monkeypatch.setenv(ENV["hip"], str(fake_libs["hip"]))
    hip = ctypes.CDLL(str(fake_libs["hip"]))
    hip.fake_hip_reset()
    monkeypatch.setenv("FT_FAKE_PENDING", "42")
    with pytest.raises(
        native.PendingGpuError, match=r"earlier hip error is pending \(hip error 42.*did not run"
    ):
        native.probe_memop_graph("hip")
    assert hip.fake_hip_sticky() == 42  # still there for its owner


@pytest.mark.parametrize(("backend", "refused"), [("hip", True), ("cuda", False)])
def test_host_func_under_capture_is_refused_where_replay_is_unsafe(
    fake_libs, monkeypatch, backend, refused
) -> None:
    monkeypatch.setenv(ENV[backend], str(fake_libs[backend]))
    capturing_stream = 0xCA97  # the fakes report this handle as capturing
    if refused:
        with pytest.raises(RuntimeError, match=r"cannot be captured on ROCm.*--cuda-graph-max-bs 0"):
            native.check_host_func_allowed(backend, capturing_stream)
    else:
        native.check_host_func_allowed(backend, capturing_stream)
    native.check_host_func_allowed(backend, 0)  # eager: always allowed


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="backend='metal' is unknown"):
        native.runtime_status("metal")
