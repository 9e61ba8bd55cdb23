"""mxfp4 banks (gpt-oss layout): w13 [E, 2I, H/32, 16] u8 + w13_scale [E, 2I, H/32] e8m0 + w13_bias
[E, 2I] bf16; w2 [E, H, I/32, 16] u8 + w2_scale [E, H, I/32] e8m0 + w2_bias [E, H] bf16."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.bench_formats import random_bf16_bits
from ft_kernels_cpu.shapes import MoeShape


def expert_bytes(shape: MoeShape) -> int:
    H, I = shape.hidden, shape.intermediate
    # Nibbles (half a byte per weight), one scale byte per 32 weights, bf16 biases.
    return 3 * H * I // 2 + 3 * H * I // 32 + (2 * I + H) * 2


def random_e8m0(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Valid, normal e8m0 scales: 2^(s - 127) with s in [124, 130]."""
    return rng.integers(124, 131, size=shape, dtype=np.uint8)


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate
    return {
        "w13": rng.integers(0, 256, size=(experts, 2 * I, H // 32, 16), dtype=np.uint8),
        "w13_scale": random_e8m0(rng, (experts, 2 * I, H // 32)),
        "w13_bias": random_bf16_bits(rng, (experts, 2 * I)),
        "w2": rng.integers(0, 256, size=(experts, H, I // 32, 16), dtype=np.uint8),
        "w2_scale": random_e8m0(rng, (experts, H, I // 32)),
        "w2_bias": random_bf16_bits(rng, (experts, H)),
    }
