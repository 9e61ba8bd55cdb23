"""A pure-Python model of the expert slot cache's contract: the oracle of the Triton kernels.

One call handles one layer's routes of one step:
1. stamp = ++step; every routed (layer, expert) already in a slot is a hit: its slot's usage = stamp.
2. The misses are the distinct (layer, expert) keys not in a slot, each counted once however many
   routes name it. `seen[key]` remembers the last step a key was routed (hit or miss).
3. Fetch F of the M misses (all of them, or per a FetchPolicy), in order: most recently seen first
   (ties: lowest expert id), or lowest expert id first. Each takes the slot of least usage in the
   layer's pool range (ties: lowest slot; empty slots have usage -1); the slot's old key is evicted.
   A slot used in this step is never taken: when none is left the remaining misses are not fetched
   (and, without clamp, each is counted as an overflow, which `stats()` shows and callers check).
4. Routes are rewritten in place: the key's slot, or -1 (the route runs on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ft_moe_runtime.cache.policy import FetchPolicy, fetch_count


@dataclass
class LruReference:
    num_layers: int
    num_experts: int
    num_slots: int
    per_layer: bool = False
    slot_of: list[int] = field(init=False)
    owner: list[int] = field(init=False)
    usage: np.ndarray = field(init=False)  # int64; an array so the victim scan of a large pool is fast
    seen: list[int] = field(init=False)
    step: int = 0
    plan: list[tuple[int, int]] = field(default_factory=list)  # (slot, key) of the last call
    counters: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.slot_of = [-1] * (self.num_layers * self.num_experts)
        self.owner = [-1] * self.num_slots
        self.usage = np.full(self.num_slots, -1, dtype=np.int64)
        self.seen = [-1] * (self.num_layers * self.num_experts)
        self.step = 0
        self.plan = []
        self.counters = {"hits": 0, "misses": 0, "fetched": 0, "cpu_routes": 0, "overflow": 0}

    def pool(self, layer: int) -> range:
        if not self.per_layer:
            return range(self.num_slots)
        per = self.num_slots // self.num_layers
        return range(layer * per, (layer + 1) * per)

    def ensure(
        self, layer: int, ids: list[int], policy: FetchPolicy | None = None, clamp: bool = True
    ) -> list[int]:
        self.step += 1
        stamp = self.step
        E = self.num_experts
        keys = [layer * E + e if e >= 0 else -1 for e in ids]
        firsts: list[int] = []
        hits = 0
        for k in keys:
            if k < 0:
                continue
            if self.slot_of[k] >= 0:
                self.usage[self.slot_of[k]] = stamp
                hits += 1
            if k not in firsts:
                firsts.append(k)
        misses = [k for k in firsts if self.slot_of[k] < 0]
        prev_seen = {k: self.seen[k] for k in firsts}
        for k in firsts:
            self.seen[k] = stamp
        n = len(misses) if policy is None else fetch_count(policy, len(misses), stamp)
        if policy is not None and policy.order == "lowest-id":
            misses.sort()
        else:
            misses.sort(key=lambda k: (-prev_seen[k], k))
        self.plan = []
        pool = self.pool(layer)
        for i, k in enumerate(misses[:n]):
            # least usage; np.argmin returns the first of equal minima, i.e. the lowest slot
            victim = pool.start + int(np.argmin(self.usage[pool.start : pool.stop]))
            if self.usage[victim] == stamp:  # every slot serves this step: nothing left to evict
                if not clamp:
                    self.counters["overflow"] += n - i
                break
            old = self.owner[victim]
            if old >= 0:
                self.slot_of[old] = -1
            self.owner[victim] = k
            self.slot_of[k] = victim
            self.usage[victim] = stamp
            self.plan.append((victim, k))
        out = [self.slot_of[k] if k >= 0 else e for k, e in zip(keys, ids, strict=True)]
        self.counters["hits"] += hits
        self.counters["misses"] += len(misses)
        self.counters["fetched"] += len(self.plan)
        self.counters["cpu_routes"] += sum(1 for k, o in zip(keys, out, strict=True) if k >= 0 and o < 0)
        return out
