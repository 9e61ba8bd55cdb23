"""Benchmark of the CPU MoE executor against the machine's read bandwidth, measured in the same run.

    python -m ft_kernels_cpu.bench --format bf16 --shape qwen3-30b-a3b [--threads N] [--batch 1] [--json]

Each sample times a run of back-to-back decode steps over a rotating set of experts larger than the
last-level cache, between two read-bandwidth samples taken with the same threads (bandwidth drifts on
shared machines, so each timed row is compared with its neighbours). Effective GB/s counts the bytes
of expert weights a step touches (each distinct expert once) over its time; `ratio` is the median of
the per-sample ratios gbs / read_gbs.

With --cache-ceiling each timed row is followed by the same number of steps over one step's experts
held in the last-level cache (a second layer of top_k experts, top_k per token with distinct routing),
between read samples of their own: `cache_gbs` is then the cores' decode throughput with the weight
stream out of the way, and `cache_ratio` (the median of the cached rows' GB/s over the reads around
them) how much of the read the kernels could reach at best. A step that reads its weights from DRAM
is no faster than the same step from the cache, so where cache_ratio is below a ratio target the
target is out of reach on that machine at that time. Where one step's experts fill more than 3/4 of
the last-level cache the keys are null and the log says so.

With --pool-mib N the rotating pool is N MiB of experts instead (at least one step's top_k
experts): a pool that fits a cache measures the kernels' compute throughput out of that cache, e.g.
`--pool-mib 1 --threads 1 --top-k 1` for one core's in-cache GB/s of quantized weight bytes (the log
says which cache level the pool fits; one expert of the larger shapes is bigger than an L2, so the
pool then sits in the last-level cache). The read GB/s column stays the DRAM read bandwidth.

Banks start at multiples of 64 bytes (``empty_aligned``), as torch tensors and pinned memory do;
``--bank-offset B`` starts each bank B bytes past one (numpy's own large arrays: 16) to measure what
a misaligned bank costs.

The banks and the read-bandwidth buffer are on the same pages: transparent huge pages by default (as
numpy places its large arrays where the THP policy allows), 4 KiB pages with ``--pages small``
(``empty_aligned(..., huge_pages=False)``, ``read_bandwidth_gbs(..., huge_pages=False)``). The JSON's
``huge_page_mib`` and ``read_huge_page_mib`` say how much of each the kernel backed with huge pages,
and the log warns when the two differ by more than a tenth.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np

import ft_kernels_cpu as fk
from ft_kernels_cpu import bench_formats
from ft_kernels_cpu.shapes import SHAPES, MoeShape, get_shape


def last_level_cache_bytes() -> int:
    """Largest CPU cache reported by sysfs (a safe 64 MiB when unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except OSError:
        pass
    return best or 64 << 20


def cache_bytes(level: int) -> int:
    """Size of cpu0's unified or data cache of `level` from sysfs (0 when unknown)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            try:
                with open(os.path.join(base, entry, "level")) as f:
                    if int(f.read()) != level:
                        continue
                with open(os.path.join(base, entry, "type")) as f:
                    if f.read().strip() == "Instruction":
                        continue
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
            except (OSError, ValueError):
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            return int(text.rstrip("KMG")) * mult
    except OSError:
        pass
    return 0


def add_bench_layer(
    ex: fk.MoeExecutor, fmt: str, shape: MoeShape, pool: int, banks: dict, layer: int = 0
) -> None:
    """Layer `layer` of `ex`: `pool` experts of the bench's banks of `fmt` for `shape`."""
    ex.add_layer(
        layer,
        fmt,
        num_experts=pool,
        intermediate=shape.intermediate,
        banks=banks,
        activation=shape.activation,
        options=getattr(bench_formats.load(fmt), "OPTIONS", None),
    )


def step_routes(
    rng: np.random.Generator, steps: int, batch: int, top_k: int, pool: int, routing: str
) -> np.ndarray:
    """[steps, batch, top_k] expert ids. Each token takes top_k distinct experts; steps walk the pool
    so that an expert comes back only after the whole pool (far more than the LLC) was read. With
    routing="shared" every token of a step takes the same experts: the step reads top_k experts
    whatever the batch, which measures what the extra tokens cost on top of the weight stream."""
    ids = np.empty((steps, batch, top_k), dtype=np.int32)
    order = np.arange(pool)
    pos = 0
    for s in range(steps):
        for t in range(batch):
            if routing == "shared" and t > 0:
                ids[s, t] = ids[s, 0]
                continue
            if pos + top_k > pool:
                order = rng.permutation(pool)
                pos = 0
            ids[s, t] = order[pos : pos + top_k]
            pos += top_k
    return ids


def bench_format(
    fmt: str,
    shape_name: str,
    threads: int,
    batch: int,
    samples: int,
    min_time: float,
    isa: str | None,
    log: Callable[[str], None],
    prefetch: int | None = None,
    routing: str = "distinct",
    pool_mib: float | None = None,
    top_k: int | None = None,
    bank_offset: int = 0,
    huge_pages: bool = True,
    cache_ceiling: bool = False,
) -> dict:
    shape = get_shape(shape_name)
    if top_k is not None:
        shape = shape._replace(top_k=top_k)
    bench_fmt = bench_formats.load(fmt)
    rng = np.random.default_rng(0)
    llc = last_level_cache_bytes()
    expert_bytes = bench_fmt.expert_bytes(shape)
    # Enough experts that a rotation reads 8x the last-level cache (at least 1 GiB) and never fewer
    # than two steps' worth: an expert is back in a step only after all the others were read.
    # With pool_mib: as many experts as fit in pool_mib MiB, at least one step's top_k (the pool is
    # then re-read every step and stays in whichever cache holds it).
    if pool_mib is None:
        pool = max(2 * shape.top_k * batch, -(-max(8 * llc, 1 << 30) // expert_bytes))
        where = ""
    else:
        pool = max(shape.top_k, int(pool_mib * 2**20) // expert_bytes)
        pool_bytes = pool * expert_bytes
        l2 = cache_bytes(2)
        where = (
            ", fits L2"
            if l2 and pool_bytes <= l2
            else ", fits LLC"
            if pool_bytes <= llc
            else ", larger than the LLC"
        )
    log(
        f"# {fmt} {shape_name}: hidden={shape.hidden} intermediate={shape.intermediate} top_k={shape.top_k} "
        f"batch={batch}, {pool} experts ({pool * expert_bytes / 2**20:.1f} MiB{where}, "
        f"LLC {llc / 2**20:.0f} MiB)"
    )
    t0 = time.perf_counter()
    banks = place_banks(bench_fmt.banks(shape, pool, rng), bank_offset, huge_pages)
    bank_bytes = sum(b.nbytes for b in banks.values())
    huge_bytes = fk.huge_page_bytes(*banks.values())
    log(
        f"# banks built in {time.perf_counter() - t0:.1f} s ({bank_offset} bytes past a 64-byte boundary; "
        + (
            "huge pages not reported by this kernel"
            if huge_bytes is None
            else f"{huge_bytes / 2**20:.0f} of {bank_bytes / 2**20:.0f} MiB on huge pages"
        )
        + ")"
    )

    ex = fk.MoeExecutor(
        shape.hidden, shape.top_k, max_tokens=batch, num_threads=threads, isa=isa, prefetch_bytes=prefetch
    )
    with warnings.catch_warnings():
        if bank_offset:  # asked for: the AlignmentWarning would only repeat it
            warnings.simplefilter("ignore", fk.AlignmentWarning)
        add_bench_layer(ex, fmt, shape, pool, banks)
    # The cache ceiling: layer 1 holds one step's experts (every token its own with distinct
    # routing), re-read every step, so that after its first step they come from the caches.
    cache_experts = shape.top_k * (batch if routing == "distinct" else 1)
    cache_ids = None
    if cache_ceiling:
        cache_mib = cache_experts * expert_bytes / 2**20
        if cache_mib > 0.75 * llc / 2**20:
            log(
                f"# cache ceiling not measured: one step's {cache_experts} experts ({cache_mib:.1f} MiB) "
                f"fill more than 3/4 of the last-level cache ({llc / 2**20:.0f} MiB)"
            )
        else:
            # Their own generator, so that the DRAM rows' data are those of a run without the flag.
            cache_banks = bench_fmt.banks(shape, cache_experts, np.random.default_rng(1))
            cache_banks = place_banks(cache_banks, bank_offset, huge_pages)
            with warnings.catch_warnings():
                if bank_offset:
                    warnings.simplefilter("ignore", fk.AlignmentWarning)
                add_bench_layer(ex, fmt, shape, cache_experts, cache_banks, layer=1)
            per_token = np.arange(cache_experts, dtype=np.int32).reshape(-1, shape.top_k)
            cache_ids = np.broadcast_to(
                per_token if routing == "distinct" else per_token[:1], (batch, shape.top_k)
            )
            log(f"# cache ceiling: {cache_experts} experts ({cache_mib:.1f} MiB) re-read every step")
    x = bench_formats.random_bf16_bits(rng, (batch, shape.hidden))
    steps = 4096
    ids = step_routes(rng, steps, batch, shape.top_k, pool, routing)
    weights = rng.random((steps, batch, shape.top_k), dtype=np.float32)
    step_bytes = np.array([len(np.unique(ids[s])) * expert_bytes for s in range(steps)])

    bw_bytes = max(512 << 20, 8 * llc)
    read = lambda: ex.read_bandwidth_gbs(bw_bytes, passes=1, huge_pages=huge_pages)  # noqa: E731
    read()
    read_huge = ex.read_buffer_huge_page_bytes()
    if huge_bytes is not None and read_huge is not None:
        bank_frac, read_frac = huge_bytes / max(bank_bytes, 1), read_huge / max(ex.read_buffer_bytes, 1)
        log(f"# read buffer: {read_huge / 2**20:.0f} of {ex.read_buffer_bytes / 2**20:.0f} MiB on huge pages")
        if abs(bank_frac - read_frac) > 0.1:
            log(
                f"# warning: {bank_frac:.0%} of the banks but {read_frac:.0%} of the read buffer are on "
                "huge pages (THP policy in /sys/kernel/mm/transparent_hugepage/enabled, or free memory): the "
                "ratio compares different pages"
            )
    # Calibrate the number of steps per timed row to about `min_time` seconds.
    secs = ex.time_runs(0, x, ids[:8], weights[:8])
    count = int(min(steps, max(8, min_time / max(secs / 8, 1e-6))))

    if cache_ids is not None:
        cache_run_ids = np.ascontiguousarray(np.broadcast_to(cache_ids, (count, batch, shape.top_k)))
        ex.time_runs(1, x, cache_run_ids[:8], weights[:8])  # the experts into the caches
    rows = []
    cache_rows = []
    profiles = []
    start = 0
    bw_before = read()
    for i in range(samples):
        if start + count > steps:
            start = 0
        sl = slice(start, start + count)
        ex.reset_pool_profile()
        secs = ex.time_runs(0, x, ids[sl], weights[sl])
        profiles.append(ex.pool_profile())
        bw_after = read()
        gbs = step_bytes[sl].sum() / secs / 1e9
        ceiling = 0.5 * (bw_before + bw_after)
        rows.append((gbs, ceiling, gbs / ceiling, secs / count * 1e6))
        log(
            f"  sample {i}: {gbs:7.1f} GB/s   read {ceiling:7.1f} GB/s   ratio {gbs / ceiling:5.3f}   "
            f"{secs / count * 1e6:8.1f} us/step"
        )
        bw_before = bw_after
        if cache_ids is not None:
            secs = ex.time_runs(1, x, cache_run_ids, weights[sl])
            bw_after = read()
            cache_gbs = count * cache_experts * expert_bytes / secs / 1e9
            ceiling = 0.5 * (bw_before + bw_after)
            cache_rows.append((cache_gbs, cache_gbs / ceiling, secs / count * 1e6))
            log(
                f"            in cache {cache_gbs:7.1f} GB/s   read {ceiling:7.1f} GB/s   ratio "
                f"{cache_gbs / ceiling:5.3f}   {secs / count * 1e6:8.1f} us/step"
            )
            bw_before = bw_after
        start += count

    gbs = statistics.median(r[0] for r in rows)
    read_gbs = statistics.median(r[1] for r in rows)
    us_step = statistics.median(r[3] for r in rows)

    # Per step, in us of one worker: time in pass-1 / pass-2 units, holding a pass-2 unit whose expert's
    # pass 1 runs (barrier), and outside units, of which `join` is before a worker's first unit and
    # `tail` after its last (the rest: claiming units); averaged over workers, median over samples.
    def per_step(key: str) -> float:
        return statistics.median(p[key] / p["runs"] / ex.num_threads * 1e6 for p in profiles)

    profile = {k: round(per_step(k + "_s"), 2) for k in ("wall", "pass1", "pass2", "barrier", "join", "tail")}
    profile["outside"] = round(profile["wall"] - profile["pass1"] - profile["pass2"] - profile["barrier"], 2)
    profile["units1"] = int(profiles[0]["units1"] // profiles[0]["runs"])
    profile["units2"] = int(profiles[0]["units2"] // profiles[0]["runs"])
    log(
        f"  per step and worker (us): pass 1 {profile['pass1']:.1f} in {profile['units1']} units, pass 2 "
        f"{profile['pass2']:.1f} in {profile['units2']}, barrier {profile['barrier']:.1f}, outside units "
        f"{profile['outside']:.1f} (join {profile['join']:.1f}, tail {profile['tail']:.1f}; "
        f"of {profile['wall']:.1f})"
    )
    return {
        "bench": "ft_kernels_cpu",
        "format": fmt,
        "shape": shape_name,
        "threads": ex.num_threads,
        "claims": ex.claims,
        "kernels": ex.layer_kernels(0),
        "batch": batch,
        "routing": routing,
        "top_k": shape.top_k,
        "pool_mib": round(pool * expert_bytes / 2**20, 2),
        "isa": ex.isa,
        "prefetch": ex.layer_prefetch_bytes(0),
        "prefetch_multi": ex.layer_prefetch_bytes(0, 8),
        "prefetch_l1": ex.layer_prefetch_l1_bytes(0),
        "prefetch_l1_multi": ex.layer_prefetch_l1_bytes(0, 8),
        "gate_up_slice": ex.gate_up_slice_bytes,
        "bank_offset": bank_offset,
        "pages": "huge" if huge_pages else "small",
        "huge_page_mib": None if huge_bytes is None else round(huge_bytes / 2**20, 1),
        "read_huge_page_mib": None if read_huge is None else round(read_huge / 2**20, 1),
        "gbs": round(gbs, 2),
        "read_gbs": round(read_gbs, 2),
        "ratio": round(statistics.median(r[2] for r in rows), 4),
        "us_per_step": round(us_step, 2),
        "us_per_token": round(us_step / batch, 2),
        "cache_gbs": round(statistics.median(r[0] for r in cache_rows), 2) if cache_rows else None,
        "cache_ratio": round(statistics.median(r[1] for r in cache_rows), 4) if cache_rows else None,
        "cache_us_per_step": round(statistics.median(r[2] for r in cache_rows), 2) if cache_rows else None,
        "samples": samples,
        "steps_per_sample": count,
        "profile_us": profile,
        "cores": fk.physical_cores(),
        "host": platform.node(),
        "cpu": _cpu_name(),
    }


def place_banks(banks: dict[str, np.ndarray], offset: int, huge_pages: bool = True) -> dict[str, np.ndarray]:
    """The banks copied to start `offset` bytes past a multiple of 64 (each original freed once
    copied, so the pool is held about once), on transparent huge pages or on 4 KiB pages."""
    placed = {}
    for name in list(banks):
        a = banks.pop(name)
        b = fk.empty_aligned(a.nbytes + offset, np.uint8, huge_pages=huge_pages)[offset:]
        b = b.view(a.dtype).reshape(a.shape)
        b[...] = a
        placed[name] = b
    return placed


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ft_kernels_cpu.bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--format",
        default="bf16",
        help=f"weight format, comma-separated formats, or 'all' (formats: {', '.join(fk.weight_formats())})",
    )
    p.add_argument("--shape", default="qwen3-30b-a3b", help=f"shape preset: {', '.join(SHAPES)}")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="worker threads incl. the caller (default: all physical cores, %(default)s)",
    )
    p.add_argument("--batch", type=int, default=1, help="tokens per step (default 1)")
    p.add_argument(
        "--routing",
        choices=("distinct", "shared"),
        default="distinct",
        help="distinct: every token of a step takes its own experts; shared: all take the same ones",
    )
    p.add_argument(
        "--pool-mib",
        type=float,
        default=None,
        help="size of the rotating expert pool in MiB (at least one step's experts; default: 8x the "
        "last-level cache, >= 1 GiB, so that weights come from DRAM). A pool that fits a cache measures "
        "compute throughput, e.g. --pool-mib 1 --threads 1 --top-k 1: one core's in-cache GB/s",
    )
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default: the shape's)")
    p.add_argument("--samples", type=int, default=7, help="timed rows, each between two bandwidth samples")
    p.add_argument("--min-time", type=float, default=0.25, help="seconds per timed row (default 0.25)")
    p.add_argument("--isa", default=None, help="ISA tier (default: best, or $FT_CPU_MOE_ISA)")
    p.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="software prefetch distance, bytes (default: $FT_CPU_MOE_PREFETCH, else 8192; bf16 on AMD: 0 "
        "in one-vector calls)",
    )
    p.add_argument(
        "--bank-offset",
        type=int,
        default=0,
        help="bytes past a 64-byte boundary at which every bank starts, 0-63 (default 0; numpy's large "
        "arrays start at 16)",
    )
    p.add_argument(
        "--pages",
        choices=("huge", "small"),
        default="huge",
        help="pages of the banks and of the read-bandwidth buffer: transparent huge pages (default, as numpy "
        "places its large arrays; madvise(MADV_HUGEPAGE)) or 4 KiB pages (MADV_NOHUGEPAGE)",
    )
    p.add_argument(
        "--cache-ceiling",
        action="store_true",
        help="after each timed row, time the same number of steps over one step's experts held in the "
        "last-level cache: the JSON's cache_gbs and cache_ratio (cache GB/s over the read) say how much of "
        "the read the kernels could reach at best (null where one step's experts fill more than 3/4 of the "
        "last-level cache)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line per format")
    a = p.parse_args(argv)
    if a.batch < 1:
        p.error(f"--batch must be >= 1, got {a.batch}")
    if a.pool_mib is not None and a.pool_mib <= 0:
        p.error(f"--pool-mib must be > 0, got {a.pool_mib}")
    if a.top_k is not None and a.top_k < 1:
        p.error(f"--top-k must be >= 1, got {a.top_k}")
    if not 0 <= a.bank_offset < 64:
        p.error(f"--bank-offset must be in [0, 63], got {a.bank_offset}")
    if a.samples < 1:
        p.error(f"--samples must be >= 1, got {a.samples}")
    threads = a.threads if a.threads is not None else fk.physical_cores()
    if threads < 1:
        p.error(f"--threads must be >= 1, got {threads}")
    formats = fk.weight_formats() if a.format == "all" else a.format.split(",")
    for fmt in formats:
        if fmt not in fk.weight_formats():
            p.error(
                f"--format {fmt!r} is unknown; expected 'all' or a comma-separated list of "
                f"{', '.join(fk.weight_formats())}"
            )
    try:
        get_shape(a.shape)
    except ValueError as e:
        p.error(str(e))

    log = lambda s: print(s, file=sys.stderr if a.json else sys.stdout, flush=True)  # noqa: E731
    results = [
        bench_format(
            f,
            a.shape,
            threads,
            a.batch,
            a.samples,
            a.min_time,
            a.isa,
            log,
            a.prefetch,
            a.routing,
            pool_mib=a.pool_mib,
            top_k=a.top_k,
            bank_offset=a.bank_offset,
            huge_pages=a.pages == "huge",
            cache_ceiling=a.cache_ceiling,
        )
        for f in formats
    ]
    log("")
    cache_cols = f" {'cache GB/s':>10} {'cache ratio':>11}" if a.cache_ceiling else ""
    log(
        f"{'format':<10} {'shape':<16} {'thr':>4} {'batch':>5} {'isa':<12} {'GB/s':>8} {'read GB/s':>10} "
        f"{'ratio':>6} {'us/token':>9}{cache_cols}"
    )
    for r in results:
        cache = ""
        if a.cache_ceiling:
            cache = (
                f" {r['cache_gbs']:>10.1f} {r['cache_ratio']:>11.3f}"
                if r["cache_gbs"] is not None
                else f" {'-':>10} {'-':>11}"
            )
        log(
            f"{r['format']:<10} {r['shape']:<16} {r['threads']:>4} {r['batch']:>5} {r['isa']:<12} "
            f"{r['gbs']:>8.1f} {r['read_gbs']:>10.1f} {r['ratio']:>6.3f} {r['us_per_token']:>9.1f}{cache}"
        )
    if a.json:
        for r in results:
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
