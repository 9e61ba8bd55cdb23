"""ds_fp4 banks: w13 [E, 2I, H/2] u8 + w13_scale [E, 2I, H/32] e8m0; w2 [E, H, I/2] u8 + w2_scale
[E, H, I/32] e8m0; activations round-tripped through fp8 e4m3 in blocks of 128."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.bench_formats.mxfp4 import random_e8m0
from ft_kernels_cpu.shapes import MoeShape

OPTIONS = {"act_block": 128.0}


def expert_bytes(shape: MoeShape) -> int:
    H, I = shape.hidden, shape.intermediate
    return 3 * H * I // 2 + 3 * H * I // 32


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate
    return {
        "w13": rng.integers(0, 256, size=(experts, 2 * I, H // 2), dtype=np.uint8),
        "w13_scale": random_e8m0(rng, (experts, 2 * I, H // 32)),
        "w2": rng.integers(0, 256, size=(experts, H, I // 2), dtype=np.uint8),
        "w2_scale": random_e8m0(rng, (experts, H, I // 32)),
    }
