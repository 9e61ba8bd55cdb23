"""q4_0 executor (ggml Q4_0 blocks) against gguf.quants.dequantize + the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

# The reference dequantizers: nox -s tests installs gguf; a bare GPU machine may not have it.
pytest.importorskip("gguf", reason="the gguf package (reference dequantizers) is not installed")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
)
from helpers.int8_bounds import int8_emulated_reference, int8_error_bound
from helpers.kernel_variants import q4_0_tier_fixture
from helpers.moe_reference import ACTIVATIONS, BF16, moe_reference, random_inputs

TIERS = fk.isa_tiers()
isa = q4_0_tier_fixture()
# silu at batch 1, 3 and 8; the other activations at batch 3.
CASES = [(act, T) for act in ACTIVATIONS for T in ([1, 3, 8] if act == "silu" else [3])]


def q4_0_bank(rng: np.random.Generator, rows: tuple[int, ...], K: int):
    """(Q4_0 bytes [*rows, K/32*18] u8 quantized by gguf, their gguf dequantization as float64)."""
    n = int(np.prod(rows))
    data = quantize((rng.standard_normal((n, K)) / np.sqrt(K)).astype(np.float32), Q.Q4_0)
    ref = dequantize(data, Q.Q4_0).astype(np.float64)
    return data.reshape(*rows, K // 32 * 18), ref.reshape(*rows, K)


def make_layer(rng, E, H, I, bias=False):
    w13, r13 = q4_0_bank(rng, (E, 2 * I), H)
    w2, r2 = q4_0_bank(rng, (E, H), I)
    banks = {"w13": w13, "w2": w2}
    ref = {"w_gate": r13[:, :I], "w_up": r13[:, I:], "w_down": r2}
    if bias:
        banks["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(np.float32)
        banks["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
        ref.update(b_gate=banks["w13_bias"][:, :I], b_up=banks["w13_bias"][:, I:], b_down=banks["w2_bias"])
    return banks, ref


def check(
    y: np.ndarray, ref: np.ndarray, scale: np.ndarray, what: str, extra: np.ndarray | float = 0.0
) -> None:
    # y is rounded to bf16 (relative error <= 2^-9; 2^-8 leaves a factor 2). Every tier dequantizes
    # exactly (fp16 d times an integer in [-8, 7] is exact in fp32), accumulates in fp32
    # (K * 2^-24 << 2^-11) and keeps the intermediate in fp32: 2^-11 of `scale` bounds the rest.
    # `extra`: in the avx512_bf16 and avx2 tiers x and h are int8 (VNNI, VPMADDUBSW): int8_error_bound.
    assert_close_to_reference(y, ref, scale, what, rel=2.0**-8, mag=2.0**-11, extra=extra)


def run_case(isa, act, T, seed, bias=False, on_input=False, opts=None, HI=None):
    rng = np.random.default_rng(seed)
    # Odd block counts exercise the unpaired last block of a row.
    E, H, I, top_k = 5, 32 * int(rng.integers(1, 8)), 32 * int(rng.integers(1, 6)), 4
    if HI is not None:
        H, I = HI
    banks, wref = make_layer(rng, E, H, I, bias)
    opts = dict(opts or ({"limit": 3.0} if act == "swiglu_clamp" else {}))
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa=isa)
    ex.add_layer(
        0, "q4_0", num_experts=E, intermediate=I, banks=banks, activation=act, options=opts,
        router_weight_on_input=on_input,
    )  # fmt: skip
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale = moe_reference(x, ids, w, act=act, router_weight_on_input=on_input, **wref, **opts)
    extra = reference_extra(isa, x, ids, w, wref, act, on_input, opts)
    check(y, ref, scale, f"{isa} {act} T={T} H={H} I={I}", extra)


# Elements per int8 scale of x and h in the tiers that take int8 activations: VNNI groups of 256 in
# the avx512_bf16 tier, blocks of 32 (as ggml's Q8_0) in the avx2 tier.
INT8_GROUPS = {"avx512_bf16": 256, "avx2": 32}


def reference_extra(isa, x, ids, w, wref, act, on_input, opts):
    if isa not in INT8_GROUPS:
        return 0.0
    # x and h in int8 groups (one scale per group; the last group of a vector may be shorter)
    g = INT8_GROUPS[isa]
    return int8_error_bound(x, ids, w, wref, act, on_input, True, True, (g, g), **opts)


@pytest.mark.parametrize(("act", "T"), CASES)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    run_case(isa, act, T, [TIERS.index(isa), ACTIVATIONS.index(act), T])


@pytest.mark.parametrize("T", [1, 8])
def test_rows_of_several_groups(isa: str, T: int) -> None:
    # Whole groups of 8 blocks (256 elements, the int8 path's unit) and a partial last one, in both
    # passes: H = 2 * 256 + 32, I = 3 * 256 + 32 (pass-1 units of 256 rows, a shorter last one).
    run_case(isa, "silu", T, 21 + T, HI=(544, 800))


def test_biases_options_and_router_weight_on_input(isa: str) -> None:
    run_case(isa, "swigluoai", 3, 7, bias=True, opts={"alpha": 1.5, "limit": 2.0})
    run_case(isa, "silu", 3, 8, on_input=True)


def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    E, H, I, top_k, T = 8, 320, 224, 6, 8
    banks, _ = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(isa, "q4_0", banks, x, ids, w, num_experts=E, intermediate=I)


@pytest.mark.parametrize("H", [160, 1504])
def test_many_tokens_on_few_experts(isa: str, H: int) -> None:
    # H = 1504 (47 blocks): calls of 8 vectors over rows of 11 groups of 4 blocks and a 3-block tail,
    # whose records (8 x 3 KiB in the avx2 tier) outgrow half of an L1.
    rng = np.random.default_rng(13)
    E, H, I = 2, H, 96
    banks, wref = make_layer(rng, E, H, I, bias=True)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "q4_0", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = moe_reference(x, ids, w, act="gelu", **wref)
    extra = reference_extra(isa, x, ids, w, wref, "gelu", False, {})
    check(y, ref, scale, isa, extra)


@pytest.mark.skipif("avx2" not in TIERS, reason="no avx2 tier here")
@pytest.mark.parametrize("T", [4, 8])
@pytest.mark.parametrize("H", [160, 1504])
def test_avx2_int8_path_matches_an_int8_emulation(H: int, T: int) -> None:
    # The sharp check (int8_error_bound is a worst case): x and h rounded per 32 in numpy exactly as
    # specified, so only fp32 accumulation, the bf16 output and h elements at a rounding boundary
    # remain. T tokens on all 4 experts: calls of T vectors (4 and 8: avx2_pairs.h's rows_by4, one
    # and two groups of four); H = 1504 (47 blocks): rows of 11 groups of 4 blocks and a 3-block tail
    # (a whole pair, then a half one).
    rng = np.random.default_rng([H, T])
    E, I, top_k = 4, 96, 4
    banks, wref = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, num_threads=2, isa="avx2")
    ex.add_layer(0, "q4_0", num_experts=E, intermediate=I, banks=banks)
    ref, scale, flip = int8_emulated_reference(x, ids, w, wref, "silu", 32, 32)
    check(ex.run(0, x, ids, w), ref, scale, f"avx2 int8 emulation H={H}", 1.01 * flip)


def cpu_is_intel() -> bool:
    with open("/proc/cpuinfo") as f:
        vendors = {line.split(":")[-1].strip() for line in f if line.startswith("vendor_id")}
    return vendors == {"GenuineIntel"}


@pytest.mark.skipif("avx512_bf16" not in TIERS, reason="no avx512_bf16 tier here")
def test_gather_choices_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # FT_CPU_MOE_Q4_0_GATHER only changes the instructions that gather a group's codes and scales, so
    # every kernel (one vector: gate and up side by side, 4 rows side by side; several: 2 rows side by
    # side, one row) gives the same bits either way, whole groups and a partial last one alike.
    rng = np.random.default_rng(5)
    E, H, I, top_k = 4, 544, 800, 4
    banks, _ = make_layer(rng, E, H, I)
    for multirow in ("", "0"):
        monkeypatch.setenv("FT_CPU_MOE_MULTIROW_BYTES", multirow)
        for T in (1, 3, 8):
            x, ids, w = random_inputs(rng, T, H, top_k, E)
            ys = {}
            for gather in ("dwords", "words"):
                monkeypatch.setenv("FT_CPU_MOE_Q4_0_GATHER", gather)
                ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, num_threads=2, isa="avx512_bf16")
                ex.add_layer(0, "q4_0", num_experts=E, intermediate=I, banks=banks)
                assert ex.layer_kernels(0) == gather
                ys[gather] = ex.run(0, x, ids, w)
            assert np.array_equal(ys["dwords"].view(np.uint16), ys["words"].view(np.uint16)), (multirow, T)


def test_gather_choice_default_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    E, H, I = 2, 64, 32
    banks, _ = make_layer(rng, E, H, I)

    def kernels(tier: str, gather: str) -> str | None:
        monkeypatch.setenv("FT_CPU_MOE_Q4_0_GATHER", gather)
        ex = fk.MoeExecutor(hidden=H, top_k=2, max_tokens=2, isa=tier)
        ex.add_layer(0, "q4_0", num_experts=E, intermediate=I, banks=banks)
        return ex.layer_kernels(0)

    # The choice exists in the avx512_bf16 tier only; auto: dwords on Intel, words elsewhere.
    for tier in TIERS:
        want = ("dwords" if cpu_is_intel() else "words") if tier == "avx512_bf16" else None
        assert kernels(tier, "") == want == kernels(tier, "auto")
    var = "FT_CPU_MOE_Q4_0_GATHER"
    with pytest.raises(fk.KernelError, match=rf"{var}='bytes' is unknown; expected auto, dwords or words"):
        kernels("scalar", "bytes")
    for gather in ("dwords", "words"):
        message = rf"{var}='{gather}' needs the avx512_bf16 tier; this layer runs tier 'scalar'"
        with pytest.raises(fk.KernelError, match=message):
            kernels("scalar", gather)


def test_errors_name_the_bank_and_expected_shape() -> None:
    rng = np.random.default_rng(1)
    E, H, I = 2, 64, 32
    banks, _ = make_layer(rng, E, H, I)

    def add(banks=banks, H=H, I=I, options=None):
        ex = fk.MoeExecutor(hidden=H, top_k=2, max_tokens=2)
        ex.add_layer(0, "q4_0", num_experts=E, intermediate=I, banks=banks, options=options)

    add()
    with pytest.raises(
        ValueError, match=r"bank 'w13' has 2304 bytes; expected 4608 bytes \(\[2, 64, 36\] u8\)"
    ):
        add(banks={**banks, "w13": banks["w13"][:1]})
    with pytest.raises(ValueError, match=r"bank 'w2' has dtype float16; expected \[2, 64, 18\] u8"):
        add(banks={**banks, "w2": banks["w2"].view(np.float16)})
    with pytest.raises(ValueError, match=r"missing bank 'w2'; expected \[2, 64, 18\] u8"):
        add(banks={"w13": banks["w13"]})
    with pytest.raises(
        ValueError, match=r"bank 'w13_bias' has 256 bytes; expected 512 bytes \(\[2, 64\] f32\)"
    ):
        add(banks={**banks, "w13_bias": np.zeros((E, I), np.float32)})
    with pytest.raises(ValueError, match=r"option 'group' is not used"):
        add(options={"group": 32})
    with pytest.raises(ValueError, match=r"hidden=80 is not a multiple of 32, the block size of Q4_0"):
        add(H=80)
    with pytest.raises(ValueError, match=r"intermediate=48 is not a multiple of 32, the block size of Q4_0"):
        add(I=48)
