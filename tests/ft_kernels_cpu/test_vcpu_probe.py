"""tools/vcpu_probe.cpp: the vCPU probe scripts/gpu-check writes into machine.log.

It builds with the flags the other probes' tests use (warnings as errors) and runs small here. The
checks are on what it reports, not on this machine's speed:
- the CPU family and model as /proc/cpuinfo gives them (where it does);
- a clock and an SMT line for every vCPU the process may run on;
- clocks that are positive, with each vCPU's fastest window at least as fast as its median one;
- on AVX-512 int8 CPUs, every 512-bit rate line, each above 0.05 and below 8 a cycle. Chains the
  compiler folded away read far above 8 (12.1 for VPDPBUSD when the chains lost their register
  constraints); a denormal FMA operand read 0.01 on the GPU machine's Xeon (microcode assists), though
  a Zen 4 core takes denormals at full rate.
A bad argument must exit 2, naming it.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import ft_kernels_cpu as fk

HERE = Path(__file__).parent
PKG = HERE.parents[1] / "packages" / "ft-kernels-cpu"
CXX = shutil.which("c++") or shutil.which("g++")
RATES = [
    "vpdpbusd", "vpaddd", "vpsrlw", "vgf2p8affineqb", "vpermb", "vpermt2d", "vpermt2w", "vpermps",
    "vcvtph2ps", "vcvtdq2ps", "vfmadd", "vpmaddubsw", "vpmaddwd", "vpdpwssd", "vpackssdw",
]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CXX is None:
        pytest.skip("no C++ compiler (c++ or g++) on PATH to build the probe")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the probe is x86-64 only")
    exe = tmp_path_factory.mktemp("vcpu") / "vcpu_probe"
    flags = ["-std=c++17", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror"]
    subprocess.run([CXX, *flags, str(PKG / "tools" / "vcpu_probe.cpp"), "-o", str(exe)], check=True)
    return exe


def test_vcpu_probe_reports_every_vcpu(probe: Path) -> None:
    run = subprocess.run([str(probe), "20"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    cpus = sorted(os.sched_getaffinity(0))
    assert f"vcpus {len(cpus)}\n" in out, out
    assert float(re.search(r"^tsc_ghz ([\d.]+)$", out, re.M).group(1)) > 0.1, out
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    family = re.search(r"^cpu family\s*: (\d+)$", cpuinfo, re.M)
    model = re.search(r"^model\s*: (\d+)$", cpuinfo, re.M)
    if family and model:  # the kernel's own reading of CPUID
        assert f"cpu family {family.group(1)} model {model.group(1)}\n" in out, out
    for kind in ("alone", "busy"):
        clocks = re.findall(rf"^clock {kind} cpu (\d+): ([\d.]+) / ([\d.]+)$", out, re.M)
        assert [int(c) for c, _, _ in clocks] == cpus, out
        for _, fastest, median in clocks:
            assert 0 < float(median) <= float(fastest), out
    smt = re.findall(r"^smt cpu (\d+) \+ cpu (\d+): ([\d.]+)$", out, re.M)
    assert [(int(a), int(b)) for a, b, _ in smt] == [(cpus[0], c) for c in cpus[1:]], out
    assert all(float(r) > 0 for _, _, r in smt), out
    rates = dict(re.findall(r"^rate (\w+): ([\d.]+)$", out, re.M))
    if "avx512_bf16" in fk.isa_tiers():
        assert sorted(rates) == sorted(RATES), out
        for name, value in rates.items():
            assert 0.05 < float(value) < 8, (name, value)


def test_vcpu_probe_rejects_a_bad_window_count(probe: Path) -> None:
    run = subprocess.run([str(probe), "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "windows must be >= 1, got '0'" in run.stderr
