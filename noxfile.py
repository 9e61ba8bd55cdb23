"""Developer and CI entry points for the ft monorepo.

Default sessions (`nox`): lint, tests. The others are run by name: wheels, demo, cuda, rocm.
Native packages build with --no-build-isolation into a persistent `build/{wheel_tag}` folder
inside each package, so a second run only recompiles what changed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2024.3"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent

# Bottom to top: each package depends only on packages before it.
PACKAGES = ["ft-kernels-cpu", "ft-gpusync", "ft-moe-runtime", "ft-models", "ft-server"]
NATIVE_PACKAGES = ["ft-kernels-cpu", "ft-gpusync"]

BUILD_DEPS = ["scikit-build-core>=0.10", "pybind11>=2.12", "ninja", "numpy", "ml_dtypes"]
# torch pinned: a bare `torch` resolves to a multi-GB CUDA build; 2.13.0+cpu comes from the local wheel dir.
# Triton runs on CPU tensors under TRITON_INTERPRET=1.
RUNTIME_DEPS = ["torch==2.13.0", "triton==3.9.0", "safetensors", "gguf"]
# gguf: the reference dequantizers of the kernel tests; setuptools: the build backend of the stand-in
# packages of test_kernels_ab.py (virtualenv stops seeding it from Python 3.12).
TEST_DEPS = ["pytest", "gguf", "setuptools"]


def _package_dir(dist: str) -> str:
    return str(ROOT / "packages" / dist)


def _install_packages(session: nox.Session, dists: list[str], *config: str) -> None:
    """Build and install `dists` in order, without isolation, so the CMake build dirs are reused."""
    for dist in dists:
        session.install("--no-build-isolation", "--no-deps", *config, _package_dir(dist))


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """ruff, and import-linter's layer and no-torch contracts (read from source, nothing installed)."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", ".")
    src_dirs = os.pathsep.join(_package_dir(dist) + "/src" for dist in PACKAGES)
    session.run("lint-imports", env={"PYTHONPATH": src_dirs})


@nox.session(reuse_venv=True)
def tests(session: nox.Session) -> None:
    """Build and install all five packages, then run pytest on tests/ (posargs go to pytest)."""
    session.install(*dict.fromkeys([*BUILD_DEPS, *RUNTIME_DEPS, *TEST_DEPS]))
    _install_packages(session, PACKAGES)
    session.run("pytest", "tests/", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(reuse_venv=True)
def wheels(session: nox.Session) -> None:
    """Build every package's wheel into dist/, then smoke-test the kernels wheel alone in a fresh venv."""
    session.install(*BUILD_DEPS)
    dist_dir = ROOT / "dist"
    shutil.rmtree(dist_dir, ignore_errors=True)
    for dist in PACKAGES:
        session.run(
            "python", "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "-w", str(dist_dir), _package_dir(dist),
        )  # fmt: skip
    kernels_wheels = sorted(dist_dir.glob("ft_kernels_cpu-*.whl"))
    if len(kernels_wheels) != 1:
        session.error(f"expected one ft_kernels_cpu wheel in {dist_dir}, found {kernels_wheels}")

    venv_dir = Path(session.create_tmp()) / "kernels-only-venv"
    shutil.rmtree(venv_dir, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv_dir))
    python = str(venv_dir / "bin" / "python")
    session.run(python, "-m", "pip", "install", str(kernels_wheels[0]), "numpy", "ml_dtypes", external=True)
    no_torch = "import importlib.util as u, sys; sys.exit('torch importable' if u.find_spec('torch') else 0)"
    session.run(python, "-c", no_torch, external=True)
    session.run(python, str(ROOT / "scripts" / "smoke_kernels.py"), external=True)


@nox.session(reuse_venv=True)
def demo(session: nox.Session) -> None:
    """The main job: the bf16 CPU MoE kernel bench at the Qwen3-30B-A3B shape (posargs go to the bench)."""
    session.install(*BUILD_DEPS)
    _install_packages(session, ["ft-kernels-cpu"])
    bench = ["python", "-m", "ft_kernels_cpu.bench", "--format", "bf16", "--shape", "qwen3-30b-a3b"]
    session.run(*bench, *session.posargs)


@nox.session(venv_backend="none", default=False)
def cuda(session: nox.Session) -> None:
    """On the GPU machine: scripts/gpu-check with the machine's own python. posargs[0]: output dir."""
    out_dir = session.posargs[0] if session.posargs else "gpu-check-out"
    session.run("bash", str(ROOT / "scripts" / "gpu-check"), out_dir, external=True)


@nox.session(default=False)
def rocm(session: nox.Session) -> None:
    """HIP build of the native packages with Debian's hipcc, and their non-GPU tests."""
    if shutil.which("hipcc") is None:
        session.error("hipcc is not on PATH; install it with: apt-get install hipcc")
    # Without HIP_PLATFORM=amd, hipcc finds nvcc and compiles for NVIDIA instead.
    session.env["HIP_PLATFORM"] = "amd"
    session.install(*BUILD_DEPS, *TEST_DEPS)
    # A build dir of its own, so the cached FT_GPU_BACKEND=hip never leaks into the default build.
    _install_packages(
        session,
        NATIVE_PACKAGES,
        "-C", "cmake.define.FT_GPU_BACKEND=hip",
        "-C", "build-dir=build/hip-{wheel_tag}",
    )  # fmt: skip
    session.run("pytest", "tests/ft_kernels_cpu", "tests/ft_gpusync", "-m", "not gpu", *session.posargs)
