"""The worker pool under back-to-back runs of different sizes, with more threads than cores.

A unit is claimed with one fetch_add on a word that holds its end and the next unit: the run's one
counter (FT_CPU_MOE_CLAIMS=shared, Intel's default) or the range of a pass that each worker starts
from (ranges, the default elsewhere; the others take from it once theirs is empty). A worker that
is late from one run (preempted between runs: here 6 threads share the machine's cores) can take a
unit of the next one and must run it as that run's. Every unit of every run must run exactly once,
with the run's own task: the outputs are compared, run by run, with the bits of a one-thread
executor (whose own results the format tests check against float64 references), and the units run
are counted.
"""

from __future__ import annotations

import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import random_bf16_executor
from helpers.moe_reference import BF16

H, I, E, TOP_K = 256, 128, 8, 4
CLAIMS = ["shared", "ranges"]


@pytest.fixture(params=CLAIMS)
def claims(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    # Read when an executor's pool is made.
    monkeypatch.setenv("FT_CPU_MOE_CLAIMS", request.param)
    return request.param


def make_executor(threads: int) -> fk.MoeExecutor:
    return random_bf16_executor(H, I, E, TOP_K, max_tokens=3, num_threads=threads)


def tasks() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    out = []
    # Runs of 1, 2 and 3 tokens over 1 to 8 distinct experts: different unit counts from run to run.
    for ids in (
        [[0, 1, 2, 3]],
        [[5, 5, -1, 5]],
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [[7, -1, -1, -1], [-1, 6, -1, -1], [2, 2, 2, 2]],
    ):
        a = np.array(ids, dtype=np.int32)
        x = rng.standard_normal((a.shape[0], H)).astype(BF16)
        w = rng.random(a.shape, dtype=np.float32)
        out.append((x, a, w))
    return out


@pytest.mark.parametrize("threads", [3, 6])
def test_back_to_back_runs_of_different_sizes(claims: str, threads: int) -> None:
    ts = tasks()
    ref_ex = make_executor(1)
    want = [ref_ex.run(0, x, ids, w).view(np.uint16).copy() for x, ids, w in ts]
    ex = make_executor(threads)
    p0 = ex.pool_profile()
    for i in range(400):
        k = (i * 7 + i // 5) % len(ts)
        x, ids, w = ts[k]
        y = ex.run(0, x, ids, w).view(np.uint16)
        np.testing.assert_array_equal(y, want[k], err_msg=f"run {i} (task {k}) on {threads} threads")
    p = ex.pool_profile()
    assert p["runs"] - p0["runs"] == 400


@pytest.mark.parametrize("threads", [3, 6])
def test_runs_without_gaps_between_them(claims: str, threads: int) -> None:
    # time_runs submits the tasks back to back from C++ (no Python between runs): the workers of one
    # run are still finishing their claims when the next one starts. Each task's output is checked
    # in turn by ending a sequence on it.
    ts = [t for t in tasks() if t[1].shape[0] == 1]
    ref_ex = make_executor(1)
    ex = make_executor(threads)
    for k in range(len(ts)):
        x, ids, w = ts[k]
        other = ts[1 - k]
        seq_ids = np.stack([other[1], ids] * 150)  # [300, 1, TOP_K]: the two tasks alternating
        seq_w = np.stack([other[2], w] * 150)
        y = np.zeros((1, H), dtype=np.uint16)
        secs = ex.time_runs(0, x, seq_ids, seq_w, out=y)
        assert secs > 0
        np.testing.assert_array_equal(y, ref_ex.run(0, x, ids, w).view(np.uint16))


@pytest.mark.parametrize("threads", [2, 3, 6, 12])
def test_either_claim_policy_runs_every_unit_once(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    # The same runs make the same units whatever the policy; a unit run twice (or skipped) changes
    # the pool's count of units run. 12 threads: more workers than units in some passes (empty
    # ranges), 2: ranges of many units each.
    ts = tasks()
    counts = {}
    for policy in CLAIMS:
        monkeypatch.setenv("FT_CPU_MOE_CLAIMS", policy)
        ex = make_executor(threads)
        assert ex.claims == policy
        p0 = ex.pool_profile()
        for i in range(60):
            x, ids, w = ts[i % len(ts)]
            ex.run(0, x, ids, w)
        p = ex.pool_profile()
        counts[policy] = (p["units1"] - p0["units1"], p["units2"] - p0["units2"])
    assert counts["ranges"] == counts["shared"], counts
    assert min(counts["ranges"]) > 0


def test_claims_default_is_the_vendors(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ranges on AMD (and other vendors), one counter on Intel (worker_pool.cpp's parse_claims).
    monkeypatch.delenv("FT_CPU_MOE_CLAIMS", raising=False)
    with open("/proc/cpuinfo") as f:
        vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    assert make_executor(2).claims == ("shared" if vendor == "GenuineIntel" else "ranges")


@pytest.mark.parametrize("value", ["bogus", "Ranges", "1"])
def test_claims_variable_is_checked(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FT_CPU_MOE_CLAIMS", value)
    with pytest.raises(fk.KernelError, match=f"FT_CPU_MOE_CLAIMS='{value}' must be 'ranges'"):
        make_executor(2)


def test_time_runs_checks_its_output_array() -> None:
    ex = make_executor(2)
    x, ids, w = tasks()[0]
    with pytest.raises(ValueError, match=r"out must have shape \[1, 256\]"):
        ex.time_runs(0, x, ids[None], w[None], out=np.zeros((2, H), np.uint16))
    with pytest.raises(TypeError, match="out must have dtype bfloat16"):
        ex.time_runs(0, x, ids[None], w[None], out=np.zeros((1, H), np.float32))
