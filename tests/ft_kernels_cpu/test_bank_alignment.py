"""empty_aligned, add_layer's AlignmentWarning, and the bench's --bank-offset."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ft_kernels_cpu as fk
from helpers.checks import assert_close_to_reference
from helpers.moe_reference import BF16, moe_reference

H, I, E = 512, 512, 1  # w13 (E * 2I * H bf16) 1 MiB, w2 0.5 MiB


@pytest.mark.parametrize("align", [1, 2, 64, 4096])
@pytest.mark.parametrize("shape", [(0,), (3, 5), (7, 1, 9)])
def test_empty_aligned_places_the_first_byte(align: int, shape: tuple[int, ...]) -> None:
    a = fk.empty_aligned(shape, np.uint16, align=align)
    assert a.shape == shape and a.dtype == np.uint16 and a.flags.c_contiguous and a.flags.writeable
    assert a.size == 0 or a.ctypes.data % align == 0  # an empty array's address means nothing
    a[...] = 7  # the whole array is writable memory of its own
    assert int(a.sum()) == 7 * a.size
    assert fk.empty_aligned(5, "float32").ctypes.data % fk.BANK_ALIGNMENT == 0


@pytest.mark.parametrize("align", [0, 3, 48, -64, 2.0, True])
def test_empty_aligned_refuses_a_bad_alignment(align: object) -> None:
    with pytest.raises(ValueError, match=r"align must be a power of two >= 1, got"):
        fk.empty_aligned((4,), np.uint8, align=align)  # type: ignore[arg-type]


def test_empty_aligned_refuses_a_bad_shape() -> None:
    with pytest.raises(ValueError, match=r"shape must be non-negative ints, got \(2, -1\)"):
        fk.empty_aligned((2, -1), np.uint8)


def placed(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `a` that starts `offset` bytes past a multiple of 64 (the bench's place_banks, whose
    own test is below)."""
    from ft_kernels_cpu import bench

    return bench.place_banks({"a": a}, offset)["a"]


def bf16_layer(offset: int) -> tuple[fk.MoeExecutor, dict[str, np.ndarray], list[warnings.WarningMessage]]:
    rng = np.random.default_rng(3)
    banks = {
        "w13": placed((rng.standard_normal((E, 2 * I, H)) * 0.05).astype(BF16), offset),
        "w2": placed((rng.standard_normal((E, H, I)) * 0.05).astype(BF16), offset),
    }
    ex = fk.MoeExecutor(H, 1, max_tokens=1, num_threads=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=banks)
    return ex, banks, caught


@pytest.mark.parametrize("offset", [16, 32, 8, 1])
def test_a_misaligned_bank_of_a_mib_warns_and_still_runs_right(offset: int) -> None:
    ex, banks, caught = bf16_layer(offset)
    # Only w13 (1 MiB) warns; w2 (0.5 MiB) is below the size the check looks at.
    assert [w.category for w in caught] == [fk.AlignmentWarning]
    message = str(caught[0].message)
    assert f"banks['w13'] (1.0 MiB) starts {offset} bytes past a multiple of 64" in message
    assert "ft_kernels_cpu.empty_aligned" in message
    x = (np.random.default_rng(4).standard_normal((1, H)) * 0.5).astype(BF16)
    ids, w = np.array([[0]], np.int32), np.array([[1.0]], np.float32)
    w13 = banks["w13"].astype(np.float64)
    ref, scale = moe_reference(x, ids, w, w13[:, :I], w13[:, I:], banks["w2"], "silu")
    # As test_executor_bf16's check: y rounded to bf16, the intermediate too in the avx512_bf16 tier.
    assert_close_to_reference(ex.run(0, x, ids, w), ref, scale, ex.isa, rel=2.0**-8, mag=2.0**-8)


def test_aligned_banks_do_not_warn() -> None:
    _, _, caught = bf16_layer(0)
    assert caught == []


def test_address_banks_are_checked_too() -> None:
    w13 = placed(np.zeros((E, 2 * I, H), BF16), 16)
    w2 = fk.empty_aligned((E, H, I), BF16)
    w2[...] = 0
    ex = fk.MoeExecutor(H, 1, max_tokens=1, num_threads=1)
    with pytest.warns(fk.AlignmentWarning, match=r"banks\['w13'\] \(1\.0 MiB\) starts 16 bytes past"):
        ex.add_layer(
            0,
            "bf16",
            num_experts=E,
            intermediate=I,
            banks={"w13": (w13.ctypes.data, w13.nbytes), "w2": (w2.ctypes.data, w2.nbytes)},
        )


def test_bench_places_banks_at_the_offset_asked_for() -> None:
    from ft_kernels_cpu import bench

    rng = np.random.default_rng(0)
    banks = {"a": rng.integers(0, 256, (3, 1000), dtype=np.uint8), "b": rng.random((2, 7)).astype(np.float32)}
    want = {k: v.copy() for k, v in banks.items()}
    for offset in (0, 16, 63):
        got = bench.place_banks({k: v.copy() for k, v in want.items()}, offset)
        for k, v in want.items():
            assert got[k].ctypes.data % 64 == offset
            np.testing.assert_array_equal(got[k], v)


def test_bench_refuses_a_bank_offset_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    from ft_kernels_cpu import bench

    with pytest.raises(SystemExit):
        bench.main(["--format", "bf16", "--bank-offset", "64"])
    assert "--bank-offset must be in [0, 63], got 64" in capsys.readouterr().err
