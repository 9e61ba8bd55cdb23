"""ds_fp4 (FP4 weights, fp8 e4m3 activation round trips) against an ml_dtypes float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_add_layer_refused,
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
)
from helpers.fp4_reference import dequant_fp4, fp8_round_trip, random_fp4, random_scales
from helpers.int8_bounds import q8_emulate
from helpers.kernel_variants import assert_kernel_choice_errors, current_variant, tier_fixture
from helpers.moe_reference import ACTIVATIONS, BF16, activation, random_inputs, random_routes

TIERS = fk.isa_tiers()
# (tier, FT_CPU_MOE_DSFP4_KERNELS, FT_CPU_MOE_AMX_MIN): each tier's default kernels (q8 from avx2 up,
# fp32 in scalar), avx2's exact int16 and fp32 kernels, avx512's fp32 and int16 ones, and in
# avx512_bf16 each of its kernels by name, the bf16 kernels once more with two rows at a time at every
# row length and once with one row at a time (FT_CPU_MOE_MULTIROW_BYTES 0 / its largest value; which
# one they take by default depends on the CPU's vendor and the rows' length); where this CPU runs
# AMX-BF16 tiles the amx kernels as they are (tiles for calls of 4+ vectors, int8 kernels below) and
# with tiles for every call. The q8 kernels (int8 codes of the round-tripped values, W4A8) are
# checked against a reference that rounds them too (int8_group).
VARIANTS = [(t, "auto", "") for t in TIERS if t != "avx512_bf16"]
if "avx2" in TIERS:
    VARIANTS += [("avx2", "int16", ""), ("avx2", "fp32", "")]
if "avx512" in TIERS:
    VARIANTS += [("avx512", "fp32", ""), ("avx512", "int16", "")]  # avx2's int16 kernels beside fp32
if "avx512_bf16" in TIERS:
    VARIANTS += [("avx512_bf16", k, "") for k in ("fp32", "bf16", "int16", "int8", "q8")]
    VARIANTS += [("avx512_bf16", "bf16", "", rows) for rows in ("0", "1048576")]
    if fk.cpu_amx_bf16():
        VARIANTS += [("avx512_bf16", "amx", ""), ("avx512_bf16", "amx", "1")]
isa = tier_fixture("FT_CPU_MOE_DSFP4_KERNELS", VARIANTS)


def variant_index(isa: str) -> int:
    """A number per variant (seeds and shapes differ between variants)."""
    return VARIANTS.index(current_variant("FT_CPU_MOE_DSFP4_KERNELS", isa))


def int8_group(isa: str) -> int:
    """Elements per int8 scale when the variant under test runs the q8 kernels (x and h, once
    round-tripped, rounded again to int8 codes: helpers.int8_bounds.q8_emulate gives them exactly):
    steps of 128 in the avx512_bf16 tier (mxfp4's VNNI records), blocks of 32 below it (its
    VPMADDUBSW records); 0 for the exact kernels. `auto` is q8 from avx2 up (ds_fp4_kernels.h)."""
    kernels = current_variant("FT_CPU_MOE_DSFP4_KERNELS", isa)[1]
    if kernels == "auto":
        kernels = "fp32" if isa == "scalar" else "q8"
    if kernels != "q8":
        return 0
    return 128 if isa == "avx512_bf16" else 32


def q8_rows(v: np.ndarray, group: int) -> np.ndarray:
    """Each row of v (fp32) as the q8 kernels see it: int8 codes per `group` elements times the
    group's amax / 127, the product rounded once to fp32 (what a one-weight row of the kernels returns)."""
    v = np.asarray(v, np.float32)
    rows = [q8_emulate(row, group) for row in v.reshape(-1, v.shape[-1])]
    return np.stack(rows).reshape(v.shape).astype(np.float32)


def make_layer(rng: np.random.Generator, E: int, H: int, I: int) -> dict[str, np.ndarray]:
    return {
        "w13": random_fp4(rng, (E, 2 * I, H // 2)),
        "w13_scale": random_scales(rng, (E, 2 * I, H // 32), 120, 123),
        "w2": random_fp4(rng, (E, H, I // 2)),
        "w2_scale": random_scales(rng, (E, H, I // 32), 120, 123),
    }


def reference(banks, x, ids, w, act, act_block, group=0, **opts):
    """(y, scale, slack): the float64 layer with both fp8 round trips (ml_dtypes, fp32 as specified)
    and, for group > 0, both round-tripped vectors rounded again to int8 codes per `group` elements
    as the q8 kernels do (q8_rows).

    x is known exactly, so its round trip is exact here too. The intermediate h is not: the kernels
    compute it in fp32, this in float64, and the e4m3 rounding of h is discontinuous, so an element
    of h within a hair of a rounding midpoint (or a block whose amax / 448 is within a hair of a power
    of two) may legitimately round the other way. `slack` bounds what that can change: each h is
    round-tripped again after scaling by 1 -+ 1e-4 (far more than the fp32 error of h, ~1e-6
    relative) and every element whose result moves contributes |W_down| * its move. Only the few
    elements that close to a boundary get slack; a wrong rounding anywhere else fails. With q8 the
    int8 rounding follows the round trip in that test as well (an element that rounds the other way
    in e4m3, or a step whose amax does, moves its int8 codes too). x's int8 codes need no slack: x is
    exact, and the kernels compute its codes in the fp32 operations q8_emulate does.
    """
    again = (lambda v: q8_rows(v, group)) if group else (lambda v: v)
    w13 = dequant_fp4(banks["w13"], banks["w13_scale"])
    w2 = dequant_fp4(banks["w2"], banks["w2_scale"])
    I = w13.shape[1] // 2
    xq = again(fp8_round_trip(x.astype(np.float32), act_block)).astype(np.float64)
    T, H = x.shape
    y, scale, slack = np.zeros((T, H)), np.zeros((T, H)), np.zeros((T, H))
    for t in range(T):
        for r in range(ids.shape[1]):
            e = int(ids[t, r])
            if e < 0:
                continue
            h = activation(act, w13[e, :I] @ xq[t], w13[e, I:] @ xq[t], **opts).astype(np.float32)
            hq = again(fp8_round_trip(h, act_block)).astype(np.float64)
            move = np.zeros(I)
            for f in (1 - 1e-4, 1 + 1e-4):
                alt = again(fp8_round_trip((h.astype(np.float64) * f).astype(np.float32), act_block))
                move = np.maximum(move, np.abs(alt / f - hq))
            wt = float(w[t, r])
            y[t] += wt * (w2[e] @ hq)
            scale[t] += abs(wt) * (np.abs(w2[e]) @ np.abs(hq))
            slack[t] += abs(wt) * (np.abs(w2[e]) @ move)
    return y, scale, slack


def check(y, ref, scale, slack, what):
    # Weights and both round-tripped vectors are exact in fp32 and bf16, so every product is exact
    # on every tier: left are y's bf16 rounding (<= 2^-9 |y|; 2^-8 leaves a factor 2) and fp32
    # accumulation (K * 2^-24 * scale ~ 2^-16 * scale for K <= 300; 2^-13 leaves a factor 8). One
    # element of h off by one e4m3 ulp (2^-3 .. 2^-4 of itself) moves y by ~ 2^-4 * scale / I, above
    # 2^-13 * scale for every I used here (<= 288). The q8 kernels' sums of int8 codes times 2 * e2m1
    # are exact integers too, scaled in fp32 (a rounding of 2^-24 per block): the same bound holds
    # against the reference that rounds x and h to those codes.
    assert_close_to_reference(y, ref, scale, what, rel=2.0**-8, mag=2.0**-13, extra=slack)


def run_layer(isa, banks, x, ids, w, E, I, act="silu", act_block=128, opts=None):
    T, H = x.shape
    ex = fk.MoeExecutor(hidden=H, top_k=ids.shape[1], max_tokens=T, num_threads=2, isa=isa)
    options = {"act_block": float(act_block)} | (opts or {})
    ex.add_layer(0, "ds_fp4", num_experts=E, intermediate=I, banks=banks, activation=act, options=options)
    return ex.run(0, x, ids, w)


# Rows of 1, 3, 5, 7, 9, 17 and 19 blocks of 32 hit every tail of the kernels (steps of 4 blocks,
# scales 16 blocks at a time); with act_block 128 most have a short last activation block;
# I = 160, 288, 544 split into full and partial pass-1 units of 128 rows.
SHAPES = [(32, 96), (96, 32), (160, 160), (224, 64), (288, 288), (608, 160), (160, 544)]
CASES = [("silu", 1), ("silu", 3), ("silu", 8)] + [(a, 3) for a in ACTIVATIONS[1:]]


@pytest.mark.parametrize(("act", "T"), CASES)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    case = [variant_index(isa), ACTIVATIONS.index(act), T]
    rng = np.random.default_rng(case)
    H, I = SHAPES[sum(case) % len(SHAPES)]
    act_block = (32, 128)[sum(case) % 2]
    E, top_k = 5, 4
    banks = make_layer(rng, E, H, I)
    opts = {"limit": 3.0} if act == "swiglu_clamp" else {}
    # Spread magnitudes over blocks so that the per-block scales differ.
    x = (2.0 * rng.standard_normal((T, H)) * np.exp2(rng.integers(-6, 4, (T, H // 32))).repeat(32, 1)).astype(
        BF16
    )
    ids = random_routes(rng, T, top_k, E)
    w = rng.random((T, top_k)).astype(np.float32)
    y = run_layer(isa, banks, x, ids, w, E, I, act, act_block, opts=opts)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale, slack = reference(banks, x, ids, w, act, act_block, int8_group(isa), **opts)
    check(y, ref, scale, slack, f"ds_fp4 {isa} act_block={act_block}")


def test_scales_the_amx_fold_cannot_take(isa: str) -> None:
    # The AMX kernels fold e8m0 scales into bf16 exponents for scale bytes 2..252 and run a group of
    # 16 rows holding any other byte through the bf16 kernels. Scale byte 0 (2^-127) on a block with
    # a -0.5 code (9) would fold to +inf; here it sits in gate rows 0-15 of expert 0 (the first group
    # of pass 1) and in down rows 16-31 of expert 1, and y must still match the reference. Every
    # token takes both experts: calls of 8 vectors, which the amx kernels put on tiles.
    rng = np.random.default_rng(23)
    E, H, I, T = 2, 96, 64, 8
    banks = make_layer(rng, E, H, I)
    banks["w13"][0, :16, 0] = 0x99  # codes 9, 9: -0.5, -0.5 in block 0
    banks["w13_scale"][0, :16, 0] = 0
    banks["w13_scale"][0, 3, 1] = 1
    banks["w2"][1, 16:32, 16] = 0x19  # block 1 of the down rows (I = 64: 32 bytes a row)
    banks["w2_scale"][1, 16:32, 1] = 0
    x = (2.0 * rng.standard_normal((T, H))).astype(BF16)
    ids = np.array([[t % 2, 1 - t % 2] for t in range(T)], np.int32)
    w = rng.random((T, 2)).astype(np.float32)
    y = run_layer(isa, banks, x, ids, w, E, I)
    ref, scale, slack = reference(banks, x, ids, w, "silu", 128, int8_group(isa))
    assert np.all(np.isfinite(ref))
    check(y, ref, scale, slack, f"ds_fp4 {isa} scale bytes 0 and 1")


def test_one_token_routed_twice_to_an_expert(isa: str) -> None:
    # One token prepares no q8 group records; its two routes to expert 2 make pass-2 calls of two
    # vectors, which must then take the step records (and the -1 route nothing).
    rng = np.random.default_rng(31)
    E, H, I = 4, 608, 160
    banks = make_layer(rng, E, H, I)
    x = (2.0 * rng.standard_normal((1, H))).astype(BF16)
    ids = np.array([[2, 2, 0, -1]], np.int32)
    w = rng.random((1, 4)).astype(np.float32)
    y = run_layer(isa, banks, x, ids, w, E, I, act_block=128)
    ref, scale, slack = reference(banks, x, ids, w, "silu", 128, int8_group(isa))
    check(y, ref, scale, slack, f"ds_fp4 {isa} one token, a repeated route")


def test_layer_reports_the_kernels_it_runs(isa: str) -> None:
    # The executor's own account of the variant's kernels: `auto` resolved as int8_group assumes
    # (so the q8 reference is applied exactly where the q8 kernels run).
    ex = fk.MoeExecutor(hidden=64, top_k=2, max_tokens=1, isa=isa)
    banks = make_layer(np.random.default_rng(0), 2, 64, 32)
    ex.add_layer(0, "ds_fp4", num_experts=2, intermediate=32, banks=banks, options={"act_block": 32.0})
    kernels = current_variant("FT_CPU_MOE_DSFP4_KERNELS", isa)[1]
    assert ex.layer_kernels(0) == (kernels if kernels != "auto" else "fp32" if isa == "scalar" else "q8")
    assert (ex.layer_kernels(0) == "q8") == (int8_group(isa) > 0)


def test_kernel_choice_errors(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    banks = make_layer(rng, 2, 64, 32)

    def add_layer(tier: str) -> None:
        ex = fk.MoeExecutor(hidden=64, top_k=2, max_tokens=1, isa=tier)
        ex.add_layer(0, "ds_fp4", num_experts=2, intermediate=32, banks=banks, options={"act_block": 32.0})

    assert_kernel_choice_errors(
        monkeypatch,
        "FT_CPU_MOE_DSFP4_KERNELS",
        "auto, fp32, bf16, int16, int8, amx or q8",
        add_layer,
        TIERS,
        tiered=(
            ("bf16", "avx512_bf16"),
            ("int16", "avx2"),
            ("int8", "avx512_bf16"),
            ("amx", "avx512_bf16"),
            ("q8", "avx2"),
        ),
    )
    monkeypatch.setenv("FT_CPU_MOE_DSFP4_KERNELS", "fp32")
    add_layer("scalar")


def identity_layer(N: int) -> dict[str, np.ndarray]:
    """One expert, H = I = N: gate_i = xq_0, up_i = xq_i, y_j = hq_j (e2m1 code 2 = 1.0, scale 2^0)."""
    w13 = np.zeros((1, 2 * N, N), np.uint8)  # one byte per element here, packed below
    w13[0, :N, 0] = 2
    w13[0, N + np.arange(N), np.arange(N)] = 2
    w2 = np.zeros((1, N, N), np.uint8)
    w2[0, np.arange(N), np.arange(N)] = 2

    def pack(codes):
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)

    return {
        "w13": pack(w13),
        "w13_scale": np.full((1, 2 * N, N // 32), 127, np.uint8),
        "w2": pack(w2),
        "w2_scale": np.full((1, N, N // 32), 127, np.uint8),
    }


def expected_y(isa: str, x: np.ndarray, act_block: int) -> np.ndarray:
    """y of identity_layer for x (one token, bf16, gate = its first round-tripped element, which is
    >= 17 so that silu(gate) = gate in fp32), as fp32: h = gate * xq in fp32 round-tripped again, in
    bf16 (exact in bf16 unless the q8 kernels run). For the q8 kernels xq and hq are their int8 codes
    times amax / 127 in fp32 (q8_rows): the one nonzero product of each row is that, exactly."""
    group = int8_group(isa)
    again = (lambda v: q8_rows(v, group)) if group else (lambda v: v)
    xq = again(fp8_round_trip(x.astype(np.float32), act_block))
    assert xq[0, 0] >= 17.0
    return again(fp8_round_trip(xq[0, 0] * xq, act_block)).astype(BF16).astype(np.float32)


@pytest.mark.parametrize(("act_block", "T"), [(32, 1), (128, 1), (32, 8)])
def test_round_trips_are_bit_exact(isa: str, act_block: int, T: int) -> None:
    # With the identity-like layer, gate = xq_0 = 48 on every row (x_0 = 48 is block 0's amax, so
    # its scale is 2^-3 and 48 / 2^-3 = 384 = 1.5 * 2^8 is exact in e4m3); silu(48) = 48 exactly in
    # fp32 since exp(-48) < 2^-24; h = 48 * xq is exact in fp32 (<= 6 significant bits) and, not a
    # power-of-two multiple of xq, really gets rounded again; y = hq exactly (one nonzero product per
    # row, hq exact in bf16). So y must equal, bit for bit, the ml_dtypes round trip applied twice:
    # a wrong rounding of any element of x or of h changes y. T = 8 copies of the token on the one
    # expert go through the batched kernels (each weight block decoded once for all 8).
    N = 288  # 9 blocks of 32; with act_block 128: 128, 128, 32
    rng = np.random.default_rng(act_block)
    x = rng.standard_normal(N) * np.exp2(rng.uniform(-12, 6, N))
    x[1:32] = np.clip(x[1:32], -47, 47)
    x[0] = 48.0
    x[32:64] = 0.0  # an all-zero block: the 1e-4 floor on amax
    x[64:96] = rng.standard_normal(32) * 1e-6  # amax below the floor
    # Block 3 (amax 56 = 448 / 8: scale exactly 2^-3, no rounding up): ties at x / s = 17, 19 (round to
    # even: 16, 20), a tie in the subnormal range (2.5 * 2^-9 -> 2 * 2^-9), e4m3 subnormals, -0.
    x[96:128] = rng.uniform(-50, 50, 32)
    x[96:104] = [56.0, 17 / 8, 19 / 8, -2.5 * 2**-12, 3 * 2**-12, 2**-13, -0.0, 448 / 8 * 0.999]
    # Wide dynamic range in one block: most elements fall in the e4m3 subnormal range.
    x[128:160] = rng.standard_normal(32) * np.exp2(rng.uniform(-14, 0, 32))
    x[128] = 300.0
    x = x.astype(BF16)[None, :]
    ids, w = np.zeros((T, 1), np.int32), np.ones((T, 1), np.float32)
    y = run_layer(isa, identity_layer(N), np.repeat(x, T, axis=0), ids, w, 1, N, act_block=act_block)
    xq = fp8_round_trip(x.astype(np.float32), act_block)
    assert xq[0, 0] == 48.0
    expect = fp8_round_trip(np.float32(48.0) * xq, act_block)
    np.testing.assert_array_equal(y.astype(np.float32), np.repeat(expected_y(isa, x, act_block), T, axis=0))
    group = int8_group(isa)
    if group:  # the q8 expectation still holds both round trips: without them it differs
        xi = q8_rows(x, group)
        without = q8_rows(xi[0, 0] * xi, group).astype(BF16).astype(np.float32)
        assert np.any(expected_y(isa, x, act_block) != without)
    # The test has teeth: the second round trip really rounds, and the tie x[97] / s = 17 rounded
    # away from zero (18) instead of to even (16) would show in y.
    assert np.any(expect != 48 * xq)
    assert xq[0, 97] == 2.0
    away = xq.copy()
    away[0, 97] = 2.25
    assert fp8_round_trip(np.float32(48.0) * away, act_block)[0, 97] != expect[0, 97]


@pytest.mark.parametrize(("act_block", "seed"), [(32, 1), (128, 2), (32, 3), (128, 4)])
def test_random_round_trips_are_bit_exact(isa: str, act_block: int, seed: int) -> None:
    # The identity-like layer of the test above over 4096 random bf16 values spread over 2^-14 .. 2^8
    # with random signs: per seed some 170 elements of x and 1000 of h are exact e4m3 midpoints after
    # their block's scale and about a third fall in the e4m3 subnormal range, so both branches of
    # both round trips (the tier's own vector code in the avx512_bf16 tier) meet ties, bit for bit.
    N = 4096
    rng = np.random.default_rng(seed)
    x = rng.choice([-1.0, 1.0], N) * rng.uniform(1.0, 2.0, N) * np.exp2(rng.integers(-14, 8, N))
    x[1:act_block] = np.clip(x[1:act_block], -47, 47)
    x[0] = 48.0  # block 0's amax: gate = xq_0 = 48 on every row
    x = x.astype(BF16)[None, :]
    ids, w = np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32)
    y = run_layer(isa, identity_layer(N), x, ids, w, 1, N, act_block=act_block)
    assert fp8_round_trip(x.astype(np.float32), act_block)[0, 0] == 48.0
    np.testing.assert_array_equal(y.astype(np.float32), expected_y(isa, x, act_block))


def test_many_tokens_on_few_experts(isa: str) -> None:
    # 8 tokens x 6 routes on 2 experts: chunks of up to 8 routes per expert through the batched
    # kernels. H = 608 (19 blocks: a group of 16 and a 3-block step) and I = 160 (5 blocks; pass-1
    # units of 128 and 32 rows) hit their tails; act_block 32 and 128 alternate over the tiers.
    rng = np.random.default_rng(14)
    E, H, I = 2, 608, 160
    act_block = (32, 128)[variant_index(isa) % 2]
    banks = make_layer(rng, E, H, I)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng,
        isa,
        "ds_fp4",
        banks,
        num_experts=E,
        hidden=H,
        intermediate=I,
        options={"act_block": float(act_block)},
    )
    ref, scale, slack = reference(banks, x, ids, w, "gelu", act_block, int8_group(isa))
    check(y, ref, scale, slack, f"ds_fp4 {isa} many tokens")


def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    E, H, I, top_k, T = 8, 608, 544, 4, 8
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(
        isa,
        "ds_fp4",
        banks,
        x,
        ids,
        w,
        num_experts=E,
        intermediate=I,
        options={"act_block": 128.0},
    )


H0, I0, E0 = 64, 32, 2


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b, kw: b.update(w13=np.zeros((E0, 2 * I0, H0 // 2 + 1), np.uint8)),
            r"layer 0 \(ds_fp4\): bank 'w13' has 4224 bytes; expected 4096 bytes \(\[2, 64, 32\] u8\)",
        ),
        (
            lambda b, kw: b.update(w13_scale=np.zeros((E0, 2 * I0, H0 // 32), np.float32)),
            r"bank 'w13_scale' has dtype float32; expected \[2, 64, 2\] u8",
        ),
        (lambda b, kw: b.pop("w2_scale"), r"missing bank 'w2_scale'; expected \[2, 64, 1\] u8"),
        (lambda b, kw: b.pop("w2"), r"missing bank 'w2'; expected \[2, 64, 16\] u8"),
        (
            lambda b, kw: b.update(w2_bias=np.zeros((E0, H0), BF16)),
            r"bank 'w2_bias' is not used by this format",
        ),
        (lambda b, kw: kw.update(options={}), r"missing option 'act_block' \(elements per fp8 activation"),
        (lambda b, kw: kw.update(options={"act_block": 64.0}), r"option act_block=64.* must be 32 or 128"),
        (lambda b, kw: kw["options"].update(alpha=1.0), r"option 'alpha' is not used"),
        (
            lambda b, kw: kw.update(router_weight_on_input=True),
            r"layer 0 \(ds_fp4\): router_weight_on_input=True is not supported",
        ),
        (lambda b, kw: kw.update(intermediate=48), r"intermediate=48 must be multiples of 32"),
    ],
)
def test_add_layer_errors_name_the_bank_and_shape(change, match: str) -> None:
    assert_add_layer_refused(
        change,
        match,
        make_layer(np.random.default_rng(0), E0, H0, I0),
        hidden=H0,
        num_experts=E0,
        weight_format="ds_fp4",
        options={"act_block": 32.0},
        router_weight_on_input=False,
        intermediate=I0,
    )
