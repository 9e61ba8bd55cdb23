"""q4_0 banks (ggml Q4_0 blocks of 32 values in 18 bytes): w13 [E, 2I, H/32*18] u8, w2 [E, H, I/32*18] u8."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.shapes import MoeShape


def expert_bytes(shape: MoeShape) -> int:
    return 3 * shape.hidden * shape.intermediate // 32 * 18


def q4_0_rows(rng: np.random.Generator, rows: tuple[int, ...], K: int) -> np.ndarray:
    """Random nibbles; every block's fp16 scale is a normal number of magnitude [2^-7, 2^-6)."""
    nblocks = K // 32
    data = rng.integers(0, 256, size=(*rows, nblocks, 18), dtype=np.uint8)
    d = rng.integers(0, 1 << 10, size=(*rows, nblocks), dtype=np.uint16) | np.uint16(0x2000)  # 2^-7 * 1.m
    data[..., 0:2] = d.view(np.uint8).reshape(*rows, nblocks, 2)
    return data.reshape(*rows, nblocks * 18)


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate
    return {"w13": q4_0_rows(rng, (experts, 2 * I), H), "w2": q4_0_rows(rng, (experts, H), I)}
