"""The Triton kernel of the slot cache: one program per call does admission, victim selection, the copy
plan and the route rewrite on the device, with fixed addresses, so it can run inside a captured graph.

Victim selection scans the layer's pool range in TILE-wide tiles (8192 by default: a pool up to that
size is one tile in registers; a larger one is scanned from memory tile by tile, per victim). Hits are
stamped with the step before any victim is chosen, so the argmin never picks a slot this step uses and
no per-route mask is needed. Ties go to the lowest slot (tiles ascend, and a later tile must be
strictly smaller to win). Every route id is loaded before any store, and barriers separate the
admission stores from the rewrite's loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Globals a Triton kernel reads must be tl.constexpr instances (Triton >= 3.6 refuses plain ints).
ROUND_CAP, ROUND_MIN_WAIT, ROUND_STOCHASTIC, ROUND_PREFER_FETCH, ROUND_ALL = (
    tl.constexpr(v) for v in range(5)
)
INT64_MAX = tl.constexpr(2**63 - 1)
PPM = tl.constexpr(1_000_000)


@triton.jit
def _hash_bits(seed, step):
    # The same 32-bit mix as policy.hash_uniform, on uint32 lanes (multiplications wrap); the top 24
    # bits, which hash_uniform divides by 2^24.
    x = (seed.to(tl.uint32) * 0x9E3779B1 + step.to(tl.uint32)).to(tl.uint32)
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D).to(tl.uint32)
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B).to(tl.uint32)
    x = x ^ (x >> 16)
    return x >> 8


# Runtime scalars that may be 0 or 1 are not specialized: one compiled kernel serves every layer/policy.
@triton.jit(do_not_specialize=["n_routes", "layer", "cap", "frac_ppm", "seed"])
def ensure_kernel(
    ids_ptr, n_routes, slot_of_ptr, owner_ptr, usage_ptr, seen_ptr, step_ptr,
    plan_slot_ptr, plan_src_ptr, plan_count_ptr, counters_ptr,
    layer, num_experts, slot_lo, slot_hi,
    cap, frac_ppm, pcie_gbs, cpu_gbs, seed,
    ROUNDING: tl.constexpr, ORDER_RECENT: tl.constexpr, CLAMP: tl.constexpr,
    BLOCK_R: tl.constexpr, TILE: tl.constexpr,
):  # fmt: skip
    r = tl.arange(0, BLOCK_R)
    rmask = r < n_routes
    e = tl.load(ids_ptr + r, mask=rmask, other=-1)
    valid = rmask & (e >= 0)
    key = tl.where(valid, layer * num_experts + e, 0)

    stamp = tl.load(step_ptr) + 1
    tl.store(step_ptr, stamp)
    s = tl.load(slot_of_ptr + key, mask=valid, other=-1)
    hit = valid & (s >= 0)
    tl.store(usage_ptr + tl.where(hit, s, 0), tl.zeros([BLOCK_R], tl.int64) + stamp, mask=hit)

    # Distinct keys: a route is a key's first occurrence if no earlier valid route has the same key.
    same = (key[:, None] == key[None, :]) & valid[:, None] & valid[None, :]
    earlier = r[None, :] < r[:, None]
    dup = tl.sum((same & earlier).to(tl.int32), axis=1) > 0
    first = valid & (dup == 0)
    miss = first & (s < 0)
    n_miss = tl.sum(miss.to(tl.int32), axis=0)
    prev_seen = tl.load(seen_ptr + key, mask=valid, other=-1)
    tl.debug_barrier()
    tl.store(seen_ptr + key, tl.zeros([BLOCK_R], tl.int64) + stamp, mask=first)

    # How many misses to fetch.
    if ROUNDING == ROUND_ALL:
        n_fetch = n_miss
    elif ROUNDING == ROUND_CAP:
        n_fetch = tl.minimum(cap, n_miss)
    else:
        # fM = frac_ppm * M / 10^6 in integers; the min-wait products in float64 of float32 inputs are
        # exact (24-bit x 31-bit operands). So a tie is a tie, as in the reference.
        num = frac_ppm.to(tl.int64) * n_miss.to(tl.int64)
        lo = (num // PPM).to(tl.int32)
        rem = num - lo.to(tl.int64) * PPM
        if ROUNDING == ROUND_PREFER_FETCH:
            n_fetch = lo + (rem > 0).to(tl.int32)
        elif ROUNDING == ROUND_STOCHASTIC:
            # u = bits / 2^24 < rem / 10^6  <=>  bits * 10^6 < rem * 2^24
            bits = _hash_bits(seed, stamp).to(tl.int64)
            n_fetch = lo + (bits * PPM < rem * 16777216).to(tl.int32)
        else:
            # |f / pcie - (M - f) / cpu| scaled by pcie * cpu
            m64 = n_miss.to(tl.float64)
            p64 = tl.cast(pcie_gbs, tl.float64)
            c64 = tl.cast(cpu_gbs, tl.float64)
            f_lo = lo.to(tl.float64)
            w_lo = tl.abs(f_lo * c64 - (m64 - f_lo) * p64)
            w_hi = tl.abs((f_lo + 1.0) * c64 - (m64 - f_lo - 1.0) * p64)
            n_fetch = tl.where(w_hi < w_lo, lo + 1, lo)
        n_fetch = tl.maximum(0, tl.minimum(n_fetch, n_miss))

    # Rank of each miss in fetch order.
    if ORDER_RECENT:
        better = (prev_seen[None, :] > prev_seen[:, None]) | (
            (prev_seen[None, :] == prev_seen[:, None]) & (key[None, :] < key[:, None])
        )
    else:
        better = key[None, :] < key[:, None]
    rank = tl.sum((better & miss[None, :]).to(tl.int32), axis=1)
    tl.debug_barrier()

    fetched = 0
    overflow = 0
    active = 1
    for j in range(0, n_fetch):
        k_sel = tl.sum(tl.where(miss & (rank == j), key, 0), axis=0)
        best_val = tl.full([], INT64_MAX, tl.int64)
        best_idx = tl.full([], 0, tl.int32) + slot_lo
        for t0 in range(slot_lo, slot_hi, TILE):
            offs = t0 + tl.arange(0, TILE)
            u = tl.load(usage_ptr + offs, mask=offs < slot_hi, other=INT64_MAX)
            mn = tl.min(u, axis=0)
            ai = tl.argmin(u, axis=0)
            take = mn < best_val
            best_idx = tl.where(take, t0 + ai, best_idx)
            best_val = tl.where(take, mn, best_val)
        # A slot stamped in this step serves a route of it: never evict it.
        ok = (active != 0) & (best_val < stamp)
        if not CLAMP:
            overflow += (ok == 0).to(tl.int32)  # a miss that should have been fetched found no slot
        active = ok.to(tl.int32)
        old = tl.load(owner_ptr + best_idx)
        tl.store(slot_of_ptr + tl.maximum(old, 0), -1, mask=ok & (old >= 0))
        tl.store(owner_ptr + best_idx, k_sel, mask=ok)
        tl.store(slot_of_ptr + k_sel, best_idx.to(tl.int32), mask=ok)
        tl.store(usage_ptr + best_idx, stamp, mask=ok)
        tl.store(plan_slot_ptr + fetched, best_idx.to(tl.int32), mask=ok)
        tl.store(plan_src_ptr + fetched, k_sel, mask=ok)
        fetched += ok.to(tl.int32)
        tl.debug_barrier()
    tl.store(plan_count_ptr, fetched)
    tl.debug_barrier()

    out = tl.load(slot_of_ptr + key, mask=valid, other=-1)
    tl.store(ids_ptr + r, tl.where(valid, out, e), mask=rmask)
    tl.atomic_add(counters_ptr + 0, tl.sum(hit.to(tl.int64), axis=0))
    tl.atomic_add(counters_ptr + 1, n_miss.to(tl.int64))
    tl.atomic_add(counters_ptr + 2, fetched.to(tl.int64))
    tl.atomic_add(counters_ptr + 3, tl.sum((valid & (out < 0)).to(tl.int64), axis=0))
    tl.atomic_add(counters_ptr + 4, overflow.to(tl.int64))
