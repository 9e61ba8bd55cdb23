"""Building the developer probes of packages/ft-kernels-cpu/tools that run mxfp4's int8 row kernels:
each probe's own source with warnings as errors, then linked with the kernels' sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PKG = Path(__file__).parents[2] / "packages" / "ft-kernels-cpu"
CXX = shutil.which("c++") or shutil.which("g++")
FP4_SOURCES = ("kernels/fp4_kernels.cpp", "kernels/int8_codes.cpp", "cpu_features.cpp")


def build_fp4_probe(tool: str, tmp_path: Path) -> Path:
    """tools/<tool>.cpp built against csrc/ and linked with FP4_SOURCES into tmp_path/<tool>."""
    assert CXX is not None, "no C++ compiler (c++ or g++) on PATH"
    obj, exe = tmp_path / f"{tool}.o", tmp_path / tool
    include = ["-std=c++17", "-O2", "-I", str(PKG / "csrc")]
    source = str(PKG / "tools" / f"{tool}.cpp")
    subprocess.run([CXX, *include, "-Wall", "-Wextra", "-Werror", "-c", source, "-o", str(obj)], check=True)
    kernels = [str(PKG / "csrc" / p) for p in FP4_SOURCES]
    subprocess.run([CXX, *include, str(obj), *kernels, "-o", str(exe)], check=True)
    return exe
