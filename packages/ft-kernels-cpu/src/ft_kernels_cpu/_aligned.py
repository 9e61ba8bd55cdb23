"""Weight banks at cache-line boundaries.

The kernels read each row of a bank with 64-byte loads from the row's first byte. A bank whose first
byte is not at a multiple of 64 makes every one of those loads straddle two cache lines. numpy puts
large arrays 16 bytes past a page boundary; torch's CPU allocator and pinned host memory at
multiples of 64. Measured (docs/benchmarks.md, twenty-fourth session): mxfp4's one-vector kernel on
one Zen 5 core, rows of 1024 bytes, from DRAM 33 GB/s at offset 0 against 21-25 at offsets 16, 32
and 48 (from L2 78 against 64-67).
"""

from __future__ import annotations

import numpy as np

BANK_ALIGNMENT = 64  # bytes: a cache line
# Banks below this size are left alone by add_layer's check (test banks; a step's cost is its big ones).
ALIGNMENT_WARN_BYTES = 1 << 20


class AlignmentWarning(UserWarning):
    """A weight bank of a layer starts off a cache-line boundary, so its rows are read more slowly."""


def empty_aligned(shape: int | tuple[int, ...], dtype: object, align: int = BANK_ALIGNMENT) -> np.ndarray:
    """An uninitialised C-contiguous array whose first byte lies at a multiple of ``align`` bytes
    (a power of two; default 64, a cache line). Allocate weight banks with it, or copy into one:
    ``b = empty_aligned(a.shape, a.dtype); b[...] = a``."""
    if (
        isinstance(align, bool)
        or not isinstance(align, (int, np.integer))
        or align < 1
        or align & (align - 1)
    ):
        raise ValueError(f"align must be a power of two >= 1, got {align!r}")
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    buf = np.empty(nbytes + int(align), dtype=np.uint8)
    start = -buf.ctypes.data % int(align)
    return buf[start : start + nbytes].view(dt).reshape(dims)


def misaligned_banks(banks: dict[str, tuple[int, int, str]]) -> list[tuple[str, int, int]]:
    """(name, address % BANK_ALIGNMENT, nbytes) of the banks of at least ALIGNMENT_WARN_BYTES that do
    not start at a multiple of BANK_ALIGNMENT; banks: name -> (address, nbytes, dtype)."""
    return [
        (name, addr % BANK_ALIGNMENT, nbytes)
        for name, (addr, nbytes, _) in banks.items()
        if addr % BANK_ALIGNMENT and nbytes >= ALIGNMENT_WARN_BYTES
    ]
