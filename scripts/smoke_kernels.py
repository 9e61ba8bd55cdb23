"""Smoke test of an installed ft-kernels-cpu wheel, alone: numpy and ml_dtypes only, no torch.

Builds one small bf16 MoE layer from random weights, runs the executor, and compares the result with
a float64 numpy reference computed here from the same bf16 values. `nox -s wheels` runs it in a fresh
venv holding only the ft-kernels-cpu wheel.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

import ft_kernels_cpu as fk

HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K, TOKENS = 64, 32, 4, 2, 4


def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def reference(x, w13, w2, ids, weights) -> np.ndarray:
    """y[t] = sum_r w[t,r] * W2[e] @ (silu(Wg[e] @ x[t]) * (Wu[e] @ x[t])), in float64; ids < 0 skipped."""
    x, w13, w2 = (a.astype(np.float64) for a in (x, w13, w2))
    y = np.zeros((x.shape[0], HIDDEN))
    for t in range(x.shape[0]):
        for e, w in zip(ids[t], weights[t], strict=True):
            if e < 0:
                continue
            gate, up = w13[e, :INTERMEDIATE] @ x[t], w13[e, INTERMEDIATE:] @ x[t]
            y[t] += float(w) * (w2[e] @ (silu(gate) * up))
    return y


def main() -> int:
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    w13 = (rng.standard_normal((NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN)) / np.sqrt(HIDDEN)).astype(bf16)
    w2 = (rng.standard_normal((NUM_EXPERTS, HIDDEN, INTERMEDIATE)) / np.sqrt(INTERMEDIATE)).astype(bf16)
    x = rng.standard_normal((TOKENS, HIDDEN)).astype(bf16)
    ids = np.array([[0, 3], [1, 1], [2, -1], [3, 0]], dtype=np.int32)  # a repeated expert, a skipped route
    weights = rng.uniform(0.1, 1.0, (TOKENS, TOP_K)).astype(np.float32)

    print(f"ft_kernels_cpu {fk.__version__}: formats {fk.weight_formats()}, isa {fk.isa()}")
    ex = fk.MoeExecutor(hidden=HIDDEN, top_k=TOP_K, max_tokens=TOKENS)
    ex.add_layer(0, "bf16", num_experts=NUM_EXPERTS, intermediate=INTERMEDIATE, activation="silu",
                 banks={"w13": w13, "w2": w2})  # fmt: skip
    y = ex.run(0, x, ids, weights)

    assert y.shape == (TOKENS, HIDDEN) and y.dtype == bf16, f"got {y.shape} {y.dtype}"
    ref = reference(x, w13, w2, ids, weights)
    err = np.abs(y.astype(np.float64) - ref).max()
    scale = np.abs(ref).max()
    print(f"max |y - ref| = {err:.3e}, max |ref| = {scale:.3e}")
    # bf16 output (8-bit mantissa) plus a bf16-rounded activation between the two passes.
    assert err <= 2e-2 * scale, f"executor output differs from the float64 reference: {err:.3e}"
    assert "torch" not in sys.modules, "ft_kernels_cpu imported torch"
    print("smoke_kernels: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
