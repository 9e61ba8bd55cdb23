"""fp8_block banks: e4m3fn w13 [E, 2I, H], w2 [E, H, I] with f32 scales per 128 x 128 block."""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.shapes import MoeShape

BLOCK = 128


def _nb(n: int) -> int:
    return -(-n // BLOCK)


def expert_bytes(shape: MoeShape) -> int:
    H, I = shape.hidden, shape.intermediate
    return 3 * H * I + 4 * (2 * _nb(I) * _nb(H) + _nb(H) * _nb(I))


def random_e4m3_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random e4m3fn codes as a checkpoint holds them: no NaN (0x7f / 0xff: the lowest exponent bit
    is cleared) and no exponent-0 code (zeros and subnormals, values under 2^-6, which a checkpoint
    whose block scales map each block's largest weight near 448 holds in well under 1% of its runs of
    64 weights; uniform codes would put one in every run, and the avx512_bf16 kernel decodes those
    runs on a slower fix-up path): exponent 0 becomes 1."""
    bits = rng.integers(0, 256, size=shape, dtype=np.uint8)
    flat = bits.reshape(-1)
    for i in range(0, flat.size, 1 << 22):  # in cache-sized pieces
        part = flat[i : i + (1 << 22)]
        part &= np.uint8(0xF7)
        part += ((part & np.uint8(0x78)) == 0).view(np.uint8) << np.uint8(3)
    return bits


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate

    def scales(*dims: int) -> np.ndarray:
        return (2.0**-12 * (1.0 + rng.random((experts, *dims), dtype=np.float32))).astype(np.float32)

    return {
        "w13": random_e4m3_bits(rng, (experts, 2 * I, H)),
        "w13_scale": scales(2 * _nb(I), _nb(H)),
        "w2": random_e4m3_bits(rng, (experts, H, I)),
        "w2_scale": scales(_nb(H), _nb(I)),
    }
