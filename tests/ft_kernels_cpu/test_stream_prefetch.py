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


# Each helper called from a function of its own, as a kernel's loop calls it; noinline keeps the
# functions apart so that their assembly can be read one by one.
_HELPERS_TU = r"""
#include "kernels/stream_prefetch.h"
namespace ft {
#define PROBE(name) extern "C" __attribute__((noinline)) void name
PROBE(probe_ahead)(const StreamPrefetch<>& pf, const char* p) { pf.ahead(p); }
PROBE(probe_ahead_l2)(const StreamPrefetch<PrefetchHint::L2>& pf, const char* p) { pf.ahead(p); }
PROBE(probe_ahead_by)(const StreamPrefetch<>& pf, const char* p) { pf.ahead_by(p, 4096); }
PROBE(probe_ahead_block)(const StreamPrefetch<>& pf, const char* p) { pf.ahead_block<144>(p); }
PROBE(probe_ahead_range)(const StreamPrefetch<>& pf, const char* p, size_t n) { pf.ahead_range(p, n); }
PROBE(probe_prefetch_line)(const char* p) { prefetch_line<PrefetchHint::L2>(p); }
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the check")
@pytest.mark.parametrize("opt", ["-O2", "-O3"])
def test_prefetch_helpers_survive_the_optimizer(tmp_path: Path, opt: str) -> None:
    # GCC counts a prefetch as no side effect: a helper whose only effect is a prefetch, left out of
    # line, was found pure and its calls deleted, so the kernels' loops issued no prefetch at all
    # (docs/benchmarks.md, twenty-ninth session). Every helper must leave its prefetch instructions
    # in the function that calls it.
    src = tmp_path / "helpers.cpp"
    src.write_text(_HELPERS_TU)
    asm = tmp_path / "helpers.s"
    flags = ["-std=c++17", opt, "-fPIC", "-I", str(CSRC)]
    subprocess.run([CXX, *flags, "-S", str(src), "-o", str(asm)], check=True)
    bodies: dict[str, list[str]] = {}
    current = None
    for line in asm.read_text().splitlines():
        if line.startswith("probe_") and line.endswith(":"):
            current = line[:-1]
            bodies[current] = []
        elif current is not None:
            bodies[current].append(line)
    names = ["probe_ahead", "probe_ahead_l2", "probe_ahead_by", "probe_ahead_block", "probe_ahead_range"]
    assert set(names) | {"probe_prefetch_line"} <= set(bodies), sorted(bodies)
    target = subprocess.run([CXX, "-dumpmachine"], capture_output=True, text=True).stdout
    if not target.startswith(("x86_64", "amd64", "i686")):
        pytest.skip(f"the check reads x86 prefetch instructions; the compiler targets {target.strip()}")
    for name in names + ["probe_prefetch_line"]:
        body = "\n".join(bodies[name])
        assert "prefetch" in body, f"{name} ({opt}) issues no prefetch:\n{body[:1500]}"
