"""bf16 banks: w13 [E, 2I, H], w2 [E, H, I]."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.bench_formats import random_bf16_bits
from ft_kernels_cpu.shapes import MoeShape


def expert_bytes(shape: MoeShape) -> int:
    return 3 * shape.hidden * shape.intermediate * 2


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate
    return {"w13": random_bf16_bits(rng, (experts, 2 * I, H)), "w2": random_bf16_bits(rng, (experts, H, I))}
