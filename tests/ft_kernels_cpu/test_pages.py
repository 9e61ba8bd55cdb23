"""Huge or 4 KiB pages for banks (empty_aligned) and for the read-bandwidth ceiling, and the bench's --pages.

Whether Linux grants transparent huge pages depends on its THP policy, read here from sysfs: under
`never` nothing can be asked for, so the tests that need huge pages granted say so and skip; a policy
of `madvise` or `always` must give them to a region that asked before its first touch.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
import pytest

import ft_kernels_cpu as fk

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIB = 1 << 20


def thp_policy() -> str | None:
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


needs_thp = pytest.mark.skipif(
    thp_policy() not in ("always", "madvise") or not hasattr(mmap, "MADV_HUGEPAGE"),
    reason=f"transparent huge pages cannot be asked for here (policy {thp_policy()!r})",
)


@pytest.mark.parametrize("huge", [True, False])
def test_empty_aligned_on_chosen_pages_is_aligned_writable_and_holds_its_values(huge: bool) -> None:
    a = fk.empty_aligned((3, 5 * MIB + 7), np.uint8, huge_pages=huge)
    assert a.ctypes.data % (2 * MIB) == 0 and a.flags.c_contiguous and a.flags.writeable
    a[...] = np.arange(a.shape[1], dtype=np.uint64).astype(np.uint8)  # every page touched
    assert int(a[2, 5 * MIB + 6]) == (5 * MIB + 6) % 256 and int(a[0, 255]) == 255
    b = fk.empty_aligned(10, np.float32, align=4096, huge_pages=huge)
    assert b.ctypes.data % (2 * MIB) == 0  # at least a huge page's alignment


def test_small_pages_are_never_huge() -> None:
    a = fk.empty_aligned(16 * MIB, np.uint8, huge_pages=False)
    a[...] = 1
    got = fk.huge_page_bytes(a)
    assert got is None or got == 0


@needs_thp
def test_huge_pages_are_granted_when_the_policy_allows() -> None:
    a = fk.empty_aligned(16 * MIB, np.uint8, huge_pages=True)
    a[...] = 1
    got = fk.huge_page_bytes(a)
    assert got is not None and got >= 8 * MIB, f"{got} bytes of 16 MiB on huge pages, policy {thp_policy()}"
    assert fk.huge_page_bytes(a, a) == got  # a mapping is counted once, at most the ranges' bytes


def test_empty_aligned_refuses_a_bad_huge_pages() -> None:
    with pytest.raises(TypeError, match=r"huge_pages must be None, True or False, got 1"):
        fk.empty_aligned(4, np.uint8, huge_pages=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("huge", [True, False])
def test_read_ceiling_on_chosen_pages(huge: bool) -> None:
    ex = fk.MoeExecutor(64, 1, max_tokens=1, num_threads=1)
    assert ex.read_buffer_bytes == 0 and ex.read_buffer_huge_page_bytes() == 0
    assert ex.read_bandwidth_gbs(8 * MIB, passes=1, huge_pages=huge) > 0
    assert ex.read_buffer_bytes == 8 * MIB
    got = ex.read_buffer_huge_page_bytes()
    if not huge:
        assert got is None or got == 0
    elif thp_policy() in ("always", "madvise"):
        assert got is not None and got >= 4 * MIB
    # switching pages replaces the buffer
    assert ex.read_bandwidth_gbs(8 * MIB, passes=1, huge_pages=not huge) > 0
    flipped = ex.read_buffer_huge_page_bytes()
    if huge:
        assert flipped is None or flipped == 0


def test_read_ceiling_refuses_a_bad_huge_pages() -> None:
    ex = fk.MoeExecutor(64, 1, max_tokens=1, num_threads=1)
    with pytest.raises(TypeError, match=r"huge_pages must be a bool, got 'yes'"):
        ex.read_bandwidth_gbs(MIB, passes=1, huge_pages="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("pages", ["huge", "small"])
def test_bench_puts_banks_and_ceiling_on_the_same_pages(
    pages: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ft_kernels_cpu import bench

    argv = ["--format", "q4_0", "--threads", "1", "--samples", "1", "--min-time", "0.01", "--pool-mib", "1"]
    assert bench.main(argv + ["--pages", pages, "--json"]) == 0
    out = capsys.readouterr()
    row = json.loads([line for line in out.out.splitlines() if line.startswith("{")][-1])
    assert row["pages"] == pages
    if pages == "small":
        assert row["huge_page_mib"] in (None, 0.0) and row["read_huge_page_mib"] in (None, 0.0)
    elif thp_policy() in ("always", "madvise"):
        assert row["huge_page_mib"] > 0 and row["read_huge_page_mib"] > 0
        assert "compares different pages" not in out.err


def test_bench_refuses_unknown_pages(capsys: pytest.CaptureFixture[str]) -> None:
    from ft_kernels_cpu import bench

    with pytest.raises(SystemExit):
        bench.main(["--format", "q4_0", "--pages", "large"])
    assert "argument --pages: invalid choice: 'large'" in capsys.readouterr().err
