"""Float64 numpy reference of a routed MoE layer, written from the model definitions, not from ft's code."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
_erf = np.vectorize(math.erf, otypes=[np.float64])
# Every activation `activation` (and the executor) knows.
ACTIVATIONS = ["silu", "gelu", "gelu_tanh", "swigluoai", "swiglu_clamp"]


def activation(
    name: str, g: np.ndarray, u: np.ndarray, alpha: float = 1.702, limit: float = 7.0
) -> np.ndarray:
    if name == "silu":
        return g / (1.0 + np.exp(-g)) * u
    if name == "gelu":
        return 0.5 * g * (1.0 + _erf(g / math.sqrt(2.0))) * u
    if name == "gelu_tanh":
        return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3))) * u
    if name == "swigluoai":
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        return (u + 1.0) * g / (1.0 + np.exp(-alpha * g))
    if name == "swiglu_clamp":
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        return g / (1.0 + np.exp(-g)) * u
    raise ValueError(name)


def moe_reference(
    x: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    w_gate: np.ndarray,
    w_up: np.ndarray,
    w_down: np.ndarray,
    act: str = "silu",
    b_gate: np.ndarray | None = None,
    b_up: np.ndarray | None = None,
    b_down: np.ndarray | None = None,
    router_weight_on_input: bool = False,
    **act_options: float,
) -> tuple[np.ndarray, np.ndarray]:
    """y[t] = sum_r w[t,r] * (W_down[e] @ act(W_gate[e] @ x_t + b_gate, W_up[e] @ x_t + b_up) + b_down).

    All weights are float arrays of the dequantized values: w_gate/w_up [E, I, H], w_down [E, H, I].
    With router_weight_on_input the input of each route is w * x and the output is not weighted.
    Returns (y, scale): scale[t, j] = sum_r |w| * (|W_down[e, j]| @ |h_r|), the magnitude the
    rounding errors of the intermediate scale with.
    """
    x = x.astype(np.float64)
    T, H = x.shape
    y = np.zeros((T, H))
    scale = np.zeros((T, H))
    for t in range(T):
        for r in range(ids.shape[1]):
            e = int(ids[t, r])
            if e < 0:
                continue
            w = float(weights[t, r])
            xin = w * x[t] if router_weight_on_input else x[t]
            g = w_gate[e].astype(np.float64) @ xin
            u = w_up[e].astype(np.float64) @ xin
            if b_gate is not None:
                g = g + b_gate[e]
                u = u + b_up[e]
            h = activation(act, g, u, **act_options)
            wd = w_down[e].astype(np.float64)
            out = wd @ h + (b_down[e] if b_down is not None else 0.0)
            wout = 1.0 if router_weight_on_input else w
            y[t] += wout * out
            scale[t] += abs(wout) * (np.abs(wd) @ np.abs(h))
    return y, scale


def random_routes(rng: np.random.Generator, T: int, top_k: int, num_experts: int) -> np.ndarray:
    """Expert ids with duplicates inside a token and about one skipped (-1) route in five."""
    ids = rng.integers(0, num_experts, size=(T, top_k)).astype(np.int32)
    if top_k > 1:
        ids[:, 1] = ids[:, 0]  # a duplicate in every token
    ids[rng.random((T, top_k)) < 0.2] = -1
    return ids


def one_token_on_expert_0(H: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, ids, w of one token of ones (bf16) routed to expert 0 alone with weight 1."""
    return np.ones((1, H), BF16), np.zeros((1, 1), np.int32), np.ones((1, 1), np.float32)


def random_inputs(
    rng: np.random.Generator, T: int, H: int, top_k: int, num_experts: int, x_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, ids, w) of one task: x = x_scale * N(0, 1) as bf16 [T, H], ids from random_routes, router
    weights uniform in [0, 1) as float32 [T, top_k]; drawn from rng in that order."""
    x = (x_scale * rng.standard_normal((T, H))).astype(BF16)
    ids = random_routes(rng, T, top_k, num_experts)
    w = rng.random((T, top_k)).astype(np.float32)
    return x, ids, w


def bias_terms(
    banks: dict[str, np.ndarray], gate_rows: slice, up_rows: slice
) -> dict[str, np.ndarray | None]:
    """moe_reference's b_gate, b_up (rows gate_rows, up_rows of the bank w13_bias) and b_down (w2_bias)
    as float64, each None where its bank is absent."""
    b13, b2 = banks.get("w13_bias"), banks.get("w2_bias")
    return {
        "b_gate": None if b13 is None else b13[:, gate_rows].astype(np.float64),
        "b_up": None if b13 is None else b13[:, up_rows].astype(np.float64),
        "b_down": None if b2 is None else b2.astype(np.float64),
    }
