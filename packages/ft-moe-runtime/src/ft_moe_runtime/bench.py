"""Benchmarks of the runtime on the GPU machine.

    python -m ft_moe_runtime.bench cache [--json]

- ensure: time of one `ensure_experts_hybrid` call that fetches half its misses (every call routes 8
  tokens, or 1, x top-8, uniform or with Zipf skew, over 48 layers of 512 or 1,024 experts), at 2,048
  and 23,197 slots, in a CUDA graph of 100 calls, with the misses and fetches per call next to it
  (target: under 10 us at 23,197 slots); and the same calls with nothing fetched.
- gather: `copy_missing` of 28 experts of the Qwen3-30B-A3B bf16 shape (w13 [1536, 2048] + w2
  [2048, 768] bf16, 9.4 MB each) from pinned host banks into slots, in GB/s, next to a linear pinned
  host-to-device copy of the same bytes in the same run (target ratio >= 0.90).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ft_moe_runtime.cache import ExpertBanks, ExpertSlotCache, FetchPolicy


def _events_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_ensure(
    num_slots: int, log, E: int = 512, tokens: int = 8, fetch: FetchPolicy | None = None, zipf: bool = True
) -> dict:
    L, calls, reps, warm_sets = 48, 100, 20, 40
    cache = ExpertSlotCache(L, E, num_slots)
    p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** (1.1 if zipf else 0.0)
    gen = torch.Generator().manual_seed(0)
    # Fresh routes for every replay (sets 0..reps-1) and for the warm-up (the rest): replaying one set
    # would measure a pool that already holds it.
    shape = (reps + warm_sets, calls, tokens, 8)
    n = shape[0] * calls * tokens * 8
    cdf = torch.cumsum(p / p.sum(), 0)
    draws = torch.searchsorted(cdf, torch.rand(n, dtype=torch.float64, generator=gen), right=True)
    ids_all = draws.clamp_(max=E - 1).view(shape).int().cuda()
    work = ids_all[0].clone()
    fetch = fetch or FetchPolicy(fraction=0.5, rounding="prefer-fetch")
    for w in range(warm_sets):  # warm: until every slot is owned (or the warm-up sets run out)
        work.copy_(ids_all[reps + w])
        for i in range(calls):
            cache.ensure_experts_hybrid(i % L, work[i], fetch)
        if bool((cache.owner >= 0).all()):
            break
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            cache.ensure_experts_hybrid(i % L, work[i], fetch)
    before = cache.stats()
    sets = iter(range(reps))
    ms = _events_ms(lambda: (work.copy_(ids_all[next(sets)]), g.replay()), reps)
    after = cache.stats()
    copy_ms = _events_ms(lambda: work.copy_(ids_all[0]), reps)
    us = (ms - copy_ms) / calls * 1000
    fetched = (after["fetched"] - before["fetched"]) / (reps * calls)
    misses = (after["misses"] - before["misses"]) / (reps * calls)
    log(
        f"  ensure, {num_slots} slots, {L}x{E} experts, {tokens} tokens x top-8"
        f" {'zipf' if zipf else 'uniform'}: {us:.2f} us/call"
        f" ({misses:.2f} misses, {fetched:.2f} fetched per call)"
    )
    return {"bench": "ft_moe_runtime.ensure", "slots": num_slots, "layers": L, "experts": E,
            "tokens": tokens, "routing": "zipf" if zipf else "uniform", "us_per_call": round(us, 2),
            "misses_per_call": round(misses, 2),
            "fetched_per_call": round(fetched, 2)}  # fmt: skip


def bench_gather(log) -> dict:
    E, n, H, I = 64, 28, 2048, 768
    banks = {0: {"w13": torch.randn(E, 2 * I, H).bfloat16(), "w2": torch.randn(E, H, I).bfloat16()}}
    cache = ExpertSlotCache(1, E, n)
    eb = ExpertBanks(banks, n, "cuda")
    ids = torch.arange(n, dtype=torch.int32, device="cuda").view(1, n)
    cache.ensure_experts(0, ids)  # plans all 28
    nbytes = n * 3 * H * I * 2
    gather_ms = _events_ms(lambda: eb.copy_missing(cache, max_plan=n), 10)
    src = eb.banks[0]["w13"][:n]  # pinned, contiguous: the linear copy of the same bytes
    src2 = eb.banks[0]["w2"][:n]
    d1, d2 = torch.empty_like(src, device="cuda"), torch.empty_like(src2, device="cuda")
    copy_ms = _events_ms(lambda: (d1.copy_(src, non_blocking=True), d2.copy_(src2, non_blocking=True)), 10)
    gbs, ceiling = nbytes / gather_ms / 1e6, nbytes / copy_ms / 1e6
    log(
        f"  gather 28 experts: {gbs:.1f} GB/s, linear pinned copy {ceiling:.1f} GB/s,"
        f" ratio {gbs / ceiling:.3f}"
    )
    for slot, key in cache.plan():
        assert torch.equal(eb.slot_view("w2", torch.bfloat16, (H, I))[slot].cpu(), banks[0]["w2"][key])
    return {
        "bench": "ft_moe_runtime.gather",
        "experts": n,
        "gbs": round(gbs, 2),
        "copy_gbs": round(ceiling, 2),
        "ratio": round(gbs / ceiling, 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ft_moe_runtime.bench", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("cache",))
    p.add_argument("--json", action="store_true", help="end with one JSON line per figure")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("the runtime benchmarks need a CUDA GPU")
    log = lambda s: print(s, file=sys.stderr if a.json else sys.stdout, flush=True)  # noqa: E731
    results = [
        bench_ensure(2048, log),
        # 49,152 experts in all, the pool holds under half: uniform routing misses about half the time
        bench_ensure(23197, log, E=1024, zipf=False),
        bench_ensure(23197, log, E=1024),
        bench_ensure(23197, log, E=1024, tokens=1, zipf=False),  # batch-1 decode
        bench_ensure(23197, log, E=1024, zipf=False, fetch=FetchPolicy(cap=0)),  # the same, no victim
        bench_gather(log),
    ]
    if a.json:
        for r in results:
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
