"""How a step is cut into units never changes its bits.

Pass-1 units can be smaller than the block a format prepares the intermediate in (prep_rows): the
unit that completes a block prepares it. These tests run every format with unit sizes from one row
up (FT_CPU_MOE_UNIT_ROWS) on several threads and require the same bits as the formats' own unit
sizes on one thread. The formats' own tests check those bits against float64 references.
"""

from __future__ import annotations

import numpy as np
import pytest

import ft_kernels_cpu as fk
from ft_kernels_cpu import bench, bench_formats
from ft_kernels_cpu.shapes import MoeShape
from helpers.cpu import cpu_is_intel, cpu_is_zen5_or_later
from helpers.moe_reference import BF16

E, TOP_K, T = 6, 4, 5


def shape_for(fmt: str) -> MoeShape:
    # 640 = 2 x 256 + 128: the last prep block of the 256-row formats is short. The K-quants of the
    # gguf banks need multiples of 256.
    inter = 768 if fmt == "gguf" else 640
    return MoeShape(512, inter, E, TOP_K, 1, "swigluoai" if fmt == "mxfp4" else "silu")


def run_format(
    fmt: str,
    threads: int,
    prefetch: int | None = None,
    profile: dict | None = None,
    tokens: int = T,
    shape: MoeShape | None = None,
) -> np.ndarray:
    shape = shape or shape_for(fmt)
    mod = bench_formats.load(fmt)
    rng = np.random.default_rng(7)
    banks = mod.banks(shape, E, rng)
    ex = fk.MoeExecutor(shape.hidden, TOP_K, max_tokens=T, num_threads=threads, prefetch_bytes=prefetch)
    bench.add_bench_layer(ex, fmt, shape, E, banks)  # layer 0, as the bench makes it
    bits = bench_formats.random_bf16_bits(rng, (T, shape.hidden))
    x = bits.view(BF16)
    # Duplicate experts across tokens, a -1 route, a token with no route at all.
    ids = np.array(
        [[0, 1, 2, 3], [1, 0, -1, 5], [4, 4, 2, 1], [-1, -1, -1, -1], [5, 3, 0, 2]], dtype=np.int32
    )
    w = rng.random((T, TOP_K), dtype=np.float32)
    ex.reset_pool_profile()
    # tokens=1: the first token alone, whose calls each take one vector (decode).
    y = ex.run(0, x[:tokens], ids[:tokens], w[:tokens]).view(np.uint16)
    if profile is not None:
        profile.update(ex.pool_profile())
    return y


@pytest.mark.parametrize("fmt", fk.weight_formats())
def test_unit_rows_never_change_results(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FT_CPU_MOE_UNIT_ROWS", raising=False)
    want = run_format(fmt, threads=1)
    assert np.any(want != 0)
    for rows in ("0,0", "1,1", "8,48", "16,256", "0,7"):
        monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", rows)
        got = run_format(fmt, threads=3)
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt} with FT_CPU_MOE_UNIT_ROWS={rows}")


@pytest.mark.parametrize("fmt", fk.weight_formats())
def test_stream_chain_never_changes_results(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The chain (on unless FT_CPU_MOE_CHAIN=0): each worker claims its next unit when it starts one
    # and its weight streams prefetch on into the next unit's. Only the order of claims and the
    # prefetches change, so the bits are those of one thread without it (which the formats' tests
    # check against float64 references); small units on 3 threads make most claims early ones. An
    # explicit distance, since the chain needs a software prefetch (bf16 on AMD has none by default).
    monkeypatch.delenv("FT_CPU_MOE_UNIT_ROWS", raising=False)
    monkeypatch.setenv("FT_CPU_MOE_CHAIN", "0")
    want = run_format(fmt, threads=1)
    assert np.any(want != 0)
    monkeypatch.delenv("FT_CPU_MOE_CHAIN")  # the default
    for claims in ("shared", "ranges"):  # the pool's claim policies (worker_pool.h)
        monkeypatch.setenv("FT_CPU_MOE_CLAIMS", claims)
        for rows in ("0,0", "8,16"):
            monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", rows)
            for prefetch in (None, 4096):
                prof: dict = {}
                got = run_format(fmt, threads=3, prefetch=prefetch, profile=prof)
                msg = f"{fmt}, chained, claims {claims}, units {rows}, prefetch {prefetch}"
                np.testing.assert_array_equal(got, want, err_msg=msg)
                if prefetch:
                    # The format's unit_streams match its kernels' streams: units link their streams
                    # on. With one counter nearly every unit claims its successor ahead (all but each
                    # worker's last, and those claimed as workers come free); with ranges only within
                    # a worker's own range, and a range that another worker empties (3 threads on
                    # this machine's cores) takes fewer.
                    units = prof["units1"] + prof["units2"]
                    least = units // 2 if claims == "shared" else 1
                    assert prof["chain_links"] >= least, (msg, prof["chain_links"], units)


@pytest.mark.parametrize(("value", "chained"), [(None, True), ("1", True), ("0", False)])
def test_chain_is_on_unless_the_variable_is_0(
    value: str | None, chained: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv("FT_CPU_MOE_CHAIN", raising=False)
    else:
        monkeypatch.setenv("FT_CPU_MOE_CHAIN", value)
    prof: dict = {}
    run_format("q4_0", threads=3, prefetch=4096, profile=prof)
    assert prof["units1"] > 0
    assert (prof["chain_links"] > 0) == chained, prof["chain_links"]


@pytest.mark.parametrize("value", ["2", "on", "yes", "-1"])
def test_chain_variable_is_checked(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_CPU_MOE_CHAIN", value)
    with pytest.raises(ValueError, match=r"FT_CPU_MOE_CHAIN='.*' must be 0 or 1"):
        fk.MoeExecutor(64, 2, max_tokens=1)


BAD_VALUES = (
    [
        ("FT_CPU_MOE_UNIT_ROWS", v, r"must be two integers 'P1,P2' in \[0, 256\]")
        for v in ["abc", "16", "16,", "1,2,3", "-1,4", "4,257", "300,0"]
    ]
    + [
        ("FT_CPU_MOE_MULTIROW_BYTES", v, r"must be 'ONE' or 'ONE,SEVERAL', integer numbers of bytes")
        for v in ["abc", "-1", "1048577", "1k", "12.5", "1,", ",1", "1,2,3", "1,-2", "1,1048577"]
    ]
    + [
        ("FT_CPU_MOE_GATE_UP_SLICE", v, r"must be an integer number of bytes in \[0, 1048576\] \(gate and up")
        for v in ["abc", "-1", "1048577", "2k", "12.5"]
    ]
)


@pytest.mark.parametrize(("name", "value", "msg"), BAD_VALUES)
def test_unit_rows_and_multirow_variables_are_checked(
    name: str, value: str, msg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='.*' {msg}"):
        fk.MoeExecutor(64, 2, max_tokens=1)


def test_pass1_unit_must_divide_the_prep_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # mxfp4 prepares h in steps of 128 rows in every tier: 3-row units do not divide them.
    monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", "3,0")
    msg = r"3 rows per pass-1 unit \(FT_CPU_MOE_UNIT_ROWS\) must divide the format's prep block of 128 rows"
    with pytest.raises(ValueError, match=msg):
        run_format("mxfp4", threads=1)


@pytest.mark.parametrize("chain", ["0", "1"])
def test_pool_profile_counts_runs_and_units(chain: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", "8,16")
    monkeypatch.setenv("FT_CPU_MOE_CHAIN", chain)  # claims ahead: every unit still runs once
    rng = np.random.default_rng(0)
    H, I = 64, 32
    ex = fk.MoeExecutor(H, 2, max_tokens=2, num_threads=2, prefetch_bytes=1024)
    ex.add_layer(
        0,
        "bf16",
        num_experts=4,
        intermediate=I,
        banks={
            "w13": rng.standard_normal((4, 2 * I, H)).astype(BF16),
            "w2": rng.standard_normal((4, H, I)).astype(BF16),
        },
    )
    x = rng.standard_normal((2, H)).astype(BF16)
    ids = np.array([[0, 1], [1, 3]], dtype=np.int32)  # 3 distinct experts
    w = np.ones((2, 2), np.float32)
    ex.run(0, x, ids, w)
    ex.reset_pool_profile()
    for _ in range(3):
        ex.run(0, x, ids, w)
    p = ex.pool_profile()
    assert p["runs"] == 3
    assert p["units1"] == 3 * 3 * (I // 8)  # per run: 3 experts x 4 blocks of 8 rows
    assert p["units2"] == 3 * 3 * (H // 16)  # per run: 3 experts x 4 blocks of 16 rows
    assert p["pass1_s"] >= 0 and p["pass2_s"] >= 0 and p["barrier_s"] >= 0
    assert p["join_s"] >= 0 and p["tail_s"] >= 0
    inside = p["pass1_s"] + p["pass2_s"] + p["barrier_s"]
    assert inside + p["join_s"] + p["tail_s"] <= p["wall_s"] * 1.01
    # The calling thread takes the first unit at once; the runs' tails are real time (some worker
    # always finishes before the last unit ends, unless both end together).
    assert p["join_s"] < p["wall_s"]
    ex.reset_pool_profile()
    assert ex.pool_profile()["runs"] == 0 and ex.pool_profile()["units1"] == 0
    assert ex.pool_profile()["join_s"] == 0 and ex.pool_profile()["tail_s"] == 0


@pytest.mark.parametrize(
    ("fmt", "threads", "experts", "units2"),
    [
        ("mxfp4", 4, 8, 88),
        ("mxfp4", 15, 8, 176),
        ("mxfp4", 16, 8, 176),
        ("mxfp4", 16, 1, 32),
        ("mxfp4", 16, 3, 96),
        ("q4_0", 4, 8, 88),
        ("q4_0", 16, 8, 176),
        ("q4_0", 16, 1, 128),
    ],
)
def test_pass2_units_follow_the_groups_and_threads(
    fmt: str, threads: int, experts: int, units2: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass-2 unit is one expert's block of output rows: 256 rows, halved while the run's experts
    # give fewer than 8 units per thread, never below the format's own rows (mxfp4 64, q4_0 16); the
    # last expert's blocks come in quarters, else halves, where those keep to the format's rows, or
    # to 32 rows where the blocks are larger than the format's rows. 2048 rows and 8 experts: 64
    # units of 256 rows fill 4 threads 16 times, the last expert's 8 in 32 quarters (88); 15 and 16
    # threads get 128 units of 128 rows, the last expert's 16 in 64 quarters of 32 rows (176). One
    # expert stops at mxfp4's 64 rows (32 units, no halves: the blocks are the format's rows), and so
    # do 3 experts (96 units; 128 would need 32 rows); q4_0's one expert goes down to 16 rows (128
    # units, no parts).
    monkeypatch.delenv("FT_CPU_MOE_UNIT_ROWS", raising=False)
    act = "swigluoai" if fmt == "mxfp4" else "silu"
    shape = MoeShape(2048, 64, experts, experts, 1, act)
    mod = bench_formats.load(fmt)
    ex = fk.MoeExecutor(shape.hidden, experts, max_tokens=1, num_threads=threads)
    ex.add_layer(
        0,
        fmt,
        num_experts=experts,
        intermediate=64,
        banks=mod.banks(shape, experts, np.random.default_rng(0)),
        activation=act,
        options=getattr(mod, "OPTIONS", None),
    )
    x = bench_formats.random_bf16_bits(np.random.default_rng(1), (1, 2048)).view(BF16)
    ex.reset_pool_profile()
    ids = np.arange(experts, dtype=np.int32).reshape(1, experts)
    ex.run(0, x, ids, np.full((1, experts), 1.0 / experts, np.float32))
    assert ex.pool_profile()["units2"] == units2


@pytest.mark.parametrize(
    ("threads", "experts", "units1"),
    [(1, 8, 48), (2, 8, 48), (4, 8, 48), (8, 8, 96), (16, 8, 96), (1, 1, 12), (2, 1, 12), (16, 1, 12)],
)
def test_pass1_units_follow_the_groups_and_threads(
    threads: int, experts: int, units1: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass-1 unit is one expert's block of intermediate rows: the format's rows (mxfp4: 64 in every
    # tier), doubled while the doubled rows divide its prep block (mxfp4: 128) and the run's experts
    # still give 8 units per thread. Intermediate 768: 8 experts take 128 rows (48 units) up to 4
    # threads and keep 64 (96 units) from 8 threads on; one expert keeps 64 (12 units) on any pool
    # (128 rows would give 6 units, fewer than 8 for even one thread).
    shape = MoeShape(256, 768, experts, experts, 1, "swigluoai")
    banks = bench_formats.load("mxfp4").banks(shape, experts, np.random.default_rng(0))
    x = bench_formats.random_bf16_bits(np.random.default_rng(1), (1, 256)).view(BF16)
    ids = np.arange(experts, dtype=np.int32).reshape(1, experts)
    w = np.full((1, experts), 1.0 / experts, np.float32)

    def units1_of_a_run() -> int:
        ex = fk.MoeExecutor(shape.hidden, experts, max_tokens=1, num_threads=threads)
        ex.add_layer(0, "mxfp4", num_experts=experts, intermediate=768, banks=banks, activation="swigluoai")
        ex.reset_pool_profile()
        ex.run(0, x, ids, w)
        return ex.pool_profile()["units1"]

    monkeypatch.delenv("FT_CPU_MOE_UNIT_ROWS", raising=False)
    assert units1_of_a_run() == units1
    # FT_CPU_MOE_UNIT_ROWS fixes them: 64 rows, 12 blocks an expert, whatever the pool.
    monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", "64,0")
    assert units1_of_a_run() == 12 * experts


def test_bench_takes_a_list_of_formats_and_names_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:

    with pytest.raises(SystemExit):
        bench.main(["--format", "q4_0,int3", "--threads", "1"])
    err = capsys.readouterr().err
    assert "--format 'int3' is unknown; expected 'all' or a comma-separated list of bf16" in err


def test_bench_json_names_the_kernels(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One JSON line per format, with the same keys; `kernels` says which of a format's kernels ran
    # (ds_fp4's W4A8 q8 by default from avx2 up; q4_0's gather in avx512_bf16), null for a format
    # without a choice.
    import json

    monkeypatch.delenv("FT_CPU_MOE_DSFP4_KERNELS", raising=False)
    args = ["--threads", "1", "--top-k", "1", "--pool-mib", "8", "--samples", "1", "--min-time", "0.01"]
    args.append("--json")
    bench.main(["--format", "ds_fp4,q4_0", *args])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["format"] for r in lines] == ["ds_fp4", "q4_0"]
    assert lines[0].keys() == lines[1].keys()
    assert lines[0]["kernels"] == ("fp32" if fk.isa() == "scalar" else "q8")
    assert lines[1]["kernels"] in (("dwords", "words") if fk.isa() == "avx512_bf16" else (None,))


@pytest.mark.parametrize("fmt", ["q4_0", "gguf", "nvfp4", "fp8_block", "ds_fp4"])
def test_rows_side_by_side_never_change_results(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Int8 kernels read 4 rows (one vector) or 2 (several: T = 5 with duplicate experts) side by side,
    # the VDPBF16PS kernels of fp8_block and ds_fp4 (AMD's choice) 2 rows from 3 vectors on, from
    # FT_CPU_MOE_MULTIROW_BYTES bytes a row on (ONE for one vector, SEVERAL for several; this shape's
    # rows are shorter than any default above 0, and on AMD one-vector gate/up rows of Q4_0 and the
    # K-quants then go side by side as gate row and up row): 0 (always), 1048576 (never) and the two
    # mixed must give the default's bits. ds_fp4 by its VDPBF16PS kernels (its default, q8, reads one
    # row at a time).
    monkeypatch.delenv("FT_CPU_MOE_MULTIROW_BYTES", raising=False)
    if fmt == "ds_fp4" and "avx512_bf16" in fk.isa_tiers():
        monkeypatch.setenv("FT_CPU_MOE_DSFP4_KERNELS", "bf16")
    want = run_format(fmt, threads=1)
    for value in ("0", "1048576", "0,1048576", "1048576,0"):
        monkeypatch.setenv("FT_CPU_MOE_MULTIROW_BYTES", value)
        np.testing.assert_array_equal(
            run_format(fmt, threads=2), want, err_msg=f"{fmt}, multirow bytes {value}"
        )


def test_multirow_default_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # One vector: 0 on Intel, 2048 on AMD; several: 0 on Intel, 2048 on AMD's Zen 5 and later, 1024 on
    # older AMD; unless the variable is set ("ONE" for both, or "ONE,SEVERAL").
    monkeypatch.delenv("FT_CPU_MOE_MULTIROW_BYTES", raising=False)
    ex = fk.MoeExecutor(64, 2, max_tokens=1)
    several = 0 if cpu_is_intel() else 2048 if cpu_is_zen5_or_later() else 1024
    assert (ex.multirow_min_bytes, ex.multirow_several_min_bytes) == (0 if cpu_is_intel() else 2048, several)
    for value, want in (("0", (0, 0)), ("300", (300, 300)), ("4096,512", (4096, 512))):
        monkeypatch.setenv("FT_CPU_MOE_MULTIROW_BYTES", value)
        ex = fk.MoeExecutor(64, 2, max_tokens=1)
        assert (ex.multirow_min_bytes, ex.multirow_several_min_bytes) == want, value


@pytest.mark.parametrize("fmt", fk.weight_formats())
def test_gate_up_turns_never_change_results(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # One-vector pass-1 calls read gate and up rows in turns of FT_CPU_MOE_GATE_UP_SLICE bytes (whole
    # rows; none where a row is longer). This shape's rows are 128-1024 bytes: 300 bytes make turns of
    # one row for most formats, 700 of two or more, 2048 the default's on Zen 5; every value must give
    # the bits of no turns on one thread (a slice written to the wrong rows, or up rows into gate's,
    # would differ). The turns apply to mxfp4 too, whose gate and up rows are one stream anyway.
    # One token (every call one vector) and five (calls of one to three vectors).
    for tokens in (1, T):
        monkeypatch.delenv("FT_CPU_MOE_UNIT_ROWS", raising=False)
        monkeypatch.setenv("FT_CPU_MOE_GATE_UP_SLICE", "0")
        want = run_format(fmt, threads=1, tokens=tokens)
        assert np.any(want != 0)
        for value in ("1", "300", "700", "2048", "1048576"):
            monkeypatch.setenv("FT_CPU_MOE_GATE_UP_SLICE", value)
            for rows in ("0,0", "8,16"):
                monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", rows)
                got = run_format(fmt, threads=2, tokens=tokens)
                msg = f"{fmt}, {tokens} tokens, turns of {value} bytes, units {rows}"
                np.testing.assert_array_equal(got, want, err_msg=msg)


@pytest.mark.parametrize("gate_up_type", ["Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_gguf_gate_up_turns_never_change_results(gate_up_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Q4_0 and the K-quants read one vector's gate and up rows side by side in one call wherever turns
    # are on (any FT_CPU_MOE_GATE_UP_SLICE > 0), other types (Q8_0) in turns of whole rows: the bits of
    # no turns either way. Hidden 608 leaves Q4_0 rows a short last group (19 blocks: 2 groups of 8 and
    # 3); the K-quants take 512.
    gguf = bench_formats.load("gguf")
    monkeypatch.setitem(gguf.OPTIONS, "gate_up_type", getattr(gguf, gate_up_type))
    hidden = 512 if gate_up_type.endswith("_K") else 608
    shape = MoeShape(hidden, 768, E, TOP_K, 1, "silu")
    for tokens in (1, T):
        monkeypatch.setenv("FT_CPU_MOE_GATE_UP_SLICE", "0")
        want = run_format("gguf", threads=1, tokens=tokens, shape=shape)
        assert np.any(want != 0)
        for value in ("1", "2048", "1048576"):
            monkeypatch.setenv("FT_CPU_MOE_GATE_UP_SLICE", value)
            got = run_format("gguf", threads=2, tokens=tokens, shape=shape)
            msg = f"{gate_up_type}, {tokens} tokens, turns of {value}"
            np.testing.assert_array_equal(got, want, err_msg=msg)


def test_gate_up_slice_default_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2048 on AMD's Zen 5 and later (family 26 and above), 0 elsewhere, unless the variable is set.
    monkeypatch.delenv("FT_CPU_MOE_GATE_UP_SLICE", raising=False)
    assert fk.MoeExecutor(64, 2, max_tokens=1).gate_up_slice_bytes == (2048 if cpu_is_zen5_or_later() else 0)
    for value in ("0", "4096"):
        monkeypatch.setenv("FT_CPU_MOE_GATE_UP_SLICE", value)
        assert fk.MoeExecutor(64, 2, max_tokens=1).gate_up_slice_bytes == int(value)
