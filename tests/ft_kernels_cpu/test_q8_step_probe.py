"""tools/q8_step_probe.cpp: what a step of mxfp4's int8 one-vector row kernel costs, and its parts.

The probe times the package's kernel (fp4::q8_dot_rows_one_vector) on rows of K = 2048 from L1, a copy
of its arithmetic written out in the probe, and that copy with parts left out. Before timing it checks
the package kernel against a float64 dot product of the decoded weights and x's int8 record, and the
copy against the package kernel bit for bit (exit status 1 on either failing), so that the copy's
timings stand for the kernel's. Here it runs with few timings, as a check that it builds, stays right
and reports every line; the timings are for developers (docs/benchmarks.md, thirty-seventh session),
and no test asserts them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import ft_kernels_cpu as fk
from helpers.probes import CXX, build_fp4_probe

STEPS = [
    "kernel",
    "full",
    "no_row_sums",
    "no_group_scales",
    "no_scale_permute",
    "none_of_the_3",
    "products_only",
]


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++ or g++) on PATH to build the probe")
@pytest.mark.skipif(
    "avx512_bf16" not in fk.isa_tiers(), reason="no avx512_bf16 tier on this CPU (the kernel's)"
)
def test_q8_step_probe_checks_its_copy_and_reports_every_step(tmp_path: Path) -> None:
    exe = build_fp4_probe("q8_step_probe", tmp_path)
    run = subprocess.run([str(exe), "3"], capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert run.returncode == 0 and "MISMATCH" not in out, out + run.stderr
    assert "copy bit-identical" in out, out
    check = re.search(r"^check: max error (\S+) \(bound (\S+)\)", out, re.M)
    assert check and float(check.group(1)) <= float(check.group(2)), out
    assert float(re.search(r"^clock ([\d.]+)$", out, re.M).group(1)) > 0, out
    names = re.findall(r"^step (\w+): ([\d.]+) cycles \(([\d.]+) TSC ticks\)$", out, re.M)
    assert [n for n, _, _ in names] == STEPS, out
    assert all(float(c) > 0 and float(t) > 0 for _, c, t in names), out
    bad = subprocess.run([str(exe), "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "timings must be a positive integer" in bad.stderr, bad.stdout + bad.stderr
