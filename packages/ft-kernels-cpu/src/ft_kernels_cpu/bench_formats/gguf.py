"""gguf banks as GGUF stores expert tensors: gate/up [E, I, row_bytes(H)] u8, down [E, H, row_bytes(I)] u8.

The benchmark pairs Q4_K gate/up with Q6_K down (as in the common Q4_K_M files); set the ``OPTIONS``
type ids to another supported pairing to measure it.
"""

from __future__ import annotations

import numpy as np

from ft_kernels_cpu.shapes import MoeShape

Q8_0, Q4_0, BF16, F16, MXFP4, Q4_K, Q6_K, Q5_K = 8, 2, 30, 1, 39, 12, 14, 13
OPTIONS = {"gate_up_type": Q4_K, "down_type": Q6_K}

# ggml type id -> (elements, bytes) per block and the byte offsets of its fp16 scales (e8m0 for MXFP4).
_BLOCKS = {
    Q8_0: (32, 34, (0,)),
    Q4_0: (32, 18, (0,)),
    BF16: (1, 2, ()),
    F16: (1, 2, ()),
    MXFP4: (32, 17, ()),
    Q4_K: (256, 144, (0, 2)),
    Q5_K: (256, 176, (0, 2)),
    Q6_K: (256, 210, (208,)),
}


def row_bytes(qtype: int, K: int) -> int:
    elems, size, _ = _BLOCKS[qtype]
    return K // elems * size


def expert_bytes(shape: MoeShape) -> int:
    H, I = shape.hidden, shape.intermediate
    return 2 * I * row_bytes(OPTIONS["gate_up_type"], H) + H * row_bytes(OPTIONS["down_type"], I)


def random_rows(rng: np.random.Generator, qtype: int, rows: tuple[int, ...], K: int) -> np.ndarray:
    """Random codes with valid scales: normal fp16 of magnitude [2^-11, 2^-10) (small enough for the
    K-quants' 6-bit multipliers), e8m0 in [118, 127], no NaN/inf/subnormal bf16 or fp16 elements."""
    elems, size, scales = _BLOCKS[qtype]
    nblocks = K // elems
    data = rng.integers(0, 256, size=(*rows, nblocks, size), dtype=np.uint8)
    for off in scales:
        d = rng.integers(0, 1 << 10, size=(*rows, nblocks), dtype=np.uint16) | np.uint16(0x1000)
        data[..., off : off + 2] = d.view(np.uint8).reshape(*rows, nblocks, 2)
    if qtype == MXFP4:
        data[..., 0] = 118 + data[..., 0] % 10
    elif qtype in (BF16, F16):  # magnitude in [2^-7, 2^-6) as in bench_formats.random_bf16_bits
        bits = data.view(np.uint16)
        bits &= np.uint16(0x807F if qtype == BF16 else 0x83FF)
        bits |= np.uint16(0x3C00 if qtype == BF16 else 0x2000)
    return data.reshape(*rows, nblocks * size)


def banks(shape: MoeShape, experts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, I = shape.hidden, shape.intermediate
    gu, dn = OPTIONS["gate_up_type"], OPTIONS["down_type"]
    return {
        "gate": random_rows(rng, gu, (experts, I), H),
        "up": random_rows(rng, gu, (experts, I), H),
        "down": random_rows(rng, dn, (experts, H), I),
    }
