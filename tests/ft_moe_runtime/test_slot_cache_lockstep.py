"""The slot cache's Triton kernel against the pure-Python model of its contract, call by call.

On the CPU box the kernel runs under TRITON_INTERPRET=1 (small pools); on the GPU machine the same
tests run compiled (`gpu` marker on the large-pool cases)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ft_moe_runtime.cache import COUNTERS, ExpertSlotCache, FetchPolicy, LruReference

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs a GPU, or TRITON_INTERPRET=1 (set by nox -s tests) to run the Triton kernels on the CPU",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def routes(rng: np.random.Generator, kind: str, T: int, K: int, E: int) -> np.ndarray:
    if kind == "zipf":
        p = 1.0 / np.arange(1, E + 1) ** 1.1
        ids = rng.choice(E, size=(T, K), p=p / p.sum())
    else:
        ids = rng.integers(0, E, size=(T, K))
    ids[rng.random((T, K)) < 0.1] = -1
    return ids.astype(np.int32)


def check_state(cache: ExpertSlotCache, ref: LruReference) -> None:
    assert cache.slot_of.tolist() == ref.slot_of
    assert cache.owner.tolist() == ref.owner
    assert cache.usage.tolist() == ref.usage.tolist()
    assert cache.plan() == ref.plan
    assert cache.stats() == ref.counters


POLICIES = {
    "all": None,
    "cap2": FetchPolicy(cap=2),
    "min-wait": FetchPolicy(fraction=0.3, rounding="min-wait", pcie_gbs=30.0, cpu_gbs=70.0),
    "stochastic": FetchPolicy(fraction=0.37, rounding="stochastic", seed=1234),
    "prefer-fetch": FetchPolicy(fraction=0.25, rounding="prefer-fetch", order="lowest-id"),
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(
    ("num_slots", "mode", "tile"),
    [(24, "unified", 32), (40, "unified", 16), (48, "per-layer", 16)],
    ids=["one-program", "three-programs", "per-layer"],
)
@pytest.mark.parametrize("kind", ["uniform", "zipf"])
@pytest.mark.parametrize("clamp", [True, False])
def test_ensure_matches_lru_reference(policy, num_slots, mode, tile, kind, clamp) -> None:
    L, E, T, K = 3, 20, 2, 4
    rng = np.random.default_rng([num_slots, len(policy), len(kind), clamp])
    cache = ExpertSlotCache(L, E, num_slots, mode=mode, device=DEVICE, tile=tile)
    ref = LruReference(L, E, num_slots, per_layer=mode == "per-layer")
    fetch = POLICIES[policy]
    for _ in range(30):  # from an empty pool past a full one
        layer = int(rng.integers(0, L))
        ids = routes(rng, kind, T, K, E)
        dev = torch.from_numpy(ids.copy()).to(DEVICE)
        if fetch is None:
            cache.ensure_experts(layer, dev, clamp=clamp)
        else:
            cache.ensure_experts_hybrid(layer, dev, fetch, clamp=clamp)
        want = ref.ensure(layer, ids.reshape(-1).tolist(), fetch, clamp=clamp)
        assert dev.reshape(-1).tolist() == want
        check_state(cache, ref)


def test_overflow_without_clamp_is_counted() -> None:
    # 4 slots, one call routing 6 distinct experts: 2 misses find no evictable slot.
    cache = ExpertSlotCache(1, 10, 4, device=DEVICE, tile=16)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5]], dtype=torch.int32, device=DEVICE)
    cache.ensure_experts(0, ids, clamp=False)
    assert cache.stats()["overflow"] == 2 and cache.stats()["cpu_routes"] == 2
    host = cache.counters_async()
    if DEVICE == "cuda":
        torch.cuda.current_stream().synchronize()
    assert dict(zip(COUNTERS, host.tolist(), strict=True)) == cache.stats()
    assert ids.tolist() == [[0, 1, 2, 3, -1, -1]]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("num_slots", "mode", "L", "E"),
    [(2048, "unified", 8, 512), (23197, "unified", 48, 512), (12288, "per-layer", 48, 512)],
    ids=["2048-one-program", "23197-six-programs", "per-layer-48x256"],
)
@pytest.mark.parametrize("policy", ["all", "min-wait", "stochastic"])
def test_large_pools_match_lru_reference(num_slots, mode, L, E, policy) -> None:
    # From an empty pool until every slot is owned, then 200 calls of evictions from a full one
    # (a 23,197-slot pool fills its last chunks only after the first: uniform routing gets there).
    rng = np.random.default_rng(num_slots)
    cache = ExpertSlotCache(L, E, num_slots, mode=mode, device=DEVICE)
    ref = LruReference(L, E, num_slots, per_layer=mode == "per-layer")
    fetch = POLICIES[policy]
    full_at = None
    for call in range(20_000):
        layer = int(rng.integers(0, L))
        ids = routes(rng, "zipf" if call % 4 == 3 else "uniform", 8, 8, E)
        dev = torch.from_numpy(ids.copy()).to(DEVICE)
        if fetch is None:
            cache.ensure_experts(layer, dev)
        else:
            cache.ensure_experts_hybrid(layer, dev, fetch)
        assert dev.reshape(-1).tolist() == ref.ensure(layer, ids.reshape(-1).tolist(), fetch), f"call {call}"
        if full_at is None and min(ref.owner) >= 0:
            full_at = call
        if call % 64 == 0:
            check_state(cache, ref)
        if full_at is not None and call >= full_at + 200:
            break
    assert full_at is not None, "the pool never filled: the test did not reach evictions"
    check_state(cache, ref)


@pytest.mark.gpu
def test_back_to_back_calls_on_a_large_pool_stay_consistent() -> None:
    # The route-rewrite race of seed 004: 72,000 calls on 23,197 slots, clamp off, no copy between.
    L, E, S = 48, 512, 23197
    cache = ExpertSlotCache(L, E, S, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ids = torch.empty((8, 8), dtype=torch.int32, device=DEVICE)
    for i in range(72_000):
        ids.random_(0, E, generator=gen)
        cache.ensure_experts_hybrid(i % L, ids, FetchPolicy(fraction=0.5), clamp=False)
    torch.cuda.synchronize()
    owner, slot_of = cache.owner.cpu(), cache.slot_of.cpu()
    used = owner >= 0
    assert torch.equal(slot_of[owner[used].long()], torch.nonzero(used).flatten().int())
    assert int((slot_of >= 0).sum()) == int(used.sum())
    assert cache.stats()["overflow"] == 0


def test_reset_and_rebuild() -> None:
    cache = ExpertSlotCache(2, 8, 6, device=DEVICE, tile=16)
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int32, device=DEVICE)
    cache.ensure_experts(0, ids)
    assert cache.stats()["fetched"] == 3
    cache.reset()
    assert cache.stats() == dict.fromkeys(cache.stats(), 0) and int((cache.owner >= 0).sum()) == 0
    cache.rebuild(4)
    ref = LruReference(2, 8, 4)
    ids = torch.tensor([[5, 6, 5, 7]], dtype=torch.int32, device=DEVICE)
    cache.ensure_experts(1, ids)
    assert ids.reshape(-1).tolist() == ref.ensure(1, [5, 6, 5, 7])
    with pytest.raises(ValueError, match="must be a multiple of num_layers=2 in per-layer mode"):
        ExpertSlotCache(2, 8, 5, mode="per-layer", device=DEVICE)
    with pytest.raises(ValueError, match="FetchPolicy needs exactly one of cap"):
        FetchPolicy()
    with pytest.raises(ValueError, match="rounding='nearest' is unknown"):
        FetchPolicy(fraction=0.5, rounding="nearest")
    with pytest.raises(ValueError, match="a pool range holds at most 2\\^24 - 1 slots"):
        ExpertSlotCache(1, 8, 1 << 24, device=DEVICE)
    with pytest.raises(ValueError, match="cpu_gbs must be a finite number > 0"):
        FetchPolicy(fraction=0.5, cpu_gbs=float("inf"))
