"""The software prefetch's request pattern (stream_prefetch.h), checked by a C++ program.

Prefetches never change results, so the executor's tests cannot see them: stream_prefetch_check.cpp
includes the header with every request traced, reads streams of several block sizes, distances and
lengths through StreamPrefetch::ahead_block (alone and chained to a successor), and checks each
request against the contract written in its header, computed from the addresses alone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CSRC = HERE.parents[1] / "packages" / "ft-kernels-cpu" / "csrc"
CXX = shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the check")
def test_prefetch_requests_every_line_within_its_leads(tmp_path: Path) -> None:
    exe = tmp_path / "stream_prefetch_check"
    src = HERE / "stream_prefetch_check.cpp"
    flags = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(CSRC)]
    subprocess.run([CXX, *flags, str(src), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    fails = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert run.returncode == 0 and not fails, "\n".join(fails[:20]) or run.stdout[-2000:]
    # 5 block sizes x 5 stream lengths x 2 distances x 2 L1 settings, each alone and chained
    assert run.stdout.count("\nok ") + run.stdout.startswith("ok ") == 200, run.stdout[-2000:]
