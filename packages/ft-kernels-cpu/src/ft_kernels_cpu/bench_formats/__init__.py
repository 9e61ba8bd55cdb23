"""Synthetic banks for the benchmark, one module per weight format (``bench_formats/<fmt>.py``).

Each module defines:

- ``expert_bytes(shape) -> int``: bytes of one expert's weights that a decode step reads;
- ``banks(shape, experts, rng) -> dict[str, np.ndarray]``: banks of ``experts`` experts with valid
  scales (no denormals, no NaN), in the layout the format documents;
- optionally ``OPTIONS: dict[str, float]``, the format's options for ``add_layer``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np


def load(fmt: str) -> ModuleType:
    try:
        return importlib.import_module(f"{__name__}.{fmt}")
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"format {fmt!r} has no benchmark banks (ft_kernels_cpu/bench_formats/{fmt}.py)"
        ) from exc


def random_bf16_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """bf16 bit patterns of magnitude in [2^-7, 2^-6) with random sign and mantissa (no denormals)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00)
