"""fp8_block (e4m3fn + 2-D block scales) against ml_dtypes dequantization and the float64 reference."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_add_layer_refused,
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    random_bf16_executor,
    run_many_tokens_on_few_experts,
    run_router_weight_on_input,
    run_swigluoai_options,
)
from helpers.fp4_reference import random_e4m3_codes
from helpers.kernel_variants import assert_kernel_choice_errors, tier_fixture
from helpers.moe_reference import ACTIVATIONS, BF16, bias_terms, moe_reference, random_inputs

TIERS = fk.isa_tiers()
# (tier, FT_CPU_MOE_FP8_KERNELS, FT_CPU_MOE_AMX_MIN[, FT_CPU_MOE_MULTIROW_BYTES]): each tier's default
# kernels; the VDPBF16PS kernels by name with two rows at a time at every row length and with one
# row at a time (FT_CPU_MOE_MULTIROW_BYTES 0 / its largest value; the default's choice depends on the
# CPU's vendor and the rows' length); where this CPU runs AMX-BF16 tiles also the tiles for every
# call (the default puts calls of 4+ vectors on them).
VARIANTS = [(t, "auto", "") for t in TIERS]
if "avx512_bf16" in TIERS:
    VARIANTS += [("avx512_bf16", "bf16", "", rows) for rows in ("0", "1048576")]
    if fk.cpu_amx_bf16():
        VARIANTS += [("avx512_bf16", "amx", "1")]
isa = tier_fixture("FT_CPU_MOE_FP8_KERNELS", VARIANTS)
E4M3 = ml_dtypes.float8_e4m3fn


def nb(n: int, B: int) -> int:
    return -(-n // B)


def dequant(codes: np.ndarray, scale: np.ndarray, B: int) -> np.ndarray:
    """float64 weights: each e4m3 value (via ml_dtypes) times the scale of its (row, column) block."""
    R, C = codes.shape[-2:]
    s = np.repeat(np.repeat(scale.astype(np.float64), B, axis=-2)[..., :R, :], B, axis=-1)[..., :C]
    return codes.view(E4M3).astype(np.float64) * s


def make_layer(rng: np.random.Generator, E: int, H: int, I: int, B: int, bias: bool = False):
    def scales(*dims: int, K: int) -> np.ndarray:
        # e4m3 codes drawn uniformly have |v| up to 448 (rms ~ 110): keep dot products O(1).
        return ((0.5 + rng.random((E, *dims))) / (110.0 * np.sqrt(K))).astype(np.float32)

    banks = {
        "w13": random_e4m3_codes(rng, (E, 2 * I, H)),
        "w13_scale": scales(2 * nb(I, B), nb(H, B), K=H),
        "w2": random_e4m3_codes(rng, (E, H, I)),
        "w2_scale": scales(nb(H, B), nb(I, B), K=I),
    }
    if bias:
        banks["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(np.float32)
        banks["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    return banks


def reference(banks, x, ids, w, I, B, act, on_input=False, **opts):
    nbI = nb(I, B)
    # Gate rows use the first nb(I) row-blocks of w13_scale, up rows the next nb(I): a checkpoint's
    # separate gate and up scale grids, concatenated.
    gate = dequant(banks["w13"][:, :I], banks["w13_scale"][:, :nbI], B)
    up = dequant(banks["w13"][:, I:], banks["w13_scale"][:, nbI:], B)
    down = dequant(banks["w2"], banks["w2_scale"], B)
    return moe_reference(
        x,
        ids,
        w,
        gate,
        up,
        down,
        act,
        **bias_terms(banks, slice(None, I), slice(I, None)),
        router_weight_on_input=on_input,
        **opts,
    )


def check(y: np.ndarray, ref: np.ndarray, scale: np.ndarray, isa: str) -> None:
    # The weights are exact in fp32 (an e4m3 value times an f32 scale is applied as a per-block sum
    # times the scale, all fp32), so every tier only adds fp32 accumulation error (K * 2^-24 relative
    # to the magnitude sum, far below 2^-11 for these K) and the bf16 rounding of y (<= 2^-9
    # relative; 2^-8 leaves a factor 2). The avx512_bf16 tier multiplies with VDPBF16PS: the weights
    # are exact in bf16 (e4m3 fits its 8-bit exponent and 7-bit mantissa) and so is x, but the
    # intermediate is rounded to bf16 before the down projection: each term off by <= 2^-9 relative,
    # the sum by <= 2^-9 * scale (2^-8 leaves a factor 2), as in the bf16 format.
    c = 2.0**-8 if isa == "avx512_bf16" else 2.0**-11
    assert_close_to_reference(y, ref, scale, isa, rel=2.0**-8, mag=c)


def run_case(isa, act, T, rng, B, E=5, H=None, I=None, top_k=4, threads=2):
    # Odd sizes (and odd block sizes) exercise every vector tail inside and across blocks.
    H = H or int(rng.integers(40, 200))
    I = I or int(rng.integers(17, 90))
    banks = make_layer(rng, E, H, I, B)
    opts = {"limit": 3.0} if act == "swiglu_clamp" else {}
    fmt_opts = {} if B == 128 else {"block_size": B}
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=threads, isa=isa)
    ex.add_layer(
        0,
        "fp8_block",
        num_experts=E,
        intermediate=I,
        banks=banks,
        activation=act,
        options={**opts, **fmt_opts},
    )
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale = reference(banks, x, ids, w, I, B, act, **opts)
    check(y, ref, scale, isa)


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    rng = np.random.default_rng([TIERS.index(isa), ACTIVATIONS.index(act), T, 8])
    B = [128, 32, 48, 7, 16][(ACTIVATIONS.index(act) + T) % 5]
    run_case(isa, act, T, rng, B)


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_whole_32_element_groups(isa: str, act: str, T: int) -> None:
    # H, I and the block size multiples of 32: the avx2 tier's permuted path (x and the intermediate
    # reordered per 32 elements), which the odd sizes above never take. The order and scale of the
    # prepared vectors and the 2^56 unscale all show in the result: a build whose unscale is 2^55
    # fails here.
    rng = np.random.default_rng([TIERS.index(isa), ACTIVATIONS.index(act), T, 32])
    B = [32, 64, 128, 96][(ACTIVATIONS.index(act) + T) % 4]
    H, I = 32 * int(rng.integers(3, 10)), 32 * int(rng.integers(1, 5))
    run_case(isa, act, T, rng, B, H=H, I=I)


@pytest.mark.parametrize("x_scale", [2.0**-20, 2.0**20])
def test_activations_far_from_one(isa: str, x_scale: float) -> None:
    # x scaled by 2^20 (the intermediate near 2^40, times 2^64 near 2^104 in the permuted path) and
    # by 2^-20 (the intermediate near 2^-40, its products with the weights near 2^-110 before the
    # unscale): every tier keeps the relative error of O(1) inputs.
    rng = np.random.default_rng(5)
    E, H, I, B, T, top_k = 3, 128, 96, 32, 3, 2
    banks = make_layer(rng, E, H, I, B)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=4, num_threads=2, isa=isa)
    ex.add_layer(0, "fp8_block", num_experts=E, intermediate=I, banks=banks, options={"block_size": B})
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    x = (x.astype(np.float64) * x_scale).astype(BF16)
    with np.errstate(over="ignore"):  # exp(-g) of the reference's silu for g near -2^20: g / inf = -0
        ref, scale = reference(banks, x, ids, w, I, B, "silu")
    y = ex.run(0, x, ids, w)
    assert np.isfinite(y.astype(np.float64)).all()
    check(y, ref, scale, isa)


def test_large_blocks_partial_at_both_edges(isa: str) -> None:
    # H and I larger than one 128-block and not multiples of it: the last row-block of gate (and of
    # up, which starts at scale row nb(I)) and the last column-block are partial.
    rng = np.random.default_rng(21)
    run_case(isa, "silu", 3, rng, 128, E=3, H=300, I=200, top_k=2)


def test_biases_and_swigluoai_options(isa: str) -> None:
    rng = np.random.default_rng(7)
    E, H, I, B = 4, 96, 48, 32
    banks = make_layer(rng, E, H, I, B, bias=True)
    opts = {"alpha": 1.5, "limit": 2.0, "block_size": B}
    x, ids, w, y = run_swigluoai_options(
        rng, isa, "fp8_block", banks, opts, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, B, "swigluoai", alpha=1.5, limit=2.0)
    check(y, ref, scale, isa)


def test_router_weight_on_input(isa: str) -> None:
    rng = np.random.default_rng(11)
    E, H, I = 3, 64, 32
    banks = make_layer(rng, E, H, I, 128)
    x, ids, w, y = run_router_weight_on_input(
        rng, isa, "fp8_block", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, 128, "silu", on_input=True)
    check(y, ref, scale, isa)


def test_layer_reports_the_kernels_it_runs(isa: str) -> None:
    # block_size 128 (the tiles' condition); auto runs tiles wherever this process can.
    ex = fk.MoeExecutor(hidden=128, top_k=2, max_tokens=1, isa=isa)
    banks = make_layer(np.random.default_rng(0), 2, 128, 128, 128)
    ex.add_layer(0, "fp8_block", num_experts=2, intermediate=128, banks=banks, options={"block_size": 128.0})
    kernels = os.environ["FT_CPU_MOE_FP8_KERNELS"]
    if isa != "avx512_bf16":
        assert ex.layer_kernels(0) == "fp32"
    elif kernels == "auto":
        assert ex.layer_kernels(0) == ("amx" if fk.cpu_amx_bf16() else "bf16")
    else:
        assert ex.layer_kernels(0) == kernels
    # A format with one set of kernels per tier reports none.
    assert random_bf16_executor(64, 32, 2, 2, max_tokens=1, isa=isa).layer_kernels(0) is None


def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    # Odd sizes, then multiples of 32 (the avx2 tier's permuted path).
    for E, H, I, top_k, T, B in ((8, 300, 200, 6, 8, 64), (8, 320, 192, 6, 8, 64)):
        banks = make_layer(rng, E, H, I, B)
        x, ids, w = random_inputs(rng, T, H, top_k, E)
        assert_bits_do_not_depend_on_thread_count(
            isa, "fp8_block", banks, x, ids, w, num_experts=E, intermediate=I, options={"block_size": B}
        )


@pytest.mark.parametrize("B", [32, 48, 128])
def test_zero_and_subnormal_codes(isa: str, B: int) -> None:
    # Only codes with exponent 0 or 1 (both zeros, the subnormals m * 2^-9, the smallest normals),
    # scaled up to O(1) dot products: a wrong subnormal decode (the bf16 tier's fix-up path) shows at
    # full size here, where among all codes they would hide under the large ones. A last chunk of
    # 64 and blocks of 48 put fix-ups in masked tails too; B = 128 with H = 300 and I = 260 runs the
    # bf16 tier's whole-block path (two chunks decoded together) on full blocks, then a partial one.
    rng = np.random.default_rng(17)
    E, top_k, T = 3, 2, 3
    # B = 32 with H = 224 and I = 96: the avx2 tier's permuted path (subnormal codes as fp32
    # subnormals).
    H, I = {32: (224, 96), 48: (200, 100), 128: (300, 260)}[B]
    banks = make_layer(rng, E, H, I, B)
    for name in ("w13", "w2"):
        banks[name] = (
            rng.integers(0, 16, banks[name].shape) | (rng.integers(0, 2, banks[name].shape) << 7)
        ).astype(np.uint8)
        banks[name + "_scale"] *= np.float32(2.0**12)  # |codes| <= 15/8 * 2^-6 instead of ~110
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=4, num_threads=2, isa=isa)
    ex.add_layer(0, "fp8_block", num_experts=E, intermediate=I, banks=banks, options={"block_size": B})
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    ref, scale = reference(banks, x, ids, w, I, B, "silu")
    assert np.abs(ref).max() > 0.1
    check(ex.run(0, x, ids, w), ref, scale, isa)


def test_whole_blocks_on_tiles(isa: str) -> None:
    # H and I multiples of 128 with B = 128: the shapes the AMX tiles take (groups of 16 rows in one
    # row block of scales). 8 tokens on 3 experts with top_k 3: calls of ~8 vectors in both passes;
    # biases. Row block 0 of expert 0's gate and of expert 1's down hold only exponent-0 codes (the
    # decode's fix-up), their scales raised by 2^12 so that a wrong decode shows at full size.
    rng = np.random.default_rng(31)
    E, H, I, B, T, top_k = 3, 256, 384, 128, 8, 3
    banks = make_layer(rng, E, H, I, B, bias=True)
    for name, e, K in (("w13", 0, H), ("w2", 1, I)):
        codes = rng.integers(0, 8, (128, K)) | (rng.integers(0, 2, (128, K)) << 7)
        banks[name][e, :128] = codes.astype(np.uint8)
        banks[name + "_scale"][e, 0] *= np.float32(2.0**12)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, num_threads=2, isa=isa)
    ex.add_layer(0, "fp8_block", num_experts=E, intermediate=I, banks=banks)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    ref, scale = reference(banks, x, ids, w, I, B, "silu")
    check(ex.run(0, x, ids, w), ref, scale, isa)


@pytest.mark.parametrize("unit_rows", ["256,256", "0,0"])
def test_one_vector_calls_across_row_blocks(isa: str, unit_rows: str, monkeypatch) -> None:
    # One token, B = 128 and H, I multiples of 128: the avx512_bf16 tier's one-vector calls of whole
    # blocks (fp8_rows128_one_bf16x). Units of 256 rows make one call's rows span two 128-row blocks of
    # scales (as a 2-thread qwen3-30b-a3b step's pass-2 units do); "0,0" keeps the run's own units.
    # Row blocks alternate their scales' factor (1, 4, 1, 4, ...): a row scaled by a neighbouring
    # block's scales is off by 4x or 1/4, at the size of the token's output (growing factors would let
    # the largest block set the check's scale and hide the smaller blocks' rows).
    monkeypatch.setenv("FT_CPU_MOE_UNIT_ROWS", unit_rows)
    rng = np.random.default_rng([TIERS.index(isa), int(unit_rows[0]), 36])
    E, H, I, top_k = 3, 384, 256, 3
    banks = make_layer(rng, E, H, I, 128)
    for name in ("w13_scale", "w2_scale"):
        banks[name] *= (4.0 ** (np.arange(banks[name].shape[1]) % 2)).astype(np.float32)[None, :, None]
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=1, num_threads=2, isa=isa)
    ex.add_layer(0, "fp8_block", num_experts=E, intermediate=I, banks=banks)
    x, _, w = random_inputs(rng, 1, H, top_k, E, x_scale=2.0)
    ids = np.array([[2, 0, 1]], dtype=np.int32)  # distinct experts: every call has one vector
    ref, scale = reference(banks, x, ids, w, I, 128, "silu")
    check(ex.run(0, x, ids, w), ref, scale, isa)


def test_kernel_choice_errors(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    banks = make_layer(rng, 2, 64, 32, 128)

    def add_layer(tier: str) -> None:
        ex = fk.MoeExecutor(hidden=64, top_k=2, max_tokens=1, isa=tier)
        ex.add_layer(0, "fp8_block", num_experts=2, intermediate=32, banks=banks)

    assert_kernel_choice_errors(monkeypatch, "FT_CPU_MOE_FP8_KERNELS", "auto, bf16 or amx", add_layer, TIERS)


def test_many_tokens_on_few_experts(isa: str) -> None:
    # Over full 64-element chunks and tails.
    rng = np.random.default_rng(13)
    E, H, I, B = 2, 300, 136, 128
    banks = make_layer(rng, E, H, I, B, bias=True)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "fp8_block", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, B, "gelu")
    check(y, ref, scale, isa)


E_, H_, I_ = 4, 64, 40  # errors: nb(I) = 1 at B=128, 3 at B=16


def _banks(B: int = 128) -> dict[str, np.ndarray]:
    return {
        "w13": np.zeros((E_, 2 * I_, H_), np.uint8),
        "w13_scale": np.ones((E_, 2 * nb(I_, B), nb(H_, B)), np.float32),
        "w2": np.zeros((E_, H_, I_), np.uint8),
        "w2_scale": np.ones((E_, nb(H_, B), nb(I_, B)), np.float32),
    }


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b, o: b.update(w13=np.zeros((E_, 2 * I_, H_ + 1), np.uint8)),
            r"layer 0 \(fp8_block\): bank 'w13' has 20800 bytes; expected 20480 bytes \(\[4, 80, 64\] u8\)",
        ),
        (
            lambda b, o: b.update(w13_scale=np.ones((E_, 1, 1), np.float32)),
            r"bank 'w13_scale' has 16 bytes; expected 32 bytes \(\[4, 2, 1\] f32\)",
        ),
        (
            lambda b, o: b.update(w2=np.zeros((E_, H_, I_), np.float16)),
            r"bank 'w2' has dtype float16; expected \[4, 64, 40\] u8",
        ),
        (
            lambda b, o: b.update(w2_scale=np.ones((E_, 1, 1), BF16)),
            r"bank 'w2_scale' has dtype bfloat16; expected \[4, 1, 1\] f32",
        ),
        (lambda b, o: b.pop("w2_scale"), r"missing bank 'w2_scale'; expected \[4, 1, 1\] f32"),
        (lambda b, o: b.pop("w13"), r"missing bank 'w13'; expected \[4, 80, 64\] u8"),
        (lambda b, o: b.update(w2_bias=np.zeros((E_, H_ + 1), np.float32)), r"bank 'w2_bias' has 1040 bytes"),
        (
            lambda b, o: b.update(weight_scale_inv=np.ones(4, np.float32)),
            r"bank 'weight_scale_inv' is not used",
        ),
        (lambda b, o: o.update(blocksize=64), r"option 'blocksize' is not used"),
        # block_size=16 wants [4, 2*3, 4] scales for w13; the B=128 banks have [4, 2, 1].
        (
            lambda b, o: o.update(block_size=16),
            r"bank 'w13_scale' has 32 bytes; expected 384 bytes \(\[4, 6, 4\] f32\)",
        ),
        (lambda b, o: o.update(block_size=0), r"option 'block_size' must be an integer in \[1, 65536\]"),
        (lambda b, o: o.update(block_size=64.5), r"option 'block_size' must be an integer"),
    ],
)
def test_add_layer_errors_name_the_bank_and_shape(change, match: str) -> None:
    assert_add_layer_refused(
        lambda b, kw: change(b, kw["options"]),
        match,
        _banks(),
        hidden=H_,
        num_experts=E_,
        weight_format="fp8_block",
        intermediate=I_,
        options={},
    )


def test_block_size_option_sets_the_scale_grid() -> None:
    ex = fk.MoeExecutor(hidden=H_, top_k=2, max_tokens=4)
    ex.add_layer(
        0, "fp8_block", num_experts=E_, intermediate=I_, banks=_banks(16), options={"block_size": 16}
    )
    assert ex.layers == [0]


def test_reference_decoding_is_ml_dtypes() -> None:
    # The reference decodes with ml_dtypes; pin a few codes so that a change there cannot go unnoticed.
    vals = np.array([0x00, 0x01, 0x08, 0x38, 0x7E, 0x80, 0xB8, 0xFE], np.uint8).view(E4M3).astype(np.float64)
    np.testing.assert_array_equal(vals, [0.0, 2.0**-9, 2.0**-6, 1.0, 448.0, -0.0, -1.0, -448.0])
