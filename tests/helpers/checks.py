"""Checks and test bodies every weight format's executor tests share.

The tolerances stay with each format's test file, next to the reasoning that justifies them: the
functions here take them as arguments and only evaluate and assert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.moe_reference import BF16, random_inputs

# Thread counts the bit-exactness test compares: one, the usual two, and counts that split the
# work unevenly.
THREAD_COUNTS = (1, 2, 3, 5)


def assert_close(y: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> np.ndarray:
    """|y - ref| <= bound everywhere; the message names the worst element relative to its bound.

    Returns |y - ref| for further checks.
    """
    err = np.abs(y.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (
        f"{what}: error {err[worst]:.3g} at {worst} exceeds bound {bound[worst]:.3g} (ref {ref[worst]:.4g})"
    )
    return err


def assert_close_to_reference(
    y: np.ndarray,
    ref: np.ndarray,
    scale: np.ndarray,
    what: str,
    *,
    rel: float,
    mag: float,
    extra: np.ndarray | float = 0.0,
) -> np.ndarray:
    """assert_close with the bound rel * |ref| + mag * scale + extra (+ 1e-30, so that exact zeros pass).

    `scale` is the magnitude moe_reference returns (sum of |terms| of y); `extra` a format's own
    per-element bound (int8 activations, rounding-boundary slack). Returns |y - ref|.
    """
    return assert_close(y, ref, rel * np.abs(ref) + mag * scale + extra + 1e-30, what)


def assert_bits_do_not_depend_on_thread_count(
    isa: str,
    weight_format: str,
    banks: dict[str, np.ndarray],
    x: np.ndarray,
    ids: np.ndarray,
    w: np.ndarray,
    *,
    num_experts: int,
    intermediate: int,
    **layer_kw: Any,
) -> None:
    """The layer run with each of THREAD_COUNTS threads gives the same bf16 bits.

    layer_kw: add_layer's other keyword arguments (options, activation, ...).
    """
    T, H = x.shape
    outs = []
    for threads in THREAD_COUNTS:
        ex = fk.MoeExecutor(hidden=H, top_k=ids.shape[1], max_tokens=T, num_threads=threads, isa=isa)
        assert ex.num_threads == threads
        ex.add_layer(
            0, weight_format, num_experts=num_experts, intermediate=intermediate, banks=banks, **layer_kw
        )
        outs.append(ex.run(0, x, ids, w).view(np.uint16).copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def run_many_tokens_on_few_experts(
    rng: np.random.Generator,
    isa: str,
    weight_format: str,
    banks: dict[str, np.ndarray],
    *,
    num_experts: int,
    hidden: int,
    intermediate: int,
    top_k: int = 6,
    T: int = 8,
    **layer_kw: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """8 tokens x 6 routes on (few) experts with gelu, one route skipped: the batched kernels take
    chunks of up to 8 routes per expert, the last chunk shorter. Returns (x, ids, w, y); the caller
    checks y against its format's reference and tolerance.
    """
    ex = fk.MoeExecutor(hidden=hidden, top_k=top_k, max_tokens=T, num_threads=2, isa=isa)
    ex.add_layer(
        0,
        weight_format,
        num_experts=num_experts,
        intermediate=intermediate,
        banks=banks,
        activation="gelu",
        **layer_kw,
    )
    x = rng.standard_normal((T, hidden)).astype(BF16)
    ids = rng.integers(0, num_experts, (T, top_k)).astype(np.int32)
    ids[2, 3] = -1
    w = rng.random((T, top_k)).astype(np.float32)
    return x, ids, w, ex.run(0, x, ids, w)


def assert_add_layer_refused(
    change: Callable[[dict[str, Any], dict[str, Any]], Any],
    match: str,
    banks: dict[str, Any],
    *,
    hidden: int,
    num_experts: int,
    top_k: int = 2,
    errors: type[Exception] | tuple[type[Exception], ...] = ValueError,
    **layer_kw: Any,
) -> None:
    """change(banks, layer_kw) breaks a bank or an argument of add_layer; add_layer must then raise
    `errors` with a message matching `match` and keep no layer.

    layer_kw: add_layer's arguments after the layer id (weight_format, intermediate, options, ...),
    as change may alter them.
    """
    ex = fk.MoeExecutor(hidden=hidden, top_k=top_k, max_tokens=4)
    change(banks, layer_kw)
    with pytest.raises(errors, match=match):
        ex.add_layer(0, num_experts=num_experts, banks=banks, **layer_kw)
    assert ex.layers == []


def run_swigluoai_options(
    rng: np.random.Generator,
    isa: str,
    weight_format: str,
    banks: dict[str, np.ndarray],
    options: dict[str, float],
    *,
    num_experts: int,
    hidden: int,
    intermediate: int,
    top_k: int = 4,
    T: int = 3,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layer 3 with swigluoai and `options` (alpha, limit, the format's own), x = 3 N(0, 1) so that the
    limit clamps. Returns (x, ids, w, y); the caller checks y against its reference and tolerance."""
    ex = fk.MoeExecutor(hidden=hidden, top_k=top_k, max_tokens=4, num_threads=2, isa=isa)
    ex.add_layer(
        3,
        weight_format,
        num_experts=num_experts,
        intermediate=intermediate,
        banks=banks,
        activation="swigluoai",
        options=options,
    )
    x, ids, w = random_inputs(rng, T, hidden, top_k, num_experts, x_scale=3.0)
    return x, ids, w, ex.run(3, x, ids, w)


def run_router_weight_on_input(
    rng: np.random.Generator,
    isa: str,
    weight_format: str,
    banks: dict[str, np.ndarray],
    *,
    num_experts: int,
    hidden: int,
    intermediate: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """router_weight_on_input=True on one thread, 3 tokens of 2 routes over 3 experts (a route repeated,
    one skipped), router weights in [0.5, 1.5). Returns (x, ids, w, y)."""
    ids = np.array([[0, 2], [1, -1], [2, 2]], dtype=np.int32)
    T, top_k = ids.shape
    ex = fk.MoeExecutor(hidden=hidden, top_k=top_k, max_tokens=4, num_threads=1, isa=isa)
    ex.add_layer(
        0,
        weight_format,
        num_experts=num_experts,
        intermediate=intermediate,
        banks=banks,
        router_weight_on_input=True,
    )
    x = rng.standard_normal((T, hidden)).astype(BF16)
    w = (0.5 + rng.random((T, top_k))).astype(np.float32)
    return x, ids, w, ex.run(0, x, ids, w)


def random_bf16_executor(
    H: int, I: int, E: int, top_k: int, max_tokens: int, seed: int = 0, **kw: Any
) -> fk.MoeExecutor:
    """An executor with one bf16 layer 0 of E experts of random N(0, 1) weights (kw: MoeExecutor's)."""
    rng = np.random.default_rng(seed)
    ex = fk.MoeExecutor(hidden=H, top_k=top_k, max_tokens=max_tokens, **kw)
    ex.add_layer(
        0,
        "bf16",
        num_experts=E,
        intermediate=I,
        banks={
            "w13": rng.standard_normal((E, 2 * I, H)).astype(BF16),
            "w2": rng.standard_normal((E, H, I)).astype(BF16),
        },
    )
    return ex
