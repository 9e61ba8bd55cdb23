"""mxfp4 (gpt-oss layout) against a float64 reference built from ml_dtypes, on every tier and activation."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_add_layer_refused,
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
)
from helpers.fp4_reference import dequant_fp4, random_fp4, random_scales
from helpers.int8_bounds import int8_emulated_reference, int8_error_bound, q8_emulate
from helpers.kernel_variants import tier_fixture
from helpers.moe_reference import (
    ACTIVATIONS,
    BF16,
    bias_terms,
    moe_reference,
    one_token_on_expert_0,
    random_inputs,
)

TIERS = fk.isa_tiers()
# (tier, FT_CPU_MOE_MXFP4_KERNELS, FT_CPU_MOE_AMX_MIN unused): each tier's kernels, and in avx512_bf16
# both record layouts by name (auto is steps).
VARIANTS = [(t, "auto", "") for t in TIERS if t != "avx512_bf16"]
if "avx512_bf16" in TIERS:
    VARIANTS += [("avx512_bf16", "steps", ""), ("avx512_bf16", "groups", "")]
isa = tier_fixture("FT_CPU_MOE_MXFP4_KERNELS", VARIANTS)


def make_layer(rng: np.random.Generator, E: int, H: int, I: int, bias: bool = True) -> dict[str, np.ndarray]:
    # Scales 2^-7 .. 2^-4: with |e2m1| up to 6 and x ~ 2 N(0, 1) the gate/up values are O(1).
    banks = {
        "w13": random_fp4(rng, (E, 2 * I, H // 32, 16)),
        "w13_scale": random_scales(rng, (E, 2 * I, H // 32), 120, 123),
        "w2": random_fp4(rng, (E, H, I // 32, 16)),
        "w2_scale": random_scales(rng, (E, H, I // 32), 120, 123),
    }
    if bias:
        banks["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(BF16)
        banks["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(BF16)
    return banks


def reference(banks, x, ids, w, act, **opts):
    w13 = dequant_fp4(banks["w13"], banks["w13_scale"])  # [E, 2I, H], rows interleaved gate/up
    w2 = dequant_fp4(banks["w2"], banks["w2_scale"])
    return moe_reference(
        x,
        ids,
        w,
        w13[:, 0::2],
        w13[:, 1::2],
        w2,
        act,
        **bias_terms(banks, slice(0, None, 2), slice(1, None, 2)),
        **opts,
    )


# Elements per int8 scale of x and h in the tiers that take int8 activations: steps of 128 in the
# avx512_bf16 tier (VNNI), blocks of 32 in the avx2 tier (VPMADDUBSW).
INT8_GROUPS = {"avx512_bf16": 128, "avx2": 32}


def int8_extra(isa, banks, x, ids, w, act, **opts):
    """The int8 activations of the avx512_bf16 and avx2 tiers (x and h in groups of INT8_GROUPS[isa]
    elements, one scale each): int8_error_bound; 0 for the other tiers."""
    if isa not in INT8_GROUPS:
        return 0.0
    w13 = dequant_fp4(banks["w13"], banks["w13_scale"])
    wref = {
        "w_gate": w13[:, 0::2],
        "w_up": w13[:, 1::2],
        "w_down": dequant_fp4(banks["w2"], banks["w2_scale"]),
    }
    wref.update(
        {k: v for k, v in bias_terms(banks, slice(0, None, 2), slice(1, None, 2)).items() if v is not None}
    )
    g = INT8_GROUPS[isa]
    return int8_error_bound(x, ids, w, wref, act, False, True, True, (g, g), **opts)


def check(
    y: np.ndarray, ref: np.ndarray, scale: np.ndarray, isa: str, extra: np.ndarray | float = 0.0
) -> None:
    # The dequantized weights are exact in fp32, so every product of the fp32 tiers is exact; what is
    # left: y rounded to bf16 (<= 2^-9 relative; 2^-8 leaves a factor 2) and fp32 accumulation
    # (K * 2^-24 * scale << 2^-11 * scale for K <= 300). The int8 x and h of the avx512_bf16 and avx2
    # tiers add `extra` (int8_extra); their integer sums are exact, their fp32 scaling adds << 2^-11.
    assert_close_to_reference(y, ref, scale, f"mxfp4 {isa}", rel=2.0**-8, mag=2.0**-11, extra=extra)


def run_layer(isa, banks, x, ids, w, E, I, act="silu", opts=None):
    T, H = x.shape
    ex = fk.MoeExecutor(hidden=H, top_k=ids.shape[1], max_tokens=T, num_threads=2, isa=isa)
    ex.add_layer(0, "mxfp4", num_experts=E, intermediate=I, banks=banks, activation=act, options=opts or {})
    return ex.run(0, x, ids, w)


# Rows of 1, 3, 5, 7, 9, 17 and 19 blocks of 32 hit every tail of the kernels (steps of 4 blocks,
# scales 16 blocks at a time); I = 160, 544 split into full and partial pass-1 units of 128 rows.
SHAPES = [(32, 96), (96, 32), (160, 160), (224, 64), (288, 96), (608, 160), (160, 544)]


# silu at every batch size, the other activations at batch 3 and swigluoai (gpt-oss's) at 8 too.
CASES = [("silu", 1), ("silu", 3), ("silu", 8), ("swigluoai", 8)] + [(a, 3) for a in ACTIVATIONS[1:]]


@pytest.mark.parametrize(("act", "T"), CASES)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    case = [TIERS.index(isa), ACTIVATIONS.index(act), T]
    rng = np.random.default_rng(case)
    H, I = SHAPES[sum(case) % len(SHAPES)]
    E, top_k = 5, 4
    banks = make_layer(rng, E, H, I, bias=T != 1)
    opts = {"limit": 3.0} if act == "swiglu_clamp" else {}
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = run_layer(isa, banks, x, ids, w, E, I, act, opts=opts)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale = reference(banks, x, ids, w, act, **opts)
    check(y, ref, scale, isa, int8_extra(isa, banks, x, ids, w, act, **opts))


def check_against_int8_emulation(tier: str, group: int, T: int, H: int, I: int, ids=None) -> None:
    """The layer on `tier` against the float64 reference with x and h rounded per `group` elements in
    numpy exactly as specified (helpers.int8_bounds.q8_emulate): only fp32 accumulation, the bf16
    output and h elements at a rounding boundary remain (int8_extra's bound is a worst case)."""
    rng = np.random.default_rng([T, H, I])
    E, top_k = 4, 4
    banks = make_layer(rng, E, H, I, bias=False)
    w13 = dequant_fp4(banks["w13"], banks["w13_scale"])
    w2 = dequant_fp4(banks["w2"], banks["w2_scale"])
    wref = {"w_gate": w13[:, 0::2], "w_up": w13[:, 1::2], "w_down": w2}
    x, routes, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    ids = routes if ids is None else ids
    y = run_layer(tier, banks, x, ids, w, E, I, "silu")
    ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", group, group)
    check(y, ref, scale, f"{tier} int8 emulation", 1.01 * flip)


@pytest.mark.skipif("avx2" not in TIERS, reason="no AVX2 here")
@pytest.mark.parametrize(
    ("T", "H", "I"), [(1, 160, 96), (3, 96, 160), (4, 1504, 96), (8, 288, 64), (8, 1504, 64)]
)
def test_avx2_int8_path_matches_an_int8_emulation(T: int, H: int, I: int) -> None:
    # Blocks of 32: a wrong code order within a block (even / odd elements) or a wrong block scale
    # fails it. T = 4 or 8 on all 4 experts with H = 1504 (47 blocks): calls of 4 and 8 vectors
    # (avx2_pairs.h's rows_by4) over rows of 11 groups of 4 blocks and a 3-block tail.
    check_against_int8_emulation("avx2", 32, T, H, I)


@pytest.mark.skipif("avx512_bf16" not in TIERS, reason="no avx512_bf16 tier here")
@pytest.mark.parametrize("kernels", ["steps", "groups"])
@pytest.mark.parametrize(("T", "H", "I"), [(1, 160, 96), (3, 608, 160), (8, 288, 544), (1, 2080, 800)])
def test_avx512_bf16_int8_records_match_an_int8_emulation(
    monkeypatch: pytest.MonkeyPatch, kernels: str, T: int, H: int, I: int
) -> None:
    # Both record layouts, steps of 128. H = 608 and I = 544 end in a partial group of 16 blocks, T = 8
    # on 4 experts makes calls of up to 8 vectors. T = 1 routes twice to expert 2: one token prepares
    # no group records under `steps`, and the two-vector pass-2 call must then take the step records.
    # H = 2080 and I = 800 give one-vector calls of the group kernel (4 whole groups and a block; one
    # group and 9 blocks), H = 160 and I = 96 of the register kernel.
    monkeypatch.setenv("FT_CPU_MOE_MXFP4_KERNELS", kernels)
    ids = np.array([[2, 2, 0, -1]], np.int32) if T == 1 else None
    check_against_int8_emulation("avx512_bf16", 128, T, H, I, ids)


def test_layer_reports_the_kernels_it_runs(isa: str) -> None:
    # The variable names the avx512_bf16 tier's kernels (auto: steps); avx2 runs q8a, the rest fp32.
    ex = fk.MoeExecutor(hidden=64, top_k=2, max_tokens=1, isa=isa)
    banks = make_layer(np.random.default_rng(0), 2, 64, 32)
    ex.add_layer(0, "mxfp4", num_experts=2, intermediate=32, banks=banks)
    choice = os.environ["FT_CPU_MOE_MXFP4_KERNELS"]
    want = {"avx512_bf16": "groups" if choice == "groups" else "steps", "avx2": "q8a"}.get(isa, "fp32")
    assert ex.layer_kernels(0) == want


def test_swigluoai_options_and_gate_up_interleave(isa: str) -> None:
    rng = np.random.default_rng(17)
    E, H, I, top_k, T = 3, 64, 64, 2, 3
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=3.0)
    opts = {"alpha": 1.5, "limit": 2.0}
    y = run_layer(isa, banks, x, ids, w, E, I, "swigluoai", opts=opts)
    ref, scale = reference(banks, x, ids, w, "swigluoai", **opts)
    check(y, ref, scale, isa, int8_extra(isa, banks, x, ids, w, "swigluoai", **opts))
    # Reading the rows as [gate; up] halves instead of interleaved must give a different answer.
    w13 = dequant_fp4(banks["w13"], banks["w13_scale"])
    wrong, _ = moe_reference(x, ids, w, w13[:, :I], w13[:, I:], dequant_fp4(banks["w2"], banks["w2_scale"]))
    assert np.abs(wrong - ref).max() > 10 * np.abs(y.astype(np.float64) - ref).max()


def test_extreme_e8m0_scales_and_every_e2m1_code(isa: str) -> None:
    # gate_i = 6 * 2^15 (code 7, scale 2^15), up_i = 2^15 (code 2), so h = silu(6 * 2^15) * 2^15 on
    # every row; down row j holds codes 2j % 16 and (2j + 1) % 16 in the first byte of each of its 4
    # blocks, scaled by 2^(s - 127) from the denormal-fp32 end (s = 0, 1) up: h ~ 2^33 keeps y for s
    # = 0 (~2^-90) above the checks' 1e-30 absolute slack. 4 blocks: the avx2 tier converts scales 4
    # at a time.
    H, I, E = 32, 128, 1
    x, ids, w = one_token_on_expert_0(H)

    def banks_with(s: int, nan_block: int | None = None) -> dict[str, np.ndarray]:
        banks = {
            "w13": np.zeros((E, 2 * I, 1, 16), np.uint8),
            "w13_scale": np.full((E, 2 * I, 1), 142, np.uint8),
            "w2": np.zeros((E, H, I // 32, 16), np.uint8),
            "w2_scale": np.full((E, H, I // 32), s, np.uint8),
        }
        banks["w13"][0, 0::2, 0, 0] = 0x07
        banks["w13"][0, 1::2, 0, 0] = 0x02
        j = np.arange(H)
        banks["w2"][0, :, :, 0] = (((2 * j) % 16) | (((2 * j + 1) % 16) << 4))[:, None]
        if nan_block is not None:
            banks["w2_scale"][0, :, nan_block] = 255  # e8m0 255 is NaN
        return banks

    for s in (0, 1, 60, 127, 150, 200):
        banks = banks_with(s)
        y = run_layer(isa, banks, x, ids, w, E, I)
        ref, scale = reference(banks, x, ids, w, "silu")
        check(y, ref, scale, isa, int8_extra(isa, banks, x, ids, w, "silu"))
    for b in range(I // 32):
        banks = banks_with(127, nan_block=b)
        ref, _ = reference(banks, x, ids, w, "silu")
        assert np.isnan(ref).all()
        y = run_layer(isa, banks, x, ids, w, E, I)
        assert np.isnan(y.astype(np.float32)).all(), f"{isa}: scale 255 in block {b} must give NaN"


@pytest.mark.parametrize("I", [96, 1024])
@pytest.mark.parametrize("routes", [1, 3])
@pytest.mark.parametrize("row", [0, 111, 223])
def test_one_nan_scale_anywhere_in_a_call(isa: str, row: int, routes: int, I: int) -> None:
    # The int8 kernels convert e8m0 scales by one shift unless a scan of the scale bytes finds a 0 or
    # a 255 (fp4::e8m0_all_normal, over each few rows the scale prefetch holds, so one call mixes
    # both conversions; in calls of one vector and, with 3 routes of the token to the expert, of
    # several: fp4::q8_dot_rows_multi's calls of several vectors of one token). One 255
    # in the last block of a single down row, at the start, middle or end of the bank (the end: the
    # last call's last scale byte, in the scan's partial last 64 bytes), must still give NaN in that
    # output alone: had the scan missed it, the shift would make the scale +inf, and y[row] +inf,
    # since that block's weights (codes 2: 1.0) and its h (x of ones against gate and up rows of 1.0:
    # h = silu(g) u > 0) are all positive. (A NaN in a gate/up row would not reach y in the int8
    # tiers: their quantizer codes a NaN of h as 127, int8_codes.h.) I = 96: 3 blocks a down row,
    # spans of odd lengths; I = 1024: 32 scale bytes a down row, so with the default prefetch the
    # check's chunks hold 8 rows and a call several chunks.
    rng = np.random.default_rng(7)
    H, E = 224, 1
    banks = make_layer(rng, E, H, I, bias=False)
    banks["w13"][0, 2 * (I - 32) :] = 0x22  # gate and up rows of h[I - 32 : I], the last block
    banks["w2"][0, row, -1] = 0x22
    clean = {k: v.copy() for k, v in banks.items()}
    banks["w2_scale"][0, row, -1] = 255
    x, ids, w = one_token_on_expert_0(H)  # x: ones
    ids, w = np.repeat(ids, routes, axis=1), np.repeat(w, routes, axis=1)
    y16 = run_layer(isa, banks, x, ids, w, E, I)
    y = y16.astype(np.float32)
    # The other rows, whichever conversion their scales took, give the bits of the call without the 255.
    others = np.arange(H) != row
    clean16 = run_layer(isa, clean, x, ids, w, E, I)
    np.testing.assert_array_equal(y16.view(np.uint16)[:, others], clean16.view(np.uint16)[:, others])
    ref, scale = reference(banks, x, ids, w, "silu")
    nan = np.isnan(ref)
    got = np.argwhere(np.isnan(y))
    assert nan.any() and np.array_equal(np.isnan(y), nan), f"{isa} row {row}: NaN at {got}"
    assert np.array_equal(np.flatnonzero(nan.any(axis=0)), [row])
    extra = np.broadcast_to(int8_extra(isa, banks, x, ids, w, "silu"), ref.shape)
    check(y[~nan][None], ref[~nan][None], scale[~nan][None], isa, extra[~nan][None])


@pytest.mark.parametrize("H", [608, 1504])
def test_many_tokens_on_few_experts(isa: str, H: int) -> None:
    # H = 1504 (47 blocks): calls of 8 vectors over rows of 11 groups of 4 blocks and a 3-block tail,
    # whose records (8 x 3 KiB in the avx2 tier) outgrow half of an L1.
    # 8 tokens x 6 routes on 2 experts: chunks of up to 8 routes per expert through the batched
    # kernels. H = 608 (19 blocks: a group of 16 and a 3-block step) and I = 160 (5 blocks; pass-1
    # units of 128 and 32 rows) hit their tails.
    rng = np.random.default_rng(13)
    E, H, I = 2, H, 160
    banks = make_layer(rng, E, H, I)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "mxfp4", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, "gelu")
    check(y, ref, scale, isa, int8_extra(isa, banks, x, ids, w, "gelu"))


def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    E, H, I, top_k, T = 8, 608, 544, 4, 8
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(isa, "mxfp4", banks, x, ids, w, num_experts=E, intermediate=I)


@pytest.mark.skipif("avx512_bf16" not in TIERS, reason="no avx512_bf16 tier here")
def test_rows_side_by_side_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # One vector's int8 rows 4 at a time (fp4_kernels.cpp's dot_rows_q8_x4, where
    # FT_CPU_MOE_MULTIROW_BYTES says) or one at a time (the default): the same bits, rows of a partial
    # group (K = 608, 544, 160) and of whole groups (K = 1024), with a remainder of rows (I = 544 rows
    # of down in units of 64; 8 experts of 4 routes give calls of one vector). The partial groups'
    # steps (dot_rows_q8's q8_last_steps, unrolled; dot_rows_q8_x4's loop): none whole and one partial
    # (K = 608: 3 blocks; 544: 1), one whole and one partial (704: 6 blocks; 160: 5), two whole (768:
    # 8), three whole and one partial (992: 15).
    monkeypatch.setenv("FT_CPU_MOE_MXFP4_KERNELS", "steps")
    for H, I in ((608, 544), (1024, 96), (704, 768), (992, 160)):
        rng = np.random.default_rng([H, I])
        E, top_k, T = 8, 4, 1
        banks = make_layer(rng, E, H, I)
        x, ids, w = random_inputs(rng, T, H, top_k, E)
        ys = []
        for multirow in ("0", "1048576"):
            monkeypatch.setenv("FT_CPU_MOE_MULTIROW_BYTES", multirow)
            ys.append(run_layer("avx512_bf16", banks, x, ids, w, E, I).view(np.uint16).copy())
        np.testing.assert_array_equal(ys[0], ys[1])


def test_prefetch_never_changes_results() -> None:
    rng = np.random.default_rng(4)
    E, H, I, top_k, T = 4, 160, 96, 2, 3
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    outs = []
    for pf in (0, 64, 8192):
        ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, prefetch_bytes=pf)
        ex.add_layer(0, "mxfp4", num_experts=E, intermediate=I, banks=banks)
        outs.append(ex.run(0, x, ids, w).view(np.uint16).copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


H0, I0, E0 = 64, 32, 2


def _banks() -> dict[str, np.ndarray]:
    return make_layer(np.random.default_rng(0), E0, H0, I0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b, kw: b.update(w13=np.zeros((E0, 2 * I0, H0 // 32, 15), np.uint8)),
            r"layer 0 \(mxfp4\): bank 'w13' has 3840 bytes; expected 4096 bytes \(\[2, 64, 2, 16\] u8\)",
        ),
        (
            lambda b, kw: b.update(w2_scale=np.zeros((E0, H0, I0 // 32), np.float32)),
            r"bank 'w2_scale' has dtype float32; expected \[2, 64, 1\] u8",
        ),
        (
            lambda b, kw: b.update(w13_bias=np.zeros((E0, 2 * I0), np.float32)),
            r"bank 'w13_bias' has dtype float32; expected \[2, 64\] bf16",
        ),
        (lambda b, kw: b.pop("w13_scale"), r"missing bank 'w13_scale'; expected \[2, 64, 2\] u8"),
        (lambda b, kw: b.pop("w2"), r"missing bank 'w2'; expected \[2, 64, 1, 16\] u8"),
        (lambda b, kw: b.update(w2_scales=b["w2_scale"]), r"bank 'w2_scales' is not used by this format"),
        (lambda b, kw: kw.update(options={"act_block": 32.0}), r"option 'act_block' is not used"),
        (
            lambda b, kw: kw.update(router_weight_on_input=True),
            r"layer 0 \(mxfp4\): router_weight_on_input=True is not supported",
        ),
        (lambda b, kw: kw.update(intermediate=40), r"intermediate=40 must be multiples of 32"),
    ],
)
def test_add_layer_errors_name_the_bank_and_shape(change, match: str) -> None:
    assert_add_layer_refused(
        change,
        match,
        _banks(),
        hidden=H0,
        num_experts=E0,
        weight_format="mxfp4",
        options={},
        router_weight_on_input=False,
        intermediate=I0,
    )


def test_kernel_choice_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    banks = _banks()

    def add(tier: str, kernels: str) -> None:
        monkeypatch.setenv("FT_CPU_MOE_MXFP4_KERNELS", kernels)
        ex = fk.MoeExecutor(hidden=H0, top_k=1, max_tokens=1, isa=tier)
        ex.add_layer(0, "mxfp4", num_experts=E0, intermediate=I0, banks=banks)

    with pytest.raises(
        fk.KernelError, match=r"FT_CPU_MOE_MXFP4_KERNELS='fast' is unknown; expected auto, steps or groups"
    ):
        add("scalar", "fast")
    for kernels in ("steps", "groups"):
        message = (
            rf"FT_CPU_MOE_MXFP4_KERNELS='{kernels}' needs the avx512_bf16 tier; this layer runs tier 'scalar'"
        )
        with pytest.raises(fk.KernelError, match=message):
            add("scalar", kernels)
    add("scalar", "auto")


def test_hidden_must_be_a_multiple_of_32() -> None:
    ex = fk.MoeExecutor(hidden=48, top_k=1, max_tokens=1)
    with pytest.raises(ValueError, match=r"hidden=48 and intermediate=32 must be multiples of 32"):
        banks = make_layer(np.random.default_rng(0), 1, 64, 32)
        ex.add_layer(0, "mxfp4", num_experts=1, intermediate=32, banks=banks)


@pytest.mark.skipif("avx2" not in TIERS, reason="the vector code of the int8 prep needs AVX2")
@pytest.mark.parametrize("n", [1, 7, 8, 37, 127, 128])
def test_int8_codes_of_the_prep_match_numpy(n: int) -> None:
    # The int8 tier's x / h codes (q8_prep_vec): amax = max |v|, code = v * 127 / amax rounded half
    # to even (numpy's rint), clamped to +-127. Both the scalar and the AVX2 code, against numpy, with
    # exact ties (amax = 127: v * inv = v), NaN, inf and all-zero steps.
    from ft_kernels_cpu._native import native

    rng = np.random.default_rng(n)
    cases = [rng.standard_normal(n).astype(np.float32)]
    ties = (rng.integers(-126, 126, n) + 0.5).astype(np.float32)
    ties[0] = 127.0
    cases += [ties, np.zeros(n, np.float32)]
    if n > 2:
        with_nan = rng.standard_normal(n).astype(np.float32)
        with_nan[n // 2] = np.nan
        with_inf = rng.standard_normal(n).astype(np.float32)
        with_inf[1] = -np.inf
        cases += [with_nan, with_inf]
    for v in cases:
        finite = np.abs(v[~np.isnan(v)])
        amax = np.float32(finite.max()) if finite.size else np.float32(0)
        inv = np.float32(127.0) / amax if amax > 0 else np.float32(0)
        with np.errstate(invalid="ignore"):
            want = np.rint(v * inv)
        want = np.where(np.isnan(want), 127, np.clip(want, -127, 127)).astype(np.int8)
        for simd in (False, True):
            got_amax, got = native._q8_codes(v.tobytes(), simd)
            assert got_amax == amax, (simd, v)
            np.testing.assert_array_equal(np.frombuffer(got, np.int8), want, err_msg=f"simd={simd}")


@pytest.mark.skipif("avx512_bf16" not in TIERS, reason="no avx512_bf16 tier here")
@pytest.mark.parametrize("K", [512, 768, 2880, 160, 32, 96, 544, 704, 736, 800, 1024, 1056, 2048, 4608])
@pytest.mark.parametrize("special", [False, True])
def test_avx512_bf16_step_rows_match_float64_whatever_the_call(K: int, special: bool) -> None:
    # The one-vector step kernels on their own: each row's fp32 result must not depend on the rows
    # called with it (the executor's bits must not depend on thread count or unit sizes) nor on the
    # kernel that reads it (fp4::Q8Rows: rows of K <= 768 with x in registers; rows of whole groups
    # unrolled with their first 8 steps' x codes in registers and a tail of blocks after them, up to
    # K = 4607; rows from x's records in memory; 4 rows side by side), and must match float64 on the
    # dequantized weights and x rounded as the kernels' int8 codes per 128. K = 768 / 2880 / 160 / 704 /
    # 800 / 1056 end in a partial group of 16 blocks (160: no whole group), whose lanes past the row's
    # end take scale +0 (fp4_avx512.h's e8m0x16); 32 / 96 / 544 / 736 also in a partial step. 800 is
    # the shortest row of the group kernel (one group and a tail), 1024 its shortest with no tail, 4608
    # the shortest past it (from records).
    # `special`: one scale byte of the call is 0 (the denormal 2^-127), so the kernels take the
    # general scale conversion instead of the shift (fp4::e8m0_all_normal).
    from ft_kernels_cpu._native import native

    rng = np.random.default_rng(K)
    rows = 11
    blocks = random_fp4(rng, (rows, K // 32, 16))
    scales = random_scales(rng, (rows, K // 32), 118, 125)
    if special:
        scales[rows // 2, -1] = 0
    x = (2 * rng.standard_normal(K)).astype(np.float32)
    args = (blocks.tobytes(), scales.tobytes(), x.tobytes(), K)
    alone = np.frombuffer(native._mxfp4_q8_rows(*args, 1), np.float32)
    grouped = np.frombuffer(native._mxfp4_q8_rows(*args, rows), np.float32)
    np.testing.assert_array_equal(grouped, alone)
    for kernel in ("from_records", "four_at_a_time"):
        other = np.frombuffer(native._mxfp4_q8_rows(*args, rows, kernel), np.float32)
        np.testing.assert_array_equal(other, grouped, err_msg=kernel)
    with pytest.raises(fk.KernelError, match="kernel must be fastest, from_records or four_at_a_time"):
        native._mxfp4_q8_rows(*args, rows, "registers")
    w = dequant_fp4(blocks, scales).astype(np.float64)  # [rows, K]
    xe = q8_emulate(x, 128)
    ref = w @ xe
    bound = 2.0**-20 * (np.abs(w) @ np.abs(xe)) + 1e-30
    assert np.all(np.abs(grouped - ref) <= bound), np.max(np.abs(grouped - ref) / bound)
