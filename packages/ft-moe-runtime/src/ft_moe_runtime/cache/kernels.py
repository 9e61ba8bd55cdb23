"""The Triton kernel of the slot cache: one program per call does admission, victim selection, the copy
plan and the route rewrite on the device, with fixed addresses, so it can run inside a captured graph.

Victim selection: a pool range up to CHUNK slots (4096 by default) is held in registers by one
program; a larger one is split over one program per CHUNK slots, each of which stamps the hits in its
chunk and proposes the chunk's n_fetch least-used slots, and the last program to arrive (an acq_rel
arrival counter) merges the proposals and admits the misses. Taking the n least-used slots at once is
the same as n successive argmins that each stamp their victim. Usage and slot are packed into one
int64, (usage + 1) << 24 | slot offset, so one min finds the least usage and, among equals, the lowest
slot. Hits are stamped with the step before any candidate is taken, so no hit slot is ever chosen and
no per-route mask is needed. Every route id is loaded before any store, and barriers separate the
admission stores from the rewrite's loads. Limits: 2^24 slots per pool range, 2^39 calls per cache.
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


@triton.jit
def _admit(
    ids_ptr, slot_of_ptr, owner_ptr, usage_ptr, seen_ptr, step_ptr,
    plan_slot_ptr, plan_src_ptr, plan_count_ptr, counters_ptr,
    r, rmask, e, key, valid, first, miss, hit, n_miss, n_fetch, stamp, cand, slot_lo,
    ORDER_RECENT: tl.constexpr, CLAMP: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    # Runs in one program once every hit is stamped; `cand` holds packed (usage + 1) << 24 | slot offset
    # values, at least the n_fetch least-used slots of the pool range (the rest INT64_MAX).
    tl.store(step_ptr, stamp)
    prev_seen = tl.load(seen_ptr + key, mask=valid, other=-1)
    # Every thread's load of seen before any store to it (a key's value is held by several threads).
    tl.debug_barrier()
    tl.store(seen_ptr + key, tl.zeros([BLOCK_R], tl.int64) + stamp, mask=first)
    # Rank of each miss in fetch order, and the key of each rank.
    if ORDER_RECENT:
        better = (prev_seen[None, :] > prev_seen[:, None]) | (
            (prev_seen[None, :] == prev_seen[:, None]) & (key[None, :] < key[:, None])
        )
    else:
        better = key[None, :] < key[:, None]
    rank = tl.sum((better & miss[None, :]).to(tl.int32), axis=1)
    rank = tl.where(miss, rank, BLOCK_R)  # routes that are not misses have no rank
    rank_key = tl.sum(tl.where(rank[None, :] == r[:, None], key[None, :], 0), axis=1)  # [j] -> key

    victim = tl.zeros([BLOCK_R], tl.int32) - 1
    fetched = 0
    overflow = 0
    for j in range(0, n_fetch):
        # The least (usage, slot): ties go to the lowest slot through the packing.
        mn = tl.min(cand, axis=0)
        # A slot stamped in this step serves a route of it: never evict it. The candidates ascend, so
        # once one fails every later one does.
        ok = (mn >> 24) - 1 < stamp
        victim = tl.where((r == j) & ok, slot_lo + (mn & 0xFFFFFF).to(tl.int32), victim)
        fetched += ok.to(tl.int32)
        if not CLAMP:
            overflow += (ok == 0).to(tl.int32)  # a miss that should have been fetched found no slot
        cand = tl.where(cand == mn, INT64_MAX, cand)
    # Admit: victims [0, fetched) take the keys of ranks [0, fetched).
    take = r < fetched
    old = tl.load(owner_ptr + victim, mask=take, other=-1)
    tl.store(slot_of_ptr + tl.maximum(old, 0), tl.zeros([BLOCK_R], tl.int32) - 1, mask=take & (old >= 0))
    tl.debug_barrier()
    tl.store(owner_ptr + victim, rank_key.to(tl.int32), mask=take)
    tl.store(slot_of_ptr + rank_key, victim, mask=take)
    tl.store(usage_ptr + victim, tl.zeros([BLOCK_R], tl.int64) + stamp, mask=take)
    tl.store(plan_slot_ptr + r, victim, mask=take)
    tl.store(plan_src_ptr + r, rank_key.to(tl.int32), mask=take)
    tl.store(plan_count_ptr, fetched)
    tl.debug_barrier()
    # Rewrite: every route id was loaded at the top, before any store.
    out = tl.load(slot_of_ptr + key, mask=valid, other=-1)
    tl.store(ids_ptr + r, tl.where(valid, out, e), mask=rmask)
    tl.atomic_add(counters_ptr + 0, tl.sum(hit.to(tl.int64), axis=0), sem="relaxed")
    tl.atomic_add(counters_ptr + 1, n_miss.to(tl.int64), sem="relaxed")
    tl.atomic_add(counters_ptr + 2, fetched.to(tl.int64), sem="relaxed")
    tl.atomic_add(counters_ptr + 3, tl.sum((valid & (out < 0)).to(tl.int64), axis=0), sem="relaxed")
    tl.atomic_add(counters_ptr + 4, overflow.to(tl.int64), sem="relaxed")


# Runtime scalars that may be 0 or 1 are not specialized: one compiled kernel serves every layer/policy.
@triton.jit(do_not_specialize=["n_routes", "layer", "cap", "frac_ppm", "seed", "n_chunks"])
def ensure_kernel(
    ids_ptr, n_routes, slot_of_ptr, owner_ptr, usage_ptr, seen_ptr, step_ptr,
    plan_slot_ptr, plan_src_ptr, plan_count_ptr, counters_ptr,
    cand_ptr, arrive_ptr,
    layer, num_experts, slot_lo, slot_hi, n_chunks,
    cap, frac_ppm, pcie_gbs, cpu_gbs, seed,
    ROUNDING: tl.constexpr, ORDER_RECENT: tl.constexpr, CLAMP: tl.constexpr,
    BLOCK_R: tl.constexpr, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, SINGLE: tl.constexpr,
):  # fmt: skip
    # One program per CHUNK slots of the layer's pool range. Every program reads the routes and stamps
    # the hits that live in its chunk. SINGLE (one chunk): the program admits from its registers.
    # Otherwise each proposes its chunk's n_fetch least-used slots, and the last program to arrive
    # merges the proposals and admits.
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK_R)
    rmask = r < n_routes
    e = tl.load(ids_ptr + r, mask=rmask, other=-1)
    valid = rmask & (e >= 0)
    key = tl.where(valid, layer * num_experts + e, 0)
    stamp = tl.load(step_ptr) + 1
    s = tl.load(slot_of_ptr + key, mask=valid, other=-1)
    hit = valid & (s >= 0)
    c_lo = slot_lo + pid * CHUNK
    c_hi = tl.minimum(c_lo + CHUNK, slot_hi)
    mine = hit & (s >= c_lo) & (s < c_hi)
    tl.store(usage_ptr + tl.where(mine, s, 0), tl.zeros([BLOCK_R], tl.int64) + stamp, mask=mine)

    # Distinct keys: a route is a key's first occurrence if no earlier valid route has the same key.
    same = (key[:, None] == key[None, :]) & valid[:, None] & valid[None, :]
    earlier = r[None, :] < r[:, None]
    dup = tl.sum((same & earlier).to(tl.int32), axis=1) > 0
    first = valid & (dup == 0)
    miss = first & (s < 0)
    n_miss = tl.sum(miss.to(tl.int32), axis=0)

    # How many misses to fetch (the same in every program).
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

    # The chunk packed as (usage + 1) << 24 | slot offset: one min gives the least usage, ties the
    # lowest slot. A slot stamped above (a hit) has usage == stamp and sorts after every evictable one.
    tl.debug_barrier()
    offs = c_lo + tl.arange(0, CHUNK)
    inside = offs < c_hi
    u = tl.load(usage_ptr + offs, mask=inside, other=0)
    packed = tl.where(inside, ((u + 1) << 24) | (offs - slot_lo).to(tl.int64), INT64_MAX)
    if SINGLE:
        _admit(
            ids_ptr, slot_of_ptr, owner_ptr, usage_ptr, seen_ptr, step_ptr,
            plan_slot_ptr, plan_src_ptr, plan_count_ptr, counters_ptr,
            r, rmask, e, key, valid, first, miss, hit, n_miss, n_fetch, stamp, packed, slot_lo,
            ORDER_RECENT, CLAMP, BLOCK_R,
        )  # fmt: skip
    else:
        for j in range(0, n_fetch):
            mn = tl.min(packed, axis=0)
            tl.store(cand_ptr + pid * BLOCK_R + j, mn)
            packed = tl.where(packed == mn, INT64_MAX, packed)
        tl.debug_barrier()
        arrived = tl.atomic_add(arrive_ptr, 1, sem="acq_rel")
        if arrived == n_chunks - 1:
            # The last program: every proposal and every hit stamp is visible (acquire above).
            tl.store(arrive_ptr, 0)  # ready for the next call (stream order)
            pos = tl.arange(0, BLOCK_C * BLOCK_R)
            pmask = (pos // BLOCK_R < n_chunks) & (pos % BLOCK_R < n_fetch)
            cand = tl.load(cand_ptr + pos, mask=pmask, other=INT64_MAX, cache_modifier=".cg")
            _admit(
                ids_ptr, slot_of_ptr, owner_ptr, usage_ptr, seen_ptr, step_ptr,
                plan_slot_ptr, plan_src_ptr, plan_count_ptr, counters_ptr,
                r, rmask, e, key, valid, first, miss, hit, n_miss, n_fetch, stamp, cand, slot_lo,
                ORDER_RECENT, CLAMP, BLOCK_R,
            )  # fmt: skip
