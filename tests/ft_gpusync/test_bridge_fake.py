"""The bridge end to end on fake runtimes: probes pick the handshake, submit/wait move a real task
through the IO block and the coordinator, in eager mode and in a captured graph replayed many times."""

from __future__ import annotations

import numpy as np
import pytest

import ft_kernels_cpu as fk
from ft_gpusync import Bridge
from ft_gpusync import _native_module as native
from helpers.moe_reference import BF16

H, I, E, TOP_K, MAX_T = 64, 32, 5, 3, 4


def executor(rng):
    ex = fk.MoeExecutor(hidden=H, top_k=TOP_K, max_tokens=MAX_T, num_threads=1)
    for layer in range(4):
        w13 = rng.standard_normal((E, 2 * I, H)).astype(BF16)
        w2 = rng.standard_normal((E, H, I)).astype(BF16)
        ex.add_layer(layer, "bf16", num_experts=E, intermediate=I, banks={"w13": w13, "w2": w2})
    return ex


def step_inputs(rng, T):
    x = rng.standard_normal((T, H)).astype(BF16)
    ids = rng.integers(-1, E, (T, TOP_K)).astype(np.int32)
    w = rng.random((T, TOP_K)).astype(np.float32)
    return x, ids, w


both = pytest.mark.parametrize("fake", ["cuda", "hip"], indirect=True)


@both
def test_auto_falls_back_to_memop_when_the_kernel_io_probe_fails(fake) -> None:
    backend, _ = fake
    b = Bridge(executor(np.random.default_rng(0)), backend=backend, max_tokens=MAX_T, hidden=H, top_k=TOP_K)
    # The fakes cannot run device code: the kernel-IO probe fails, the memop graph probe passes.
    assert b.handshake == "memop"
    assert "kernel-IO probe failed" in b.detail and "memop graph probe: 64-bit stream write/wait" in b.detail
    with pytest.raises(RuntimeError, match="handshake='kernel' is unavailable"):
        Bridge(
            executor(np.random.default_rng(0)),
            backend=backend,
            max_tokens=MAX_T,
            hidden=H,
            top_k=TOP_K,
            handshake="kernel",
        )


@both
@pytest.mark.parametrize("handshake", ["memop", "host-func"])
def test_eager_submit_and_wait(fake, handshake: str) -> None:
    backend, _ = fake
    rng = np.random.default_rng(1)
    ex = executor(rng)
    b = Bridge(ex, backend=backend, max_tokens=MAX_T, hidden=H, top_k=TOP_K, handshake=handshake)
    assert b.handshake == handshake
    rt = native._Runtime(backend)
    stream = native._stream_create(rt, 0)
    for i, T in enumerate([1, 3, 4, 2]):
        x, ids, w = step_inputs(rng, T)
        out = np.full((T, H), 0x7FC0, np.uint16)  # NaN: must be overwritten
        b.submit(stream, i % 4, x.ctypes.data, ids.ctypes.data, w.ctypes.data, T)
        b.wait(stream, out.ctypes.data, accumulate=False)
        native._stream_sync(rt, stream)
        np.testing.assert_array_equal(out, ex.run(i % 4, x, ids, w).view(np.uint16))
    b.check()
    assert b.served == 4
    with pytest.raises(RuntimeError, match=r"accumulate=True\) needs the combine kernel"):
        b.wait(stream, out.ctypes.data, accumulate=True)
    native._stream_destroy(rt, stream)


@both
@pytest.mark.parametrize("nodes", [False, True], ids=["stream-memops", "explicit-nodes"])
def test_captured_graph_replays_with_fresh_inputs(fake, monkeypatch, nodes: bool) -> None:
    backend, _ = fake
    if nodes:  # a runtime that does not record stream memops under capture (ROCm 7.x)
        monkeypatch.setenv("FT_FAKE_NO_CAPTURED_MEMOPS", "1")
    rng = np.random.default_rng(2)
    ex = executor(rng)
    b = Bridge(ex, backend=backend, max_tokens=MAX_T, hidden=H, top_k=TOP_K)
    assert b.handshake == "memop"
    assert ("explicit batch-memop nodes: 64-bit" in b.detail) == nodes, b.detail
    rt = native._Runtime(backend)
    stream = native._stream_create(rt, 0)
    T = 3
    # Fixed addresses, as in a captured decode step: 4 layers, each submit + wait.
    xs = [np.zeros((T, H), BF16) for _ in range(4)]
    idss = [np.zeros((T, TOP_K), np.int32) for _ in range(4)]
    ws = [np.zeros((T, TOP_K), np.float32) for _ in range(4)]
    outs = [np.zeros((T, H), np.uint16) for _ in range(4)]
    native._begin_capture(rt, stream)
    for layer in range(4):
        b.submit(stream, layer, xs[layer].ctypes.data, idss[layer].ctypes.data, ws[layer].ctypes.data, T)
        b.wait(stream, outs[layer].ctypes.data, accumulate=False)
    graph = native._end_capture_instantiate(rt, stream)
    assert b.served == 0  # capture ran nothing
    for _ in range(20):
        for layer in range(4):
            xs[layer][:], idss[layer][:], ws[layer][:] = step_inputs(rng, T)
        native._graph_launch(rt, graph, stream)
        native._stream_sync(rt, stream)
        for layer in range(4):
            np.testing.assert_array_equal(
                outs[layer], ex.run(layer, xs[layer], idss[layer], ws[layer]).view(np.uint16)
            )
    assert b.served == 80
    b.check()
    native._graph_exec_destroy(rt, graph)
    native._stream_destroy(rt, stream)


def test_host_func_handshake_refuses_capture_on_rocm(fake_libs, monkeypatch) -> None:
    monkeypatch.setenv("FT_GPUSYNC_HIP_LIB", str(fake_libs["hip"]))
    rng = np.random.default_rng(3)
    b = Bridge(executor(rng), backend="hip", max_tokens=MAX_T, hidden=H, top_k=TOP_K, handshake="host-func")
    x, ids, w = step_inputs(rng, 1)
    with pytest.raises(RuntimeError, match="cannot be captured on ROCm"):
        b.submit(0xCA97, 0, x.ctypes.data, ids.ctypes.data, w.ctypes.data, 1)


def test_bridge_argument_errors(fake_libs, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FT_GPUSYNC_CUDA_LIB", str(fake_libs["cuda"]))
    ex = executor(np.random.default_rng(4))
    with pytest.raises(ValueError, match="handshake='smoke' is unknown"):
        Bridge(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K, handshake="smoke")
    with pytest.raises(ValueError, match="hidden/top_k must equal the executor's"):
        Bridge(ex, max_tokens=MAX_T, hidden=H + 1, top_k=TOP_K)
    b = Bridge(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K)
    with pytest.raises(ValueError, match=r"num_tokens=5 must be in \[1, max_tokens=4\]"):
        b.submit(0, 0, 0, 0, 0, 5)
    monkeypatch.setenv("FT_GPUSYNC_CUDA_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(RuntimeError, match="no cuda runtime: cannot load"):
        Bridge(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K)
