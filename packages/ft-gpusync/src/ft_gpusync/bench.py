"""Round-trip latency of the bridge handshakes, per layer, eager and in graph replay.

    python -m ft_gpusync.bench [--backend cuda] [--layers 48] [--json]

For each handshake the probes allow, a chain of `--layers` submit + wait pairs is enqueued (eager) or
captured once and replayed (graph), for an empty CPU task (no route on the CPU) and a one-route task
(one tiny expert). The floor printed next to them is the same chain made of the stream operations
alone (a write of the done word and a wait on it, no CPU involved), measured in the same run.
No torch: inputs and the output live in device memory allocated through the runtime, as an engine's
tensors do; streams and graphs come from the runtime too. For the kernel handshake the empty step is
also split into its parts (publish alone; wait + combine alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import ft_kernels_cpu as fk
from ft_gpusync import Bridge
from ft_gpusync._coordinator import _native

HIDDEN, TOP_K, INTER = 2048, 8, 64


def _executor(layers: int) -> fk.MoeExecutor:
    rng = np.random.default_rng(0)
    ex = fk.MoeExecutor(hidden=HIDDEN, top_k=TOP_K, max_tokens=1, num_threads=2)
    w13 = (rng.standard_normal((1, 2 * INTER, HIDDEN)) * 0.02).astype(np.float32).view(np.uint32) >> 16
    w2 = (rng.standard_normal((1, HIDDEN, INTER)) * 0.02).astype(np.float32).view(np.uint32) >> 16
    banks = {"w13": w13.astype(np.uint16), "w2": w2.astype(np.uint16)}
    for layer in range(layers):
        ex.add_layer(layer, "bf16", num_experts=1, intermediate=INTER, banks=banks)
    return ex


def _time(run, sync, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _row(backend: str, hs: str, mode: str, case: str, layers: int, us: float, floor: float) -> dict:
    return {"bench": "ft_gpusync", "backend": backend, "handshake": hs, "mode": mode, "case": case,
            "layers": layers, "us_per_layer": round(us, 2), "floor_us": round(floor, 2),
            "ratio": round(us / floor, 2)}  # fmt: skip


def bench(backend: str, device: int, layers: int, reps: int, log) -> list[dict]:
    rt = _native._Runtime(backend)
    if not rt.available:
        raise SystemExit(f"no {backend} runtime: {rt.reason}")
    ex = _executor(layers)
    stream = _native._stream_create(rt, device)
    sync = lambda: _native._stream_sync(rt, stream)  # noqa: E731
    # Inputs and the output in device memory, as an engine's tensors are: [x | ids | weights | out].
    x_bytes, r_bytes = HIDDEN * 2, TOP_K * 4
    dev = _native._device_alloc(rt, device, 2 * x_bytes + 2 * r_bytes + 256)
    d_x, d_ids, d_w = dev, dev + x_bytes, dev + x_bytes + r_bytes
    d_out = dev + ((x_bytes + 2 * r_bytes + 255) // 256) * 256
    rng = np.random.default_rng(1)
    x_host = (rng.standard_normal(HIDDEN).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    _native._copy_h2d(rt, d_x, x_host)
    _native._copy_h2d(rt, d_w, np.ones(TOP_K, np.float32))

    def set_route(route: int) -> None:
        ids = np.full(TOP_K, -1, np.int32)
        ids[0] = route
        _native._copy_h2d(rt, d_ids, ids)

    # The floor: per layer, a stream write of a mapped word and a wait on it, nothing else.
    word_host, word_dev = _native._host_alloc_mapped(rt, device, 64)

    def floor_chain():
        for _ in range(layers):
            _native._stream_write_wait(rt, stream, word_dev, 1)

    _native._begin_capture(rt, stream)
    floor_chain()
    floor_graph = _native._end_capture_instantiate(rt, stream)
    floor = {
        "eager": _time(floor_chain, sync, reps) / layers * 1e6,
        "graph": _time(lambda: _native._graph_launch(rt, floor_graph, stream), sync, reps) / layers * 1e6,
    }
    log(
        f"  floor (write+wait only): eager {floor['eager']:.2f} us/layer, graph {floor['graph']:.2f} us/layer"
    )

    # The CPU task of the one-route case on its own (the executor's time is part of that round trip).
    one = np.full((reps * 50, 1, TOP_K), -1, np.int32)
    one[:, 0, 0] = 0
    ex.time_runs(0, x_host.reshape(1, HIDDEN), one[:50], np.ones((50, 1, TOP_K), np.float32))
    exec_us = ex.time_runs(0, x_host.reshape(1, HIDDEN), one, np.ones(one.shape, np.float32)) / len(one) * 1e6
    log(f"  executor alone, one route: {exec_us:.2f} us")

    results = []
    for hs in ("kernel", "memop", "host-func"):
        try:
            b = Bridge(
                ex, backend=backend, device=device, max_tokens=1, hidden=HIDDEN, top_k=TOP_K, handshake=hs
            )
        except RuntimeError as e:
            log(f"# {hs}: unavailable ({e})")
            continue

        def chain(b=b):
            for layer in range(layers):
                b.submit(stream, layer, d_x, d_ids, d_w, 1)
                b.wait(stream, d_out, False)

        graph = None
        if hs != "host-func" or backend == "cuda":
            _native._begin_capture(rt, stream)
            chain()
            graph = _native._end_capture_instantiate(rt, stream)
        for case, route in (("empty", -1), ("one-route", 0)):
            set_route(route)
            chain()
            sync()
            modes = [("eager", chain)]
            if graph is not None:
                modes.append(("graph", lambda g=graph: _native._graph_launch(rt, g, stream)))
            for mode, run in modes:
                us = _time(run, sync, reps) / layers * 1e6
                results.append(_row(backend, hs, mode, case, layers, us, floor[mode]))
                if route >= 0:
                    results[-1]["executor_us"] = round(exec_us, 2)
                log(
                    f"  {hs:<9} {mode:<5} {case:<9} {us:8.2f} us/layer"
                    f"  (floor {floor[mode]:.2f}, x{us / floor[mode]:.1f})"
                )
        if hs == "kernel":
            # Where an empty step's time goes: the publish kernel alone, the wait + combine alone.
            set_route(-1)
            b.submit(stream, 0, d_x, d_ids, d_w, 1)
            sync()
            parts = {
                "publish-only": lambda b=b: [b.submit(stream, i, d_x, d_ids, d_w, 1) for i in range(layers)],
                "wait-combine-only": lambda b=b: [b.wait(stream, d_out, False) for _ in range(layers)],
                "wait-combine-only-acc": lambda b=b: [b.wait(stream, d_out, True) for _ in range(layers)],
            }
            for case, part in parts.items():
                _native._begin_capture(rt, stream)
                part()
                g = _native._end_capture_instantiate(rt, stream)
                us = _time(lambda g=g: _native._graph_launch(rt, g, stream), sync, reps) / layers * 1e6
                _native._graph_exec_destroy(rt, g)
                results.append(_row(backend, hs, "graph", case, layers, us, floor["graph"]))
                log(f"  {hs:<9} graph {case:<22} {us:8.2f} us/layer")
        b.check()
        if graph is not None:
            _native._graph_exec_destroy(rt, graph)
    _native._graph_exec_destroy(rt, floor_graph)
    _native._host_free(rt, word_host)
    _native._device_free(rt, dev)
    _native._stream_destroy(rt, stream)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ft_gpusync.bench", description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cuda", choices=("cuda", "hip"))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--layers", type=int, default=48, help="layers per chain (default 48, Qwen3-30B-A3B)")
    p.add_argument("--reps", type=int, default=20, help="timed chains per figure (median)")
    p.add_argument("--json", action="store_true", help="end with one JSON line per figure")
    a = p.parse_args(argv)
    if a.layers < 1 or a.reps < 1:
        p.error("--layers and --reps must be >= 1")
    log = lambda s: print(s, file=sys.stderr if a.json else sys.stdout, flush=True)  # noqa: E731
    results = bench(a.backend, a.device, a.layers, a.reps, log)
    if a.json:
        for r in results:
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
