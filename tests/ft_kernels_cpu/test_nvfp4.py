"""nvfp4 (ModelOpt NVFP4) against ml_dtypes dequantization and the float64 reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_add_layer_refused,
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
    run_router_weight_on_input,
    run_swigluoai_options,
)
from helpers.fp4_reference import random_e4m3_codes
from helpers.int8_bounds import block_amax, int8_emulated_reference
from helpers.kernel_variants import multirow_tier_fixture
from helpers.moe_reference import ACTIVATIONS, BF16, activation, bias_terms, moe_reference, random_inputs

TIERS = fk.isa_tiers()
isa = multirow_tier_fixture()
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn


def dequant(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray) -> np.ndarray:
    """float64 weights [..., R, K] from packed e2m1 pairs [..., R, K/2] (low nibble first), e4m3 scales
    [..., R, K/16] and per-row f32 global scales [..., R], all decoded by ml_dtypes."""
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    vals = codes.view(E2M1).astype(np.float64)
    s = np.repeat(scale.view(E4M3).astype(np.float64), 16, axis=-1)
    return vals * s * scale_2.astype(np.float64)[..., None]


def make_layer(rng: np.random.Generator, E: int, H: int, I: int, bias: bool = False):
    # Random e4m3 scale codes span 2^-9..448 (rms ~ 110) and e2m1 values have rms ~ 3: the global
    # scale brings dot products to O(1).
    banks = {
        "w13": rng.integers(0, 256, size=(E, 2 * I, H // 2)).astype(np.uint8),
        "w13_scale": random_e4m3_codes(rng, (E, 2 * I, H // 16)),
        "w13_scale_2": ((0.5 + rng.random((E, 2 * I))) / (330.0 * np.sqrt(H))).astype(np.float32),
        "w2": rng.integers(0, 256, size=(E, H, I // 2)).astype(np.uint8),
        "w2_scale": random_e4m3_codes(rng, (E, H, I // 16)),
        "w2_scale_2": ((0.5 + rng.random((E, H))) / (330.0 * np.sqrt(I))).astype(np.float32),
    }
    if bias:
        banks["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(np.float32)
        banks["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    return banks


def group_step(v: np.ndarray) -> np.ndarray:
    """Per element, the int8 step of its group of 16 (amax / 127), as the int8 path quantizes."""
    return block_amax(v, 16) / 127.0


def act_spread(act: str, g: np.ndarray, u: np.ndarray, eg: np.ndarray, eu: np.ndarray, **opts) -> np.ndarray:
    """Bound on |act(g', u') - act(g, u)| for |g' - g| <= eg, |u' - u| <= eu: the largest change over
    the corners and edge midpoints of the box, times 2 (the activations are smooth or piecewise
    monotone on these small boxes; the factor covers curvature inside)."""
    h = activation(act, g, u, **opts)
    worst = np.zeros_like(h)
    for sg in (-1, 0, 1):
        for su in (-1, 0, 1):
            worst = np.maximum(worst, np.abs(activation(act, g + sg * eg, u + su * eu, **opts) - h))
    return 2.0 * worst


def int8_path(isa: str, H: int, I: int) -> bool:
    """Whether the executor takes int8 activations in either pass: always in the avx512_bf16 tier
    (VNNI); in the avx2 tier for x when hidden is a multiple of 32 and for the intermediate when it is
    (its records hold blocks of 32). qerr bounds both passes' rounding, so it covers either alone."""
    return isa == "avx512_bf16" or (isa == "avx2" and (H % 32 == 0 or I % 32 == 0))


def reference(banks, x, ids, w, I, act, on_input=False, **opts):
    """(y, scale, qerr): the float64 reference, the magnitude of its intermediate terms, and a bound on
    what the int8-activation paths (int8_path) add by quantizing x and the intermediate."""
    w13 = dequant(banks["w13"], banks["w13_scale"], banks["w13_scale_2"])
    down = dequant(banks["w2"], banks["w2_scale"], banks["w2_scale_2"])
    biases = bias_terms(banks, slice(None, I), slice(I, None))
    b_gate, b_up = biases["b_gate"], biases["b_up"]
    ref, scale = moe_reference(
        x, ids, w, w13[:, :I], w13[:, I:], down, act, **biases, router_weight_on_input=on_input, **opts
    )
    # int8 x per group of 16 with step d = amax/127, round to nearest: each element off by <= d/2
    # (x 1.001 for the fp32 arithmetic of the scale). Through pass 1: |dg_i| <= sum_k |W_gate[i,k]|
    # dx_k (same for up), times the router weight when it is applied to the input. Through the
    # activation: act_spread. Pass 2 quantizes the kernel's intermediate the same way: each element
    # off by its activation error plus half a step of its group (amax over the group, grown by the
    # activation error). |dy_j| <= sum_r |w_r| sum_k |W_down[j,k]| dh_k.
    xf = x.astype(np.float64)
    dx = 0.5 * 1.001 * group_step(xf)
    qerr = np.zeros_like(ref)
    for t in range(ids.shape[0]):
        for r in range(ids.shape[1]):
            e = int(ids[t, r])
            if e < 0:
                continue
            wr = float(w[t, r])
            xin = wr * xf[t] if on_input else xf[t]
            dxin = abs(wr) * dx[t] if on_input else dx[t]
            g, u = w13[e, :I] @ xin, w13[e, I:] @ xin
            if b_gate is not None:
                g, u = g + b_gate[e], u + b_up[e]
            eg, eu = np.abs(w13[e, :I]) @ dxin, np.abs(w13[e, I:]) @ dxin
            dh = act_spread(act, g, u, eg, eu, **opts)
            h = activation(act, g, u, **opts)
            dh = dh + 0.5 * 1.001 * group_step(np.abs(h) + dh)
            qerr[t] += (1.0 if on_input else abs(wr)) * (np.abs(down[e]) @ dh)
    return ref, scale, qerr


def check(y: np.ndarray, ref: np.ndarray, scale: np.ndarray, qerr: np.ndarray, isa: str, int8: bool) -> None:
    # Each group's e2m1 products are summed exactly (int32 in the int8 path) or in fp32, scaled by the
    # exact e4m3 value, then the row by its f32 global scale: fp32 accumulation error only (K * 2^-24
    # of the magnitude sum, far below 2^-11 here), plus the bf16 rounding of y (<= 2^-9 relative;
    # 2^-8 leaves a factor 2). The int8-activation paths (int8_path) also add qerr,
    # the propagated quantization error of x and of the intermediate (see reference()).
    # That worst case adds |errors| with no cancellation and is loose (about |y| on these random
    # layers), so the int8 path also gets a statistical check: independent rounding errors of <= half
    # a step, step = amax/127 of 16 elements, leave the rms error of y near 1% of the rms of y here;
    # a wrong scale, group or offset gives tens of percent. The limit is 4%.
    err = assert_close_to_reference(
        y, ref, scale, isa, rel=2.0**-8, mag=2.0**-11, extra=qerr if int8 else 0.0
    )
    if int8:
        rms_err, rms_ref = np.sqrt(np.mean(err**2)), np.sqrt(np.mean(ref**2))
        assert rms_err <= 0.04 * rms_ref, f"{isa}: rms error {rms_err:.3g} over 4% of rms {rms_ref:.3g}"


def run_case(isa, act, T, rng, E=5, H=None, I=None, top_k=4, threads=2):
    # Multiples of 16 with odd group counts: H over 256 (the 256-element main loop) and not, chunks of
    # 32 with a last group of 16, intermediate blocks of 32 rows ending in 16.
    H = H or 16 * int(rng.integers(2, 24))
    I = I or 16 * int(rng.integers(1, 8))
    banks = make_layer(rng, E, H, I)
    opts = {"limit": 3.0} if act == "swiglu_clamp" else {}
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=threads, isa=isa)
    ex.add_layer(0, "nvfp4", num_experts=E, intermediate=I, banks=banks, activation=act, options=opts)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale, qerr = reference(banks, x, ids, w, I, act, **opts)
    check(y, ref, scale, qerr, isa, int8_path(isa, H, I))


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    rng = np.random.default_rng([TIERS.index(isa), ACTIVATIONS.index(act), T, 4])
    run_case(isa, act, T, rng)


@pytest.mark.parametrize(("H", "I"), [(16, 16), (272, 48), (528, 112), (2048, 96), (320, 64), (96, 224)])
def test_edge_shapes(isa: str, H: int, I: int) -> None:
    # One group per row; one 256-block plus a last group; two blocks plus 32 + 16; whole blocks.
    run_case(isa, "silu", 3, np.random.default_rng([H, I]), E=3, H=H, I=I, top_k=2)


def test_nan_scale_codes_give_nan(isa: str) -> None:
    # e4m3fn 0x7f and 0xff are NaN: a down row with one such group scale must give NaN in every tier
    # (the avx2 int8 path converts scales without a table, 8 at a time). I = 160 has 10 groups in 5
    # blocks: group 0 and 3 fall in the first 4 blocks, group 9 in the last, unpaired block.
    E, H, I = 1, 64, 160
    ids = np.zeros((1, 1), np.int32)
    w = np.ones((1, 1), np.float32)
    for code in (0x7F, 0xFF):
        for g in (0, 3, 9):
            rng = np.random.default_rng([code, g])
            banks = make_layer(rng, E, H, I)
            banks["w2_scale"][0, :, g] = code
            assert np.isnan(dequant(banks["w2"], banks["w2_scale"], banks["w2_scale_2"])[0, :, 16 * g]).all()
            ex = fk.MoeExecutor(hidden=H, top_k=1, max_tokens=1, num_threads=2, isa=isa)
            ex.add_layer(0, "nvfp4", num_experts=E, intermediate=I, banks=banks, activation="silu")
            x = (2.0 * rng.standard_normal((1, H))).astype(BF16)
            y = ex.run(0, x, ids, w).astype(np.float32)
            assert np.isnan(y).all(), f"{isa}: scale code {code:#x} in group {g} must give NaN"


@pytest.mark.parametrize("row", [0, 37, 63])
def test_one_nan_scale_code_anywhere_in_a_call(isa: str, row: int) -> None:
    # One-vector calls of rows whose length is a multiple of 256 (I = 512) run 4 rows at a time in the
    # avx512_bf16 tier, converting scales without the NaN check where a scan of the 4 rows' scale
    # bytes finds no NaN code (one call mixes both kernels). One 0x7f in the last group of a single
    # down row (first, middle, last row: the end of a call's scales) must still give NaN in that
    # output alone; had the scan missed it, the code would read as 480 * 2^-8 and y[row] finite.
    # The other rows, whichever conversion their group took, must give the bits of the same call
    # without the NaN code (where every group takes the conversion without the check).
    E, H, I = 1, 64, 512
    rng = np.random.default_rng(row)
    clean = make_layer(rng, E, H, I)
    banks = {k: v.copy() for k, v in clean.items()}
    banks["w2_scale"][0, row, -1] = 0x7F
    x = (2.0 * rng.standard_normal((1, H))).astype(BF16)

    def run(b: dict) -> np.ndarray:
        ex = fk.MoeExecutor(hidden=H, top_k=1, max_tokens=1, num_threads=2, isa=isa)
        ex.add_layer(0, "nvfp4", num_experts=E, intermediate=I, banks=b, activation="silu")
        return ex.run(0, x, np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32))

    y16, clean16 = run(banks), run(clean)
    y = y16.astype(np.float32)
    want = np.zeros((1, H), bool)
    want[0, row] = True
    assert np.array_equal(np.isnan(y), want), f"{isa}: NaN at {np.flatnonzero(np.isnan(y))}, want {row}"
    others = np.arange(H) != row
    np.testing.assert_array_equal(y16.view(np.uint16)[0, others], clean16.view(np.uint16)[0, others])


def test_biases_and_swigluoai_options(isa: str) -> None:
    rng = np.random.default_rng(7)
    E, H, I = 4, 96, 48
    banks = make_layer(rng, E, H, I, bias=True)
    opts = {"alpha": 1.5, "limit": 2.0}
    x, ids, w, y = run_swigluoai_options(
        rng, isa, "nvfp4", banks, opts, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale, qerr = reference(banks, x, ids, w, I, "swigluoai", **opts)
    check(y, ref, scale, qerr, isa, int8_path(isa, H, I))


def test_router_weight_on_input(isa: str) -> None:
    rng = np.random.default_rng(11)
    E, H, I = 3, 64, 32
    banks = make_layer(rng, E, H, I)
    x, ids, w, y = run_router_weight_on_input(
        rng, isa, "nvfp4", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale, qerr = reference(banks, x, ids, w, I, "silu", on_input=True)
    check(y, ref, scale, qerr, isa, int8_path(isa, H, I))


@pytest.mark.parametrize(("H", "I", "seed"), [(304, 208, 3), (320, 224, 5)])
def test_bits_do_not_depend_on_thread_count(isa: str, H: int, I: int, seed: int) -> None:
    # 304 / 208: chunks of 32 ending in 16 (the avx2 tier's fp32 kernels); 320 / 224: multiples of 32
    # (its int8 path in both passes).
    rng = np.random.default_rng(seed)
    E, top_k, T = 8, 6, 8
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(isa, "nvfp4", banks, x, ids, w, num_experts=E, intermediate=I)


@pytest.mark.skipif("avx2" not in TIERS, reason="no AVX2 here")
@pytest.mark.parametrize(
    ("T", "H", "I"), [(1, 160, 96), (3, 96, 160), (4, 1504, 96), (8, 288, 64), (8, 1504, 64)]
)
def test_avx2_int8_path_matches_an_int8_emulation(T: int, H: int, I: int) -> None:
    # qerr is a worst case; this is the sharp check of the avx2 tier's int8 path: x and h rounded per
    # group of 16 in numpy exactly as specified (helpers.int8_bounds.q8_emulate), so only fp32
    # accumulation, the bf16 output and h elements at a rounding boundary remain. A wrong code order
    # within a block (even / odd elements), a wrong group's scale or offset fails it. T = 4 and 8 on
    # the 4 experts: calls of 4 and 8 vectors (avx2_pairs.h's rows_by4 with two steps per block);
    # H = 1504 (47 blocks) ends the rows in a 3-block tail (a whole pair, then a half one).
    rng = np.random.default_rng([T, H, I, 16])
    E, top_k = 4, 4
    banks = make_layer(rng, E, H, I)
    for b in ("w13_bias", "w2_bias"):
        banks.pop(b, None)
    w13 = dequant(banks["w13"], banks["w13_scale"], banks["w13_scale_2"])
    w2 = dequant(banks["w2"], banks["w2_scale"], banks["w2_scale_2"])
    wref = {"w_gate": w13[:, :I], "w_up": w13[:, I:], "w_down": w2}
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa="avx2")
    ex.add_layer(0, "nvfp4", num_experts=E, intermediate=I, banks=banks, activation="silu")
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", 16, 16)
    assert_close_to_reference(
        y, ref, scale, "nvfp4 avx2 int8 emulation", rel=2.0**-8, mag=2.0**-11, extra=1.01 * flip
    )


@pytest.mark.parametrize("H", [304, 1504])
def test_many_tokens_on_few_experts(isa: str, H: int) -> None:
    # H = 1504 (47 blocks): calls of 8 vectors over rows of 11 groups of 4 blocks and a 3-block tail,
    # whose records (8 x 3 KiB in the avx2 tier) outgrow half of an L1.
    # H spans a full 128/256-element chunk plus tails.
    rng = np.random.default_rng(13)
    E, H, I = 2, H, 144
    banks = make_layer(rng, E, H, I, bias=True)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "nvfp4", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale, qerr = reference(banks, x, ids, w, I, "gelu")
    check(y, ref, scale, qerr, isa, int8_path(isa, H, I))


E_, H_, I_ = 4, 64, 48


def _banks() -> dict[str, np.ndarray]:
    return {
        "w13": np.zeros((E_, 2 * I_, H_ // 2), np.uint8),
        "w13_scale": np.zeros((E_, 2 * I_, H_ // 16), np.uint8),
        "w13_scale_2": np.ones((E_, 2 * I_), np.float32),
        "w2": np.zeros((E_, H_, I_ // 2), np.uint8),
        "w2_scale": np.zeros((E_, H_, I_ // 16), np.uint8),
        "w2_scale_2": np.ones((E_, H_), np.float32),
    }


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b: b.update(w13=np.zeros((E_, 2 * I_, H_), np.uint8)),
            r"layer 0 \(nvfp4\): bank 'w13' has 24576 bytes; expected 12288 bytes \(\[4, 96, 32\] u8\)",
        ),
        (
            lambda b: b.update(w13_scale=np.zeros((E_, 2 * I_, H_ // 32), np.uint8)),
            r"bank 'w13_scale' has 768 bytes; expected 1536 bytes \(\[4, 96, 4\] u8\)",
        ),
        (
            lambda b: b.update(w13_scale_2=np.ones(E_, np.float32)),
            r"bank 'w13_scale_2' has 16 bytes; expected 1536 bytes \(\[4, 96\] f32\)",
        ),
        (
            lambda b: b.update(w2_scale_2=np.ones((E_, H_), np.float16)),
            r"bank 'w2_scale_2' has dtype float16; expected \[4, 64\] f32",
        ),
        (
            lambda b: b.update(w2=np.zeros((E_, H_, I_ // 4), np.uint16)),
            r"bank 'w2' has dtype uint16; expected \[4, 64, 24\] u8",
        ),
        (lambda b: b.pop("w2_scale"), r"missing bank 'w2_scale'; expected \[4, 64, 3\] u8"),
        (lambda b: b.pop("w13_scale_2"), r"missing bank 'w13_scale_2'; expected \[4, 96\] f32"),
        (lambda b: b.update(input_scale=np.ones(1, np.float32)), r"bank 'input_scale' is not used"),
    ],
)
def test_add_layer_errors_name_the_bank_and_shape(change, match: str) -> None:
    assert_add_layer_refused(
        lambda b, kw: change(b),
        match,
        _banks(),
        hidden=H_,
        num_experts=E_,
        weight_format="nvfp4",
        intermediate=I_,
    )


def test_unknown_option_is_refused() -> None:
    ex = fk.MoeExecutor(hidden=H_, top_k=2, max_tokens=4)
    with pytest.raises(ValueError, match=r"option 'block_size' is not used"):
        ex.add_layer(0, "nvfp4", num_experts=E_, intermediate=I_, banks=_banks(), options={"block_size": 16})


@pytest.mark.parametrize(("H", "I", "what"), [(72, 48, "hidden=72"), (64, 40, "intermediate=40")])
def test_sizes_must_be_multiples_of_16(H: int, I: int, what: str) -> None:
    ex = fk.MoeExecutor(hidden=H, top_k=2, max_tokens=4)
    banks = {"w13": np.zeros(1, np.uint8)}
    with pytest.raises(
        ValueError, match=rf"nvfp4 needs hidden and intermediate to be multiples of 16.*{what}"
    ):
        ex.add_layer(0, "nvfp4", num_experts=2, intermediate=I, banks=banks)


def test_reference_decoding_is_ml_dtypes() -> None:
    # Pin ml_dtypes' e2m1 table and the nibble order the reference assumes (low nibble first).
    np.testing.assert_array_equal(
        np.arange(16, dtype=np.uint8).view(E2M1).astype(np.float64),
        [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
    )
    packed = np.array([[0x72] * 8], np.uint8)  # element 0 = 1.0 (code 2), element 1 = 6.0 (code 7)
    w = dequant(packed, np.array([[0x38]], np.uint8), np.array([0.5], np.float32))
    np.testing.assert_array_equal(w[0, :2], [0.5, 3.0])
