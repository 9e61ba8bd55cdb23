"""bf16 executor against the float64 reference, on every ISA tier and activation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import (
    assert_bits_do_not_depend_on_thread_count,
    assert_close_to_reference,
    run_many_tokens_on_few_experts,
    run_router_weight_on_input,
    run_swigluoai_options,
)
from helpers.moe_reference import ACTIVATIONS, BF16, bias_terms, moe_reference, random_inputs, random_routes

TIERS = fk.isa_tiers()


def make_layer(rng: np.random.Generator, E: int, H: int, I: int, bias: bool = False):
    w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(BF16)
    w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(BF16)
    banks = {"w13": w13, "w2": w2}
    if bias:
        banks["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(np.float32)
        banks["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    return banks


def reference(banks, x, ids, w, I, act, on_input=False, **opts):
    w13 = banks["w13"].astype(np.float64)
    return moe_reference(
        x,
        ids,
        w,
        w13[:, :I],
        w13[:, I:],
        banks["w2"],
        act,
        **bias_terms(banks, slice(None, I), slice(I, None)),
        router_weight_on_input=on_input,
        **opts,
    )


def check(y: np.ndarray, ref: np.ndarray, scale: np.ndarray, isa: str) -> None:
    # y is rounded to bf16 (relative error <= 2^-9; 2^-8 leaves a factor 2). The avx512_bf16 tier also
    # rounds the intermediate to bf16 before the down projection: each term is off by <= 2^-9
    # relative, so the sum by <= 2^-9 * scale. fp32 tiers accumulate in fp32 (K * 2^-24 << 2^-11).
    c = 2.0**-8 if isa == "avx512_bf16" else 2.0**-11
    assert_close_to_reference(y, ref, scale, isa, rel=2.0**-8, mag=c)


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("isa", TIERS)
def test_matches_float64_reference(isa: str, act: str, T: int) -> None:
    rng = np.random.default_rng([TIERS.index(isa), ACTIVATIONS.index(act), T])
    # Odd sizes exercise every vector tail; E small so that routes collide across tokens.
    E, H, I, top_k = 5, int(rng.integers(40, 200)), int(rng.integers(17, 90)), 4
    banks = make_layer(rng, E, H, I)
    opts = {"limit": 3.0} if act == "swiglu_clamp" else {}
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa=isa)
    ex.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=banks, activation=act, options=opts)
    x, ids, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    y = ex.run(0, x, ids, w)
    assert y.dtype == BF16 and y.shape == (T, H)
    ref, scale = reference(banks, x, ids, w, I, act, **opts)
    check(y, ref, scale, isa)


@pytest.mark.parametrize("T", [3, 8])
@pytest.mark.parametrize("isa", TIERS)
def test_long_rows_against_many_vectors(isa: str, T: int) -> None:
    # Rows longer than a 32 KiB L1d holds for T vectors of x (T * H * 4 bytes): the avx2 tier takes
    # them two rows at a time (and 8 vectors as two sets); H % 8 = 4 leaves a tail in every row. Two
    # experts and top_k = 2: every call has all T tokens.
    rng = np.random.default_rng([TIERS.index(isa), T, 2900])
    E, H, I, top_k = 2, 2900, 48, 2
    banks = make_layer(rng, E, H, I)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=8, num_threads=2, isa=isa)
    ex.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=banks, activation="silu")
    x, _, w = random_inputs(rng, T, H, top_k, E, x_scale=2.0)
    ids = np.tile(np.arange(top_k, dtype=np.int32), (T, 1))
    ref, scale = reference(banks, x, ids, w, I, "silu")
    check(ex.run(0, x, ids, w), ref, scale, isa)


@pytest.mark.parametrize("isa", TIERS)
def test_biases_and_swigluoai_options(isa: str) -> None:
    rng = np.random.default_rng(7)
    E, H, I = 4, 96, 48
    banks = make_layer(rng, E, H, I, bias=True)
    opts = {"alpha": 1.5, "limit": 2.0}
    x, ids, w, y = run_swigluoai_options(
        rng, isa, "bf16", banks, opts, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, "swigluoai", **opts)
    check(y, ref, scale, isa)


@pytest.mark.parametrize("isa", TIERS)
def test_router_weight_on_input(isa: str) -> None:
    rng = np.random.default_rng(11)
    E, H, I = 3, 64, 32
    banks = make_layer(rng, E, H, I)
    x, ids, w, y = run_router_weight_on_input(
        rng, isa, "bf16", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, "silu", on_input=True)
    check(y, ref, scale, isa)
    # silu is not linear: weighting the input must differ from weighting the output.
    ref_out, _ = reference(banks, x, ids, w, I, "silu", on_input=False)
    assert np.abs(ref - ref_out).max() > 1e-2


@pytest.mark.parametrize("isa", TIERS)
def test_bits_do_not_depend_on_thread_count(isa: str) -> None:
    rng = np.random.default_rng(3)
    E, H, I, top_k, T = 8, 300, 200, 6, 8
    banks = make_layer(rng, E, H, I)
    x, ids, w = random_inputs(rng, T, H, top_k, E)
    assert_bits_do_not_depend_on_thread_count(isa, "bf16", banks, x, ids, w, num_experts=E, intermediate=I)


def test_layers_with_different_shapes_and_activations() -> None:
    rng = np.random.default_rng(5)
    H, top_k, T = 128, 3, 4
    specs = {0: (4, 64, "silu"), 7: (6, 40, "gelu_tanh"), 9: (3, 96, "gelu")}
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T, num_threads=2)
    layers = {}
    for layer, (E, I, act) in specs.items():
        layers[layer] = make_layer(rng, E, H, I)
        ex.add_layer(layer, "bf16", num_experts=E, intermediate=I, banks=layers[layer], activation=act)
    assert ex.layers == [0, 7, 9]
    x = rng.standard_normal((T, H)).astype(BF16)
    w = rng.random((T, top_k)).astype(np.float32)
    for layer in (9, 0, 7, 0):
        E, I, act = specs[layer]
        ids = random_routes(rng, T, top_k, E)
        ref, scale = reference(layers[layer], x, ids, w, I, act)
        check(ex.run(layer, x, ids, w), ref, scale, ex.isa)


def test_skipped_routes_and_empty_tasks_give_zeros() -> None:
    rng = np.random.default_rng(9)
    E, H, I, top_k = 4, 64, 32, 2
    banks = make_layer(rng, E, H, I)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=4, num_threads=2)
    ex.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=banks)
    x = rng.standard_normal((3, H)).astype(BF16)
    w = np.ones((3, top_k), np.float32)
    out = np.full((3, H), 7, dtype=BF16)  # stale values must be overwritten
    ids = np.full((3, top_k), -1, np.int32)
    np.testing.assert_array_equal(ex.run(0, x, ids, w, out=out).astype(np.float32), 0.0)
    ids[1] = [2, -5]
    y = ex.run(0, x, ids, w).astype(np.float64)
    assert np.all(y[0] == 0) and np.all(y[2] == 0) and np.abs(y[1]).max() > 0
    ref, scale = reference(banks, x, ids, w, I, "silu")
    check(y, ref, scale, ex.isa)
    # Zero tokens is a valid (empty) task.
    assert ex.run(0, x[:0], ids[:0], w[:0]).shape == (0, H)


def test_uint16_bit_views_are_accepted() -> None:
    rng = np.random.default_rng(2)
    E, H, I, top_k, T = 3, 64, 32, 2, 2
    banks = make_layer(rng, E, H, I)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=T)
    ex.add_layer(
        0, "bf16", num_experts=E, intermediate=I, banks={k: v.view(np.uint16) for k, v in banks.items()}
    )
    x = rng.standard_normal((T, H)).astype(BF16)
    ids = np.array([[0, 1], [2, 0]], np.int32)
    w = np.full((T, top_k), 0.5, np.float32)
    y16 = ex.run(0, x.view(np.uint16), ids, w)
    assert y16.dtype == np.uint16
    np.testing.assert_array_equal(y16, ex.run(0, x, ids, w).view(np.uint16))


def test_read_bandwidth_is_measured() -> None:
    ex = fk.MoeExecutor(hidden=16, top_k=1, max_tokens=1, num_threads=1)
    gbs = ex.read_bandwidth_gbs(16 << 20, passes=1)
    assert 0.1 < gbs < 10_000


def test_isa_reporting() -> None:
    assert fk.isa() in fk.isa_tiers()
    assert fk.isa_tiers()[0] == "scalar"
    assert "bf16" in fk.weight_formats() and fk.weight_formats() == sorted(fk.weight_formats())
    assert ml_dtypes.bfloat16 is BF16


@pytest.mark.parametrize("isa", TIERS)
def test_many_tokens_on_few_experts(isa: str) -> None:
    rng = np.random.default_rng(13)
    E, H, I = 2, 136, 72
    banks = make_layer(rng, E, H, I, bias=True)
    x, ids, w, y = run_many_tokens_on_few_experts(
        rng, isa, "bf16", banks, num_experts=E, hidden=H, intermediate=I
    )
    ref, scale = reference(banks, x, ids, w, I, "gelu")
    check(y, ref, scale, isa)
