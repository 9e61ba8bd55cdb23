"""The CPU side of the bridge, driven the way a GPU drives it: by writing the IO block's words."""

from __future__ import annotations

import time

import numpy as np
import pytest

import ft_kernels_cpu as fk
from ft_gpusync import Coordinator, CoordinatorError
from helpers.moe_reference import BF16, moe_reference

H, I, E, TOP_K, MAX_T = 96, 64, 6, 4, 8


def make_executor(rng: np.random.Generator, threads: int = 2, E: int = E, H: int = H, I: int = I, fill=None):
    if fill is None:
        w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(BF16)
        w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(BF16)
    else:  # large banks, quick to build (written, so reads really go to DRAM)
        w13 = np.full((E, 2 * I, H), fill, np.uint16)
        w2 = np.full((E, H, I), fill, np.uint16)
    ex = fk.MoeExecutor(hidden=H, top_k=TOP_K, max_tokens=MAX_T, num_threads=threads)
    for layer in (0, 5):
        ex.add_layer(layer, "bf16", num_experts=E, intermediate=I, banks={"w13": w13, "w2": w2})
    return ex, w13, w2


def ring(c: Coordinator, v: dict, layer: int, x, ids, w, timeout: float = 10.0) -> np.ndarray:
    """What the GPU's publish kernel does, then what its wait does."""
    T = x.shape[0]
    v["x"][:T] = x.view(np.uint16)
    v["ids"][:T] = ids
    v["weights"][:T] = w
    v["done"][0] = 0
    v["doorbell"][0] = Coordinator.doorbell_word(layer, T)
    deadline = time.monotonic() + timeout
    while v["done"][0] != 1:
        assert time.monotonic() < deadline, "done never set"
        time.sleep(1e-4)
    return v["y"][:T].copy()


def test_tasks_round_trip_through_the_block() -> None:
    rng = np.random.default_rng(0)
    ex, w13, w2 = make_executor(rng)
    with Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K) as c:
        v = c.views()
        for i, (layer, T) in enumerate([(0, 1), (5, 3), (0, 8), (5, 1)]):
            x = rng.standard_normal((T, H)).astype(BF16)
            ids = rng.integers(-1, E, (T, TOP_K)).astype(np.int32)
            w = rng.random((T, TOP_K)).astype(np.float32)
            y = ring(c, v, layer, x, ids, w)
            assert v["doorbell"][0] == 0  # taken
            assert c.served == i + 1
            # Transport is exact: the same bits as a direct run ...
            np.testing.assert_array_equal(y, ex.run(layer, x, ids, w).view(np.uint16))
            # ... and the math is right (independent float64 reference).
            ref, scale = moe_reference(x, ids, w, w13[:, :I], w13[:, I:], w2)
            err = np.abs(y.view(BF16).astype(np.float64) - ref)
            assert np.all(err <= 2.0**-8 * np.abs(ref) + 2.0**-8 * scale)
        c.check()


def test_a_task_without_cpu_routes_writes_zeros() -> None:
    rng = np.random.default_rng(1)
    ex, *_ = make_executor(rng)
    with Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K) as c:
        v = c.views()
        v["y"][:] = 0x3F80  # stale 1.0 everywhere
        x = rng.standard_normal((2, H)).astype(BF16)
        y = ring(c, v, 0, x, np.full((2, TOP_K), -1, np.int32), np.ones((2, TOP_K), np.float32))
        assert not y.any()
        c.check()


def test_executor_errors_release_the_gpu_and_raise_on_check() -> None:
    rng = np.random.default_rng(2)
    ex, *_ = make_executor(rng)
    with Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K) as c:
        v = c.views()
        x = rng.standard_normal((1, H)).astype(BF16)
        bad = np.array([[0, E, -1, 1]], np.int32)
        y = ring(c, v, 0, x, bad, np.ones((1, TOP_K), np.float32))
        assert not y.any()
        with pytest.raises(
            CoordinatorError, match=r"layer 0: CPU MoE executor failed: ids\[0, 1\]=6 is out of range"
        ):
            c.check()
        c.check()  # reported once; the bridge keeps serving
        ring(c, v, 7, x, np.zeros((1, TOP_K), np.int32), np.ones((1, TOP_K), np.float32))
        with pytest.raises(CoordinatorError, match="layer 7 has not been added"):
            c.check()
        v["done"][0] = 0
        v["doorbell"][0] = Coordinator.doorbell_word(0, MAX_T + 1)
        while v["done"][0] != 1:
            time.sleep(1e-4)
        with pytest.raises(CoordinatorError, match=r"num_tokens=9 but the IO block holds max_tokens=8"):
            c.check()


def test_a_stuck_task_becomes_an_error_not_a_hang() -> None:
    # A layer big enough that one task takes far longer than a 2 ms timeout on one thread: it reads
    # 16 experts x 18.9 MB = 302 MB (over 10 ms even at 30 GB/s).
    rng = np.random.default_rng(3)
    big_h, big_i = 2048, 1536
    ex, *_ = make_executor(rng, threads=1, E=16, H=big_h, I=big_i, fill=0x3C00)
    with Coordinator(ex, max_tokens=MAX_T, hidden=big_h, top_k=TOP_K, timeout_ms=2) as c:
        v = c.views()
        x = rng.standard_normal((MAX_T, big_h)).astype(BF16)
        ids = (
            np.tile(np.arange(TOP_K, dtype=np.int32), (MAX_T, 1))
            + np.arange(MAX_T, dtype=np.int32)[:, None] % 4
        )
        t0 = time.monotonic()
        ring(c, v, 0, x, ids, np.ones((MAX_T, TOP_K), np.float32), timeout=5.0)
        released_after = time.monotonic() - t0
        with pytest.raises(CoordinatorError, match=r"still running after \d+ ms \(timeout_ms=2\)"):
            c.check()
        assert c.served == 0
        # Every later call fails too: results after a stuck task cannot be trusted.
        with pytest.raises(CoordinatorError, match="stopped serving after a stuck task"):
            c.check()
        ring(c, v, 0, x[:1], ids[:1], np.ones((1, TOP_K), np.float32))
        with pytest.raises(CoordinatorError):
            c.check()
    # The direct run of the same task takes longer than the watchdog let the GPU wait.
    t0 = time.monotonic()
    ex.run(0, x, ids, np.ones((MAX_T, TOP_K), np.float32))
    assert released_after < time.monotonic() - t0


def test_argument_checks() -> None:
    rng = np.random.default_rng(4)
    ex, *_ = make_executor(rng)
    with pytest.raises(ValueError, match="hidden=95 differs from the executor's hidden=96"):
        Coordinator(ex, max_tokens=MAX_T, hidden=H - 1, top_k=TOP_K)
    with pytest.raises(ValueError, match="top_k=3 differs from the executor's top_k=4"):
        Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=3)
    with pytest.raises(ValueError, match=r"max_tokens=9 must be in \[1, 8\]"):
        Coordinator(ex, max_tokens=9, hidden=H, top_k=TOP_K)
    with pytest.raises(ValueError, match="timeout_ms must be >= 1"):
        Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K, timeout_ms=0)
    with pytest.raises(TypeError, match="executor must be the capsule"):
        Coordinator(object(), max_tokens=MAX_T, hidden=H, top_k=TOP_K)
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        Coordinator(ex, max_tokens=8.0, hidden=H, top_k=TOP_K)


def test_layout_is_64_byte_aligned_and_views_cover_it() -> None:
    rng = np.random.default_rng(5)
    ex, *_ = make_executor(rng)
    c = Coordinator(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K)
    lay = c.layout
    assert lay["doorbell"] == 0 and lay["done"] == 64
    assert all(lay[k] % 64 == 0 for k in ("x", "ids", "weights", "y", "bytes"))
    assert lay["x"] + MAX_T * H * 2 <= lay["ids"] and lay["y"] + MAX_T * H * 2 <= lay["bytes"]
    v = c.views()
    assert v["done"][0] == 1  # idle: a wait passes
    c.close()
