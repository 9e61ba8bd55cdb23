"""The bridge on a real GPU (CUDA through torch for buffers and streams): eager and graph replay, every
handshake. Marked `gpu`: skipped with the reason elsewhere, a failure under FT_REQUIRE_GPU=1."""

from __future__ import annotations

import numpy as np
import pytest

import ft_kernels_cpu as fk
from ft_gpusync import Bridge
from helpers.moe_reference import BF16

pytestmark = pytest.mark.gpu

H, I, E, TOP_K, MAX_T = 256, 128, 8, 4, 8
HANDSHAKES = ["kernel", "memop", "host-func"]


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


@pytest.fixture(scope="module")
def ex():
    rng = np.random.default_rng(0)
    ex = fk.MoeExecutor(hidden=H, top_k=TOP_K, max_tokens=MAX_T, num_threads=2)
    for layer in range(4):
        w13 = (rng.standard_normal((E, 2 * I, H)) / 16).astype(BF16)
        w2 = (rng.standard_normal((E, H, I)) / 11).astype(BF16)
        ex.add_layer(layer, "bf16", num_experts=E, intermediate=I, banks={"w13": w13, "w2": w2})
    return ex


def inputs(torch, rng, T, cpu_share):
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).bfloat16()
    ids = torch.from_numpy(rng.integers(0, E, (T, TOP_K)).astype(np.int32))
    ids[torch.from_numpy(rng.random((T, TOP_K)) >= cpu_share)] = -1  # routes kept on the GPU
    w = torch.from_numpy(rng.random((T, TOP_K)).astype(np.float32))
    return x, ids, w


def expected(ex, layer, x, ids, w):
    """The executor's own output for the same task, run directly on the CPU: the bridge is transport,
    so its result must be bit-identical (the executor itself is checked against float64 elsewhere)."""
    import torch

    return ex.run(layer, x.view(torch.int16).numpy().view(np.uint16), ids.numpy(), w.numpy())


@pytest.mark.parametrize("handshake", HANDSHAKES)
@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("cpu_share", [0.5, 1.0])
@pytest.mark.parametrize("accumulate", [False, True])
def test_eager(torch, ex, handshake, T, cpu_share, accumulate) -> None:
    rng = np.random.default_rng([T, int(cpu_share * 2), accumulate])
    b = Bridge(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K, handshake=handshake)
    s = torch.cuda.Stream()
    x, ids, w = inputs(torch, rng, T, cpu_share)
    dx, dids, dw = x.cuda(), ids.cuda(), w.cuda()
    partial = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).bfloat16().cuda()
    out = (
        partial.clone()
        if accumulate
        else torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    )
    torch.cuda.synchronize()
    b.submit(s.cuda_stream, 2, dx.data_ptr(), dids.data_ptr(), dw.data_ptr(), T)
    b.wait(s.cuda_stream, out.data_ptr(), accumulate)
    s.synchronize()
    b.check()
    y = torch.from_numpy(expected(ex, 2, x, ids, w).view(np.int16)).view(torch.bfloat16)
    want = (partial.cpu().float() + y.float()).bfloat16() if accumulate else y
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("handshake", HANDSHAKES)  # CUDA replays host-function nodes correctly
def test_graph_of_four_layers_replayed_with_fresh_inputs(torch, ex, handshake) -> None:
    rng = np.random.default_rng(7)
    b = Bridge(ex, max_tokens=MAX_T, hidden=H, top_k=TOP_K, handshake=handshake)
    T = 3
    s = torch.cuda.Stream()
    xs = [torch.zeros((T, H), dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    idss = [torch.full((T, TOP_K), -1, dtype=torch.int32, device="cuda") for _ in range(4)]
    ws = [torch.zeros((T, TOP_K), dtype=torch.float32, device="cuda") for _ in range(4)]
    outs = [torch.zeros((T, H), dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for layer in range(4):
            b.submit(
                s.cuda_stream, layer, xs[layer].data_ptr(), idss[layer].data_ptr(), ws[layer].data_ptr(), T
            )
            b.wait(s.cuda_stream, outs[layer].data_ptr(), False)
    served0, rung = b.served, 0
    for step in range(50):
        host = []
        for layer in range(4):
            # Layers 1 and 3 keep every route on the GPU on even steps: nothing rings for them.
            share = 0.0 if layer % 2 and step % 2 == 0 else 0.6
            x, ids, w = inputs(torch, rng, T, share)
            xs[layer].copy_(x)
            idss[layer].copy_(ids)
            ws[layer].copy_(w)
            host.append((x, ids, w))
            rung += int((ids >= 0).any())
        g.replay()
        torch.cuda.synchronize()
        for layer in range(4):
            want = torch.from_numpy(expected(ex, layer, *host[layer]).view(np.int16))
            assert torch.equal(outs[layer].cpu().view(torch.int16), want)
    b.check()
    if handshake == "kernel":
        assert b.served - served0 == rung  # a step without CPU routes never rings
    else:
        assert b.served - served0 == 200  # memop / host-func always ring; the executor answers empty steps
