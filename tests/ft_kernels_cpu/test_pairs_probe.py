"""tools/pairs_probe.cpp: the avx2 tier's int8 row kernels (avx2_pairs.h) against float64, both paths.

The probe calls rows_chains (one FMA chain per vector) and rows_by4 (four vectors reduced across
lanes) directly, on rows of Q4_0-like codes and x in pairs::quantize's records, and compares every
result with a float64 dot product of the same codes, steps and scales (exit status 1 on a mismatch).
Here it runs small (K = 1504: 47 blocks, a 3-block tail; 2 calls of 8 rows), as a check that the
tool builds and that both paths agree with the reference at 1, 2, 3, 4 and 8 vectors; its timings
are for developers (docs/benchmarks.md).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import ft_kernels_cpu as fk

HERE = Path(__file__).parent
PKG = HERE.parents[1] / "packages" / "ft-kernels-cpu"
CXX = shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the probe")
@pytest.mark.skipif("avx2" not in fk.isa_tiers(), reason="no AVX2 on this CPU to run the probe")
def test_pairs_probe_paths_match_float64(tmp_path: Path) -> None:
    exe = tmp_path / "pairs_probe"
    flags = ["-std=c++17", "-O2", "-mavx2", "-mfma", "-mf16c", "-Wall", "-Wextra", "-Werror"]
    flags += ["-I", str(PKG / "csrc")]
    srcs = [str(PKG / "tools" / "pairs_probe.cpp"), str(PKG / "csrc" / "kernels" / "int8_codes.cpp")]
    subprocess.run([CXX, *flags, *srcs, "-o", str(exe)], check=True)
    run = subprocess.run([str(exe), "1504", "8", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "MISMATCH" not in run.stdout, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if "max error" in line]
    assert len(lines) == 5 and sum("by4" in line for line in lines) == 2, run.stdout
