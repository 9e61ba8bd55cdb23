"""nvfp4 banks: e2m1 pairs w13 [E, 2I, H/2], w2 [E, H, I/2], e4m3 scales per 16, f32 scale per row."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.shapes import MoeShape


def expert_bytes(shape: MoeShape) -> int:
    H, I = shape.hidden, shape.intermediate
    return 3 * H * I // 2 + 3 * H * I // 16 + 4 * (2 * I + H)


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate

    def scales(rows: int, cols: int) -> np.ndarray:
        # Positive normal e4m3fn codes 0x30..0x47 (0.5 .. 3.75): no zero, subnormal or NaN.
        return rng.integers(0x30, 0x48, size=(experts, rows, cols), dtype=np.uint8)

    def global_scale(rows: int) -> np.ndarray:
        return (2.0**-10 * (1.0 + rng.random((experts, rows), dtype=np.float32))).astype(np.float32)

    return {
        "w13": rng.integers(0, 256, size=(experts, 2 * I, H // 2), dtype=np.uint8),
        "w13_scale": scales(2 * I, H // 16),
        "w13_scale_2": global_scale(2 * I),
        "w2": rng.integers(0, 256, size=(experts, H, I // 2), dtype=np.uint8),
        "w2_scale": scales(H, I // 16),
        "w2_scale_2": global_scale(H),
    }
