"""gguf executor (expert tensors as GGUF stores them) against gguf.quants.dequantize + float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

# The reference dequantizers: nox -s tests installs gguf; a bare GPU machine may not have it.
pytest.importorskip("gguf", reason="the gguf package (reference dequantizers) is not installed")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
)
from helpers.int8_bounds import int8_emulated_reference, int8_error_bound
from helpers.kernel_variants import q4_0_tier_fixture
from helpers.moe_reference import ACTIVATIONS, BF16, moe_reference, one_token_on_expert_0, random_inputs

TIERS = fk.isa_tiers()
isa = q4_0_tier_fixture()
TYPES = [Q.Q8_0, Q.Q4_0, Q.BF16, Q.F16, Q.MXFP4, Q.Q4_K, Q.Q6_K, Q.Q5_K]
# Types gguf can quantize from floats; the K-quants are built byte by byte (random codes, valid scales).
QUANTIZABLE = {Q.Q8_0, Q.Q4_0, Q.BF16, Q.F16, Q.MXFP4}
# (gate_up_type, down_type) pairings of real GGUF files, cycled through the activation/batch matrix.
PAIRS = [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q8_0), (Q.MXFP4, Q.MXFP4), (Q.Q5_K, Q.Q6_K), (Q.Q4_0, Q.BF16)]
# Types whose kernels take int8 activations, per tier: VNNI in avx512_bf16, VPMADDUBSW in avx2.
INT8_TYPES = {
    "avx512_bf16": {Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K},
    "avx2": {Q.Q4_0, Q.MXFP4, Q.Q4_K, Q.Q5_K, Q.Q6_K},
}


def int8_group(qtype: Q, isa: str = "avx512_bf16") -> int:
    """Elements per x scale of the int8 path: 256 for the K-quants in both tiers (ggml's Q8_K); in
    avx512_bf16 also for Q4_0 (the last group of a vector may be shorter) and 32 for Q8_0 (ggml's Q8_0
    activations); 32 for avx2's Q4_0 and MXFP4."""
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return 256
    return 256 if isa != "avx2" and qtype == Q.Q4_0 else 32


def block_elems(qtype: Q) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def fp16_bits(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Normal (no subnormal, NaN or inf) fp16 scales in [scale/2, scale), as bytes [n, 2]."""
    return (scale * rng.uniform(0.5, 1.0, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_kquant_blocks(rng: np.random.Generator, qtype: Q, nblocks: int) -> np.ndarray:
    """Valid K-quant super-blocks: random codes and 6-bit scales/mins, fp16 d (and dmin) set."""
    size = GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin first; values d*sc*q - dmin*m with sc, m < 64
        b[:, 0:2] = fp16_bits(rng, nblocks, 2.0**-11 if qtype == Q.Q4_K else 2.0**-12)
        b[:, 2:4] = fp16_bits(rng, nblocks, 2.0**-11)
    else:  # Q6_K: d last; values d*scale*(q-32) with int8 scales
        b[:, 208:210] = fp16_bits(rng, nblocks, 2.0**-13)
    return b


def make_bank(rng: np.random.Generator, qtype: Q, rows: tuple[int, ...], K: int):
    """(bytes [*rows, row_bytes(K)] u8, dequantized float64 [*rows, K]) with weights of about 1/sqrt(K)."""
    n = int(np.prod(rows))
    if qtype in QUANTIZABLE:
        data = quantize((rng.standard_normal((n, K)) / np.sqrt(K)).astype(np.float32), qtype)
    else:
        data = random_kquant_blocks(rng, qtype, n * K // block_elems(qtype)).reshape(n, -1)
    data = np.ascontiguousarray(data).view(np.uint8).reshape(*rows, -1)
    ref = dequantize(data.reshape(n, -1), qtype).astype(np.float64).reshape(*rows, K)
    assert np.all(np.isfinite(ref))
    return data, ref


def make_layer(rng, E, H, I, gu: Q, dn: Q, bias: bool = False):
    gate, rg = make_bank(rng, gu, (E, I), H)
    up, ru = make_bank(rng, gu, (E, I), H)
    down, rd = make_bank(rng, dn, (E, H), I)
    banks = {"gate": gate, "up": up, "down": down}
    ref = {"w_gate": rg, "w_up": ru, "w_down": rd}
    if bias:
        for name, n in (("gate_bias", I), ("up_bias", I), ("down_bias", H)):
            banks[name] = (0.1 * rng.standard_normal((E, n))).astype(np.float32)
        ref.update(b_gate=banks["gate_bias"], b_up=banks["up_bias"], b_down=banks["down_bias"])
    return banks, ref, {"gate_up_type": int(gu), "down_type": int(dn)}


def shape_for(rng, gu: Q, dn: Q) -> tuple[int, int]:
    """Small H, I: odd block counts (the unpaired last block) and, for 1-element types, vector tails."""

    def pick(qtype: Q, lo: int, hi: int) -> int:
        b = block_elems(qtype)
        return b * int(rng.integers(lo, hi)) if b > 1 else int(rng.integers(33, 200))

    return pick(gu, 1, 4) if block_elems(gu) == 256 else pick(gu, 2, 7), pick(dn, 1, 4) if block_elems(
        dn
    ) == 256 else pick(dn, 2, 7)


def check(
    y: np.ndarray, ref: np.ndarray, scale: np.ndarray, what: str, extra: np.ndarray | float = 0.0
) -> None:
    # y is rounded to bf16 (relative error <= 2^-9; 2^-8 leaves a factor 2). Every tier dequantizes
    # the blocks exactly (fp16 scale times a small integer is exact in fp32; K-quants round d*sc*q -
    # dmin*m once, as gguf does, to 2^-24) and accumulates in fp32 (K * 2^-24 << 2^-11), and the
    # intermediate stays fp32: 2^-11 of the magnitude `scale` covers all of it with a wide margin.
    # `extra`: the int8-activation bound (int8_error_bound) where a VNNI path runs.
    assert_close_to_reference(y, ref, scale, what, rel=2.0**-8, mag=2.0**-11, extra=extra)


def run_case(isa, gu, dn, act, T, seed, bias=False, on_input=False, opts=None):
    rng = np.random.default_rng(seed)
    H, I = shape_for(rng, gu, dn)
    E, top_k = 5, 4
    banks, wref, options = make_layer(rng, E, H, I, gu, dn, bias)
    opts = dict(opts or ({"limit": 3.0} if act == "swiglu_clamp" else {}))
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa=isa)
    ex.add_layer(
        0,
        "gguf",
        num_experts=E,
        intermediate=I,
        banks=banks,
        activation=act,
        options={**options, **opts},
        router_weight_on_input=on_input,
    )
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale = moe_reference(x, ids, w, act=act, router_weight_on_input=on_input, **wref, **opts)
    extra = reference_extra(isa, gu, dn, x, ids, w, wref, act, on_input, opts)
    check(y, ref, scale, f"{isa} {gu.name}/{dn.name} {act} T={T} H={H} I={I}", extra)


def reference_extra(isa, gu, dn, x, ids, w, wref, act, on_input, opts):
    int8 = INT8_TYPES.get(isa, set())
    q8_in, q8_down = gu in int8, dn in int8
    if not (q8_in or q8_down):
        return 0.0
    groups = (int8_group(gu, isa), int8_group(dn, isa))
    return int8_error_bound(x, ids, w, wref, act, on_input, q8_in, q8_down, groups, **opts)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_each_type_matches_reference(isa: str, qtype: Q) -> None:
    run_case(isa, qtype, qtype, "silu", 3, [TIERS.index(isa), int(qtype)])


# silu at batch 1, 3 and 8; the other activations at batch 3.
CASES = [(act, T) for act in ACTIVATIONS for T in ([1, 3, 8] if act == "silu" else [3])]


@pytest.mark.parametrize(("act", "T"), CASES)
def test_activations_and_batches(isa: str, act: str, T: int) -> None:
    i = TIERS.index(isa) + ACTIVATIONS.index(act) + T
    gu, dn = PAIRS[i % len(PAIRS)]
    run_case(isa, gu, dn, act, T, [i, T, 17])


def test_biases_and_router_weight_on_input(isa: str) -> None:
    run_case(isa, Q.Q4_K, Q.Q6_K, "swigluoai", 3, 7, bias=True, opts={"alpha": 1.5, "limit": 2.0})
    run_case(isa, Q.Q8_0, Q.MXFP4, "silu", 3, 8, on_input=True)


def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    E, H, I, top_k, T = 8, 512, 256, 6, 8
    banks, _, options = make_layer(rng, E, H, I, Q.Q4_K, Q.Q6_K)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(
        isa, "gguf", banks, x, ids, w, num_experts=E, intermediate=I, options=options
    )


@pytest.mark.parametrize(
    ("gu", "dn"), [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q4_0), (Q.MXFP4, Q.Q5_K), (Q.BF16, Q.F16)]
)
def test_many_tokens_on_few_experts(isa: str, gu: Q, dn: Q) -> None:
    rng = np.random.default_rng(13)
    E = 2
    H, I = shape_for(rng, gu, dn)
    banks, wref, options = make_layer(rng, E, H, I, gu, dn, bias=True)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "gguf", banks, num_experts=E, hidden=H, intermediate=I, options=options
    )
    ref, scale = moe_reference(x, ids, w, act="gelu", **wref)
    extra = reference_extra(isa, gu, dn, x, ids, w, wref, "gelu", False, {})
    check(y, ref, scale, f"{isa} {gu.name}/{dn.name}", extra)


@pytest.mark.parametrize("gu", [Q.Q4_K, Q.Q6_K])
def test_kquant_rows_longer_than_the_stack_table(gu: Q) -> None:
    # The int8 K-quant calls of several vectors (avx512_bf16) gather their vectors' x scales per
    # super-block on the stack for rows of up to 64 super-blocks (K <= 16384) and on the heap beyond:
    # hidden = 65 super-blocks takes the heap for gate/up, the down rows (intermediate 256) the stack.
    # Against the int8 emulation (the sharp check, as test_int8_paths_match_an_int8_emulation: Q4_K's
    # dmin zeroed), with 8 tokens on 2 experts so that every call takes 8 vectors; a super-block
    # left out of a row is far above its tolerance (the int8 error bound of the other tests is not,
    # at this K).
    isa = "avx512_bf16"
    if isa not in TIERS:
        pytest.skip(f"no {isa} tier on this CPU")
    rng = np.random.default_rng(int(gu))
    E, H, I, top_k, T = 2, 65 * 256, 256, 2, 8
    banks, wref, options = make_layer(rng, E, H, I, gu, Q.Q6_K)
    for name, key in (("gate", "w_gate"), ("up", "w_up")):
        if gu == Q.Q4_K:
            blocks = banks[name].reshape(-1, GGML_QUANT_SIZES[gu][1])
            blocks[:, 2:4] = 0
            wref[key] = dequantize(blocks.reshape(E * I, -1), gu).reshape(E, I, H).astype(np.float64)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, num_threads=2, isa=isa)
    ex.add_layer(0, "gguf", num_experts=E, intermediate=I, banks=banks, options=options)
    x, _, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    ids = np.tile(np.arange(top_k, dtype=np.int32), (T, 1))
    ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", 256, 256)
    check(ex.run(0, x, ids, w), ref, scale, f"{gu.name} H={H}", 1.01 * flip)


@pytest.mark.parametrize(
    ("isa", "gu", "dn"),
    [
        ("avx512_bf16", Q.Q4_K, Q.Q6_K),
        ("avx512_bf16", Q.Q8_0, Q.Q4_0),
        ("avx512_bf16", Q.Q5_K, Q.Q8_0),
        ("avx512_bf16", Q.Q6_K, Q.Q4_K),
        ("avx512_bf16", Q.Q4_0, Q.Q5_K),
        ("avx2", Q.Q4_0, Q.Q4_0),
        ("avx2", Q.MXFP4, Q.MXFP4),
        ("avx2", Q.Q4_K, Q.Q6_K),
        ("avx2", Q.Q6_K, Q.Q4_K),
        ("avx2", Q.Q5_K, Q.Q6_K),
        ("avx2", Q.Q6_K, Q.Q5_K),
    ],
)
@pytest.mark.parametrize("T", [1, 4, 8])
def test_int8_paths_match_an_int8_emulation(isa: str, gu: Q, dn: Q, T: int) -> None:
    if isa not in TIERS:
        pytest.skip(f"no {isa} tier on this CPU")
    # int8_error_bound is a worst case (errors of every element aligned): ~100x the errors seen. This
    # test is the sharp one: x and h rounded to int8 in numpy exactly as specified, so only fp32
    # accumulation (2^-11 of scale), bf16 output and h elements at a rounding boundary remain. The
    # Q4_K/Q5_K min terms multiply exact sums of x (not of the int8 x), so their dmin is zeroed here;
    # the min path is checked against int8_error_bound in the other tests.
    rng = np.random.default_rng([T, int(gu), int(dn)])
    E, top_k = 4, 4
    H, I = shape_for(rng, gu, dn)
    banks, wref, options = make_layer(rng, E, H, I, gu, dn)
    for name, qtype, key in (("gate", gu, "w_gate"), ("up", gu, "w_up"), ("down", dn, "w_down")):
        if qtype in (Q.Q4_K, Q.Q5_K):
            blocks = banks[name].reshape(-1, GGML_QUANT_SIZES[qtype][1])
            blocks[:, 2:4] = 0
            wref[key] = dequantize(
                blocks.reshape(banks[name].shape[0] * banks[name].shape[1], -1), qtype
            ).reshape(wref[key].shape)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa=isa)
    ex.add_layer(0, "gguf", num_experts=E, intermediate=I, banks=banks, options=options)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    groups = int8_group(gu, isa), int8_group(dn, isa)
    ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", *groups)
    check(ex.run(0, x, ids, w), ref, scale, f"{gu.name}/{dn.name} T={T}", 1.01 * flip)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
@pytest.mark.parametrize("T", [1, 8])
def test_kquant_largest_codes_and_scales_stay_exact(isa: str, qtype: Q, T: int) -> None:
    if isa not in TIERS:
        pytest.skip(f"no {isa} tier on this CPU")
    # The K-quant kernels pack two VPDPBUSD results (4 products of a code and an int8 x each) into
    # int16 words before the sub-block scales multiply them: exact only while |4 * code * x| <= 32767.
    # The largest codes (Q4_K 15, Q5_K 31, Q6_K 63) against x = +-127 everywhere (constant inputs
    # quantize to 127 exactly) reach 7620 / 15748 / 32004; a saturating or truncating pack, or a
    # scale on the wrong words, shows far above the int8 emulation's tolerance. Scales at their
    # largest too (6-bit 63, int8 127 and -128), dmin 0 (the min terms are checked elsewhere), all
    # rows alike so that h is constant as well and the down projection meets the same extremes.
    H, I, E = 512, 256, 1
    size = GGML_QUANT_SIZES[qtype][1]
    for sign in (1.0, -1.0):
        banks = {}
        for name, K, rows in (("gate", H, I), ("up", H, I), ("down", I, H)):
            b = np.full((E * rows * K // 256, size), 0xFF, np.uint8)
            if qtype == Q.Q6_K:  # scales 127 in the first 8 sub-blocks, -128 in the rest; d
                b[:, 192:200], b[:, 200:208] = 127, 0x80
                b[:, 208:210] = np.array([2.0**-14], np.float16).view(np.uint8)
            else:  # d, dmin = 0; scales, mins and codes all ones
                b[:, 0:2] = np.array([2.0**-12], np.float16).view(np.uint8)
                b[:, 2:4] = 0
            banks[name] = b.reshape(E, rows, -1)
        wref = {
            f"w_{name}": dequantize(banks[name].reshape(E * rows, -1), qtype)
            .reshape(E, rows, K)
            .astype(np.float64)
            for name, K, rows in (("gate", H, I), ("up", H, I), ("down", I, H))
        }
        options = {"gate_up_type": int(qtype), "down_type": int(qtype)}
        ex = fk.MoeExecutor(hidden=H, top_k=1, max_tokens=8, num_threads=2, isa=isa)
        ex.add_layer(0, "gguf", num_experts=E, intermediate=I, banks=banks, options=options)
        x = np.full((T, H), sign * 0.25, BF16)
        ids = np.zeros((T, 1), np.int32)
        w = np.ones((T, 1), np.float32)
        y = ex.run(0, x, ids, w)
        ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", 256, 256)
        assert np.abs(ref).min() > 0
        check(y, ref, scale, f"{isa} {qtype.name} largest codes, x sign {sign:+.0f} T={T}", 1.01 * flip)


def test_mxfp4_extreme_e8m0_scales(isa: str) -> None:
    # ggml's MXFP4 scale is e8m0_half(e) = 2^(e - 128), e = 0 and 1 the fp32 subnormals 2^-128 and
    # 2^-127 and e = 255 the finite 2^127, not NaN (gguf.quants.dequantize agrees). Gate rows hold
    # code 7 (6) and up rows code 2 (1) in element 0 at e = 143 (2^15): h = silu(6 * 2^15) * 2^15 ~
    # 2^33 on every row, so that down rows at e = 0 and 1 (y ~ 2^-90) show above the checks' 1e-30
    # absolute slack. The down rows' first byte in each of their 4 blocks holds codes 2j % 16 and
    # (2j + 1) % 16 (elements 0 and 16): every code; 4 blocks is one step of the avx2 tier's 4-scale
    # conversion. At e = 255 only codes 0, 1, 8 and 9 (0 and +-0.5) are finite in fp32, so the down
    # rows take those, and the gate and up rows e = 80 (h ~ 2^-92, y ~ 2^36).
    H, I, E = 32, 128, 1
    x, ids, w = one_token_on_expert_0(H)
    options = {"gate_up_type": int(Q.MXFP4), "down_type": int(Q.MXFP4)}
    j = np.arange(H)
    for e in (0, 1, 2, 127, 200, 255):
        gate = np.zeros((E, I, 17), np.uint8)
        gate[..., 0], gate[..., 1] = (80 if e == 255 else 143), 0x07
        up = gate.copy()
        up[..., 1] = 0x02
        down = np.zeros((E, H, I // 32, 17), np.uint8)
        down[..., 0] = e
        codes = (2 * j) % 16, (2 * j + 1) % 16
        if e == 255:
            finite = np.array([0, 1, 8, 9])
            codes = finite[(2 * j) % 4], finite[(2 * j + 1) % 4]
        down[0, :, :, 1] = (codes[0] | (codes[1] << 4))[:, None]
        down = down.reshape(E, H, -1)
        banks = {"gate": gate, "up": up, "down": down}
        wref = {
            "w_gate": dequantize(gate.reshape(E * I, -1), Q.MXFP4).reshape(E, I, H).astype(np.float64),
            "w_up": dequantize(up.reshape(E * I, -1), Q.MXFP4).reshape(E, I, H).astype(np.float64),
            "w_down": dequantize(down.reshape(E * H, -1), Q.MXFP4).reshape(E, H, I).astype(np.float64),
        }
        ex = fk.MoeExecutor(hidden=H, top_k=1, max_tokens=1, num_threads=2, isa=isa)
        ex.add_layer(0, "gguf", num_experts=E, intermediate=I, banks=banks, options=options)
        y = ex.run(0, x, ids, w)
        ref, scale = moe_reference(x, ids, w, **wref)
        assert np.abs(ref).max() > 1e-28
        extra = reference_extra(isa, Q.MXFP4, Q.MXFP4, x, ids, w, wref, "silu", False, {})
        check(y, ref, scale, f"{isa} MXFP4 e8m0 {e}", extra)


def test_errors_name_the_bank_option_and_expected_shape() -> None:
    rng = np.random.default_rng(1)
    E, H, I = 2, 64, 32
    banks, _, options = make_layer(rng, E, H, I, Q.Q8_0, Q.Q4_0)

    def add(banks=banks, options=options, H=H, I=I):
        ex = fk.MoeExecutor(hidden=H, top_k=2, max_tokens=2)
        ex.add_layer(0, "gguf", num_experts=E, intermediate=I, banks=banks, options=options)

    add()
    # Q8_0 rows of 64 are 2 * 34 bytes; Q4_0 rows of 32 are 18 bytes.
    with pytest.raises(
        ValueError, match=r"bank 'gate' has 2176 bytes; expected 4352 bytes \(\[2, 32, 68\] u8\)"
    ):
        add(banks={**banks, "gate": banks["gate"][:1]})
    with pytest.raises(ValueError, match=r"bank 'down' has dtype float32; expected \[2, 64, 18\] u8"):
        add(banks={**banks, "down": np.zeros((E, H, 18 // 4), np.float32)})
    with pytest.raises(ValueError, match=r"missing bank 'up'; expected \[2, 32, 68\] u8"):
        add(banks={k: v for k, v in banks.items() if k != "up"})
    with pytest.raises(ValueError, match=r"bank 'gate_scale' is not used by this format"):
        add(banks={**banks, "gate_scale": banks["gate"]})
    with pytest.raises(ValueError, match=r"missing option 'down_type' \(ggml type id of down"):
        add(options={"gate_up_type": 8})
    with pytest.raises(ValueError, match=r"option 'group' is not used"):
        add(options={**options, "group": 32})
    supported = (
        r"supported: Q8_0 \(8\), Q4_0 \(2\), BF16 \(30\), F16 \(1\), MXFP4 \(39\), Q4_K \(12\), Q6_K \(14\)"
    )
    with pytest.raises(
        ValueError, match=r"option gate_up_type=3 is not a supported ggml type id; " + supported
    ):
        add(options={**options, "gate_up_type": 3})
    with pytest.raises(ValueError, match=r"option down_type=8.5 is not a supported ggml type id"):
        add(options={**options, "down_type": 8.5})
    with pytest.raises(
        ValueError, match=r"hidden=80 \(gate_up_type\) is not a multiple of 32, the block size of Q8_0"
    ):
        add(H=80)
    with pytest.raises(ValueError, match=r"intermediate=32 \(down_type\) is not a multiple of 256, .* Q6_K"):
        add(options={**options, "down_type": 14})


def test_dequantize_reference_layout_spot_check() -> None:
    # Q4_0 by hand: d = 0.5, qs[0] = 0x93 -> element 0 is (3 - 8) * 0.5, element 16 is (9 - 8) * 0.5.
    block = np.zeros(18, np.uint8)
    block[0:2] = np.array([0.5], np.float16).view(np.uint8)
    block[2] = 0x93
    v = dequantize(block, Q.Q4_0)
    assert v[0] == -2.5 and v[16] == 0.5 and v[1] == -4.0
