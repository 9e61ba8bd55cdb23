"""Paired A/B of executor settings in one process, for boxes whose memory bandwidth drifts.

A developer tool (not part of the package). Each setting is a space-separated list of NAME=VALUE
environment variables that an executor reads when it is made (FT_CPU_MOE_PREFETCH,
FT_CPU_MOE_GATE_UP_SLICE, FT_CPU_MOE_MULTIROW_BYTES, ...; "-" for none). One executor per setting
over the same banks and steps (the bench's decode steps, ``ft_kernels_cpu.bench``); every round
samples the read bandwidth of the same threads, then times one row of steps on each executor, the
order reversed every other round, so the settings see the same state of the machine. Prints per
setting the median us a step, the median of its per-round ratio to the first setting's time, and
the median ratio of weight GB/s to the round's read bandwidth, split by the read bandwidth's mode
(above or below --fast-gbs; the 2-core Zen 5 dev box reads ~45 or ~80 GB/s with 2 threads).

Each executor has buffers of its own, and identical settings can differ by where those lie: on the
dev box three executors with no setting differed by up to 4% (q4_0, batch 1; nvfp4 and gguf 0.5%) and
24% (q4_0, batch 8 sharing its experts). Run identical settings side by side ("-" "-") to see the
size of that for a case, and confirm an effect near it with separate processes.

    python packages/ft-kernels-cpu/tools/env_ab.py nvfp4 --rounds 16 \\
        "FT_CPU_MOE_GATE_UP_SLICE=0 FT_CPU_MOE_PREFETCH=8192" -
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

import ft_kernels_cpu as fk
from ft_kernels_cpu import bench, bench_formats
from ft_kernels_cpu.shapes import get_shape


def make_executor(setting: str, fmt: str, shape, pool: int, banks, threads: int | None, batch: int):
    """An executor made with `setting`'s variables set (then restored), with the bench's layer 0."""
    saved = dict(os.environ)
    try:
        for item in setting.split():
            if item == "-":
                continue
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise SystemExit(f"setting {setting!r}: expected NAME=VALUE items or '-', got {item!r}")
            os.environ[name] = value
        ex = fk.MoeExecutor(shape.hidden, shape.top_k, max_tokens=batch, num_threads=threads)
        bench.add_bench_layer(ex, fmt, shape, pool, banks)
        return ex
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("format")
    p.add_argument("settings", nargs="+", help="NAME=VALUE ... per setting, quoted; '-' for none")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--threads", type=int, default=None, help="pool threads (default: the executor's)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--routing", choices=["distinct", "shared"], default="distinct")
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--min-time", type=float, default=0.1, help="seconds per timed row")
    p.add_argument(
        "--fast-gbs", type=float, default=60.0, help="read GB/s above which a round counts as fast"
    )
    a = p.parse_args()
    if a.rounds < 1 or a.batch < 1:
        raise SystemExit("--rounds and --batch must be >= 1")
    shape = get_shape(a.shape)
    mod = bench_formats.load(a.format)
    rng = np.random.default_rng(0)
    eb = mod.expert_bytes(shape)
    pool = max(2 * shape.top_k * a.batch, -(-max(8 * bench.last_level_cache_bytes(), 1 << 30) // eb))
    banks = bench.place_banks(mod.banks(shape, pool, rng), 0)
    exs = [make_executor(s, a.format, shape, pool, banks, a.threads, a.batch) for s in a.settings]
    x = bench_formats.random_bf16_bits(rng, (a.batch, shape.hidden))
    steps = 4096
    ids = bench.step_routes(rng, steps, a.batch, shape.top_k, pool, a.routing)
    w = rng.random((steps, a.batch, shape.top_k), dtype=np.float32)
    step_bytes = np.array([len(np.unique(ids[s])) * eb for s in range(steps)])
    secs = exs[0].time_runs(0, x, ids[:8], w[:8])
    count = int(min(steps, max(8, a.min_time / max(secs / 8, 1e-6))))
    rows: list[list[tuple[float, float, float]]] = [[] for _ in exs]
    reads, start = [], 0
    for r in range(a.rounds):
        read = exs[0].read_bandwidth_gbs(512 << 20, passes=1)
        reads.append(read)
        if start + count > steps:
            start = 0
        sl = slice(start, start + count)
        idx = range(len(exs)) if r % 2 == 0 else reversed(range(len(exs)))
        for i in idx:
            t = exs[i].time_runs(0, x, ids[sl], w[sl])
            rows[i].append((t / count * 1e6, step_bytes[sl].sum() / t / 1e9 / read, read))
        start += count
    print(
        f"{a.format} {a.shape} threads={exs[0].num_threads} batch={a.batch} {a.routing}: {a.rounds} rounds, "
        f"read GB/s median {statistics.median(reads):.1f} (min {min(reads):.1f}, max {max(reads):.1f})"
    )
    base = [v[0] for v in rows[0]]
    for s, rs in zip(a.settings, rows, strict=True):
        us = [v[0] for v in rs]
        rel = statistics.median(u / b for u, b in zip(us, base, strict=True))
        parts = []
        for name, sel in (
            ("slow", [v[1] for v in rs if v[2] <= a.fast_gbs]),
            ("fast", [v[1] for v in rs if v[2] > a.fast_gbs]),
        ):
            parts.append(f"{name} {statistics.median(sel):.3f} (n={len(sel)})" if sel else f"{name} - (n=0)")
        print(f"  {s:55s} us {statistics.median(us):7.1f}  x{rel:.3f} of the first  ratio {', '.join(parts)}")


if __name__ == "__main__":
    main()
