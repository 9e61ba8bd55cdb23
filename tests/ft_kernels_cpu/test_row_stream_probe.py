"""tools/row_stream_probe.cpp: mxfp4's one-vector row kernel at every bank offset, against float64;
tools/two_stream_probe.cpp: the same kernel over rows read as several streams in turns.

The probe streams rows of e2m1 nibbles and e8m0 scales through fp4::q8_dot_rows_multi with the bank
at 0, 16, 32 and 48 bytes past a cache line, and checks every row it keeps a reference of against a
float64 dot product (within the int8 rounding of x) and against the bits of offset 0 (exit status 1
on a mismatch). Here it runs small (K = 1408: 44 blocks, a 12-block tail of a scale group; calls of 7
rows; the calls in address order and shuffled), as a check that the tool builds and stays right at
every offset; its timings are for developers (docs/benchmarks.md, twenty-fourth and twenty-fifth
sessions).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import ft_kernels_cpu as fk
from helpers.probes import CXX, build_fp4_probe


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the probe")
@pytest.mark.skipif(
    "avx512_bf16" not in fk.isa_tiers(), reason="no avx512_bf16 tier on this CPU (the kernel's)"
)
def test_row_stream_probe_matches_float64_at_every_offset(tmp_path: Path) -> None:
    exe = build_fp4_probe("row_stream_probe", tmp_path)
    for order in ("seq", "shuffled"):
        run = subprocess.run([str(exe), "4", "1408", "7", order], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "MISMATCH" not in run.stdout, run.stdout + run.stderr
        assert f"calls of 7 rows ({order})" in run.stdout, run.stdout
        lines = [line for line in run.stdout.splitlines() if line.startswith("offset")]
        assert [line.split(":")[0].split()[-1] for line in lines] == ["0", "16", "32", "48"], run.stdout
    bad = subprocess.run(
        [str(exe), "4", "1408", "7", "backwards"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "seq|shuffled" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the probe")
@pytest.mark.skipif(
    "avx512_bf16" not in fk.isa_tiers(), reason="no avx512_bf16 tier on this CPU (the kernel's)"
)
def test_two_stream_probe_builds_and_keeps_every_row(tmp_path: Path) -> None:
    # The probe compares every row's result with that of one stream in address order without
    # prefetch (exit status 1 on a difference): rows read in turns of 3, with a prefetch distance,
    # from 1 to 4 streams, K = 1408 (a row's last scale group short), must give the same bits. A
    # small build check; its timings are for developers (docs/benchmarks.md, twenty-seventh session).
    exe = build_fp4_probe("two_stream_probe", tmp_path)
    for streams in ("1", "2", "4"):
        run = subprocess.run(
            [str(exe), streams, "3", "1024", "4", "1408"], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0 and "MISMATCH" not in run.stdout, run.stdout + run.stderr
        assert f"{streams} stream(s)" in run.stdout and "turns of 3 rows" in run.stdout, run.stdout
    bad = subprocess.run([str(exe), "5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage: two_stream_probe" in bad.stderr, bad.stdout + bad.stderr
