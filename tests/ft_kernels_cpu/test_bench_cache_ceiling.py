"""The bench's --cache-ceiling: each timed row followed by the same steps over one step's experts held
in the last-level cache, reported as cache_gbs / cache_ratio / cache_us_per_step (null without the flag,
and where one step's experts would fill more than 3/4 of the last-level cache)."""

from __future__ import annotations

import json

import pytest

from ft_kernels_cpu import bench, bench_formats
from ft_kernels_cpu.shapes import get_shape

ARGS = ["--threads", "1", "--top-k", "2", "--pool-mib", "8", "--samples", "1", "--min-time", "0.01", "--json"]


def rows(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[list[dict], str]:
    assert bench.main(argv) == 0
    out = capsys.readouterr()
    return [json.loads(line) for line in out.out.splitlines() if line.startswith("{")], out.err


@pytest.mark.parametrize("routing", ["distinct", "shared"])
def test_cache_ceiling_counts_one_steps_experts(capsys: pytest.CaptureFixture[str], routing: str) -> None:
    # Batch 2: with distinct routing a cached step reads 2 tokens x 2 experts, with shared routing 2.
    # One sample, so the medians are that sample's and GB/s must be those bytes over its time.
    [row], err = rows(
        capsys, ["--format", "mxfp4", "--batch", "2", "--routing", routing, "--cache-ceiling", *ARGS]
    )
    experts = 4 if routing == "distinct" else 2
    step_bytes = experts * bench_formats.load("mxfp4").expert_bytes(get_shape("qwen3-30b-a3b"))
    assert f"# cache ceiling: {experts} experts ({step_bytes / 2**20:.1f} MiB) re-read every step" in err
    assert row["cache_us_per_step"] > 0
    assert row["cache_gbs"] == pytest.approx(step_bytes / row["cache_us_per_step"] / 1e3, rel=1e-3)
    assert row["cache_ratio"] > 0  # over the reads around the cached row, which drift from the others
    assert "in cache" in err


def test_cache_keys_are_null_without_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    [row], err = rows(capsys, ["--format", "q4_0", *ARGS])
    assert row["cache_gbs"] is None and row["cache_ratio"] is None and row["cache_us_per_step"] is None
    assert "cache ceiling" not in err


def test_cache_ceiling_says_when_the_experts_do_not_fit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 4 MiB last-level cache: two mxfp4 experts of qwen3-30b-a3b (5 MiB) fill more than 3/4 of it.
    monkeypatch.setattr(bench, "last_level_cache_bytes", lambda: 4 << 20)
    [row], err = rows(capsys, ["--format", "mxfp4", "--cache-ceiling", *ARGS])
    mib = 2 * bench_formats.load("mxfp4").expert_bytes(get_shape("qwen3-30b-a3b")) / 2**20
    assert mib > 3
    assert (
        f"cache ceiling not measured: one step's 2 experts ({mib:.1f} MiB) fill more than 3/4 of the last"
        in err
    )
    assert row["cache_gbs"] is None and row["cache_ratio"] is None
