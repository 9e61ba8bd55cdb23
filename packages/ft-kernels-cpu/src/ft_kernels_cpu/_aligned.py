"""Weight banks at cache-line boundaries.

The kernels read each row of a bank with 64-byte loads from the row's first byte. A bank whose first
byte is not at a multiple of 64 makes every one of those loads straddle two cache lines. numpy puts
large arrays 16 bytes past a page boundary; torch's CPU allocator and pinned host memory at
multiples of 64. Measured (docs/benchmarks.md, twenty-fourth session): mxfp4's one-vector kernel on
one Zen 5 core, rows of 1024 bytes, from DRAM 33 GB/s at offset 0 against 21-25 at offsets 16, 32
and 48 (from L2 78 against 64-67).
"""

from __future__ import annotations

import mmap

import numpy as np

BANK_ALIGNMENT = 64  # bytes: a cache line
HUGE_PAGE = 2 << 20  # bytes: an x86-64 transparent huge page
# Banks below this size are left alone by add_layer's check (test banks; a step's cost is its big ones).
ALIGNMENT_WARN_BYTES = 1 << 20


class AlignmentWarning(UserWarning):
    """A weight bank of a layer starts off a cache-line boundary, so its rows are read more slowly."""


def empty_aligned(
    shape: int | tuple[int, ...], dtype: object, align: int = BANK_ALIGNMENT, huge_pages: bool | None = None
) -> np.ndarray:
    """An uninitialised C-contiguous array whose first byte lies at a multiple of ``align`` bytes
    (a power of two; default 64, a cache line). Allocate weight banks with it, or copy into one:
    ``b = empty_aligned(a.shape, a.dtype); b[...] = a``.

    ``huge_pages``: None (default) leaves the pages to numpy, which asks Linux for transparent huge
    pages on arrays of 4 MiB and more; True maps the array on its own, 2 MiB aligned, with
    ``madvise(MADV_HUGEPAGE)`` before any page is touched; False the same with ``MADV_NOHUGEPAGE`` (4 KiB
    pages, for measuring what huge pages are worth). Whether the kernel grants huge pages follows its THP
    policy (``/sys/kernel/mm/transparent_hugepage/enabled``) and free memory; ``huge_page_bytes`` says how
    much it did once the array is written. Measure the read ceiling on the same pages
    (``MoeExecutor.read_bandwidth_gbs(huge_pages=...)``)."""
    if (
        isinstance(align, bool)
        or not isinstance(align, (int, np.integer))
        or align < 1
        or align & (align - 1)
    ):
        raise ValueError(f"align must be a power of two >= 1, got {align!r}")
    if huge_pages is not None and not isinstance(huge_pages, bool):
        raise TypeError(f"huge_pages must be None, True or False, got {huge_pages!r}")
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    if huge_pages is None:
        buf = np.empty(nbytes + int(align), dtype=np.uint8)
    else:
        if not (hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MADV_NOHUGEPAGE")):
            raise ValueError(
                f"huge_pages={huge_pages} needs Linux's madvise(MADV_HUGEPAGE / MADV_NOHUGEPAGE), which this "
                "system lacks; leave it None"
            )
        align = max(int(align), HUGE_PAGE)
        # private, not shared: shared anonymous memory takes its huge pages from the shmem policy
        # whole huge pages past the aligned start, so that the last one holding the array fits
        whole = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
        mm = mmap.mmap(-1, whole + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE if huge_pages else mmap.MADV_NOHUGEPAGE)  # before the first touch
        buf = np.frombuffer(mm, dtype=np.uint8)  # holds mm: the mapping lives as long as the array
    start = -buf.ctypes.data % int(align)
    return buf[start : start + nbytes].view(dt).reshape(dims)


def huge_page_bytes_at(ranges: list[tuple[int, int]]) -> int | None:
    """Bytes of transparent huge pages (``AnonHugePages`` in ``/proc/self/smaps``) in the mappings that
    hold the (address, nbytes) ranges, each mapping counted once and the sum at most the ranges' bytes (a
    mapping can be larger than what it holds, and neighbouring mappings merge), or None where the kernel
    does not report them."""
    spans = [(int(a), int(a) + int(n)) for a, n in ranges if int(n) > 0]
    total = 0
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):
                    start, end = (int(v, 16) for v in head.split("-"))
                    inside = any(start < hi and end > lo for lo, hi in spans)
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return min(total, sum(hi - lo for lo, hi in spans))


def huge_page_bytes(*arrays: np.ndarray) -> int | None:
    """``huge_page_bytes_at`` for the arrays' memory. Pages are faulted in on first touch, so count after
    writing the arrays."""
    return huge_page_bytes_at([(a.ctypes.data, a.nbytes) for a in arrays])


def misaligned_banks(banks: dict[str, tuple[int, int, str]]) -> list[tuple[str, int, int]]:
    """(name, address % BANK_ALIGNMENT, nbytes) of the banks of at least ALIGNMENT_WARN_BYTES that do
    not start at a multiple of BANK_ALIGNMENT; banks: name -> (address, nbytes, dtype)."""
    return [
        (name, addr % BANK_ALIGNMENT, nbytes)
        for name, (addr, nbytes, _) in banks.items()
        if addr % BANK_ALIGNMENT and nbytes >= ALIGNMENT_WARN_BYTES
    ]
