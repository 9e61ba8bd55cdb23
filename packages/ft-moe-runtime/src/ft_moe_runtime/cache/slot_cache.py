"""ExpertSlotCache: which experts live in GPU slots, decided on the device.

Device state (fixed addresses, so every call can be captured in a graph):
  slot_of[L * E]  int32  slot of (layer, expert), -1 if not cached
  owner[S]        int32  key (layer * E + expert) in each slot, -1 if empty
  usage[S]        int64  step stamp of each slot's last use, -1 if empty
  seen[L * E]     int64  last step each key was routed (orders misses by recency)
  step            int64  one stamp per call
  plan_slot / plan_src / plan_count: the copy plan of the last call (slot <- key)
  counters        int64  hits, misses, fetched, cpu_routes, overflow; read without a sync

Graph-capture rules: `ensure_experts` and `ensure_experts_hybrid` only launch a kernel on the current
stream and may be captured; the policy (cap or fraction, rounding, order) is baked into the capture.
`reset`, `rebuild` and `stats` must happen outside capture (they allocate, fill or read on the host).
The first call with the most routes per call (the largest batch) must happen before capture: it sizes
the scratch of the victim proposals (a call under capture that would need more raises).
"""

from __future__ import annotations

import torch
import triton

from ft_moe_runtime.cache import kernels as K
from ft_moe_runtime.cache.policy import FetchPolicy, f32

COUNTERS = ("hits", "misses", "fetched", "cpu_routes", "overflow")
_ROUNDING = {
    "min-wait": K.ROUND_MIN_WAIT.value,
    "stochastic": K.ROUND_STOCHASTIC.value,
    "prefer-fetch": K.ROUND_PREFER_FETCH.value,
}


class ExpertSlotCache:
    """Args:
    num_layers, num_experts: the model's MoE layers and experts per layer.
    num_slots: GPU expert slots in all (per-layer: divided evenly, num_slots % num_layers == 0).
    mode: "unified" (one pool for all layers) or "per-layer".
    device: where the state lives (a CUDA device, or CPU under TRITON_INTERPRET=1).
    tile: slots per program of the victim scan (power of two >= 16): a pool range up to `tile` is
        one program with its slots in registers; a larger one is split over programs that propose
        victims, the last of which merges them. Pool ranges are limited to 2^24 slots.
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        num_slots: int,
        *,
        mode: str = "unified",
        device: str | torch.device = "cuda",
        tile: int = 4096,
    ) -> None:
        for name, v in (("num_layers", num_layers), ("num_experts", num_experts), ("num_slots", num_slots)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if mode not in ("unified", "per-layer"):
            raise ValueError(f"mode={mode!r} is unknown; expected 'unified' or 'per-layer'")
        if tile < 16 or tile & (tile - 1):
            raise ValueError(f"tile must be a power of two >= 16, got {tile}")
        self.num_layers, self.num_experts, self.mode, self.tile = num_layers, num_experts, mode, tile
        # the device as tensors report it ('cuda' -> 'cuda:0'), so the device check compares like with like
        self.device = torch.empty(0, device=device).device
        self.rebuild(num_slots)

    def rebuild(self, num_slots: int) -> None:
        """New slot pool of `num_slots` (empty); outside capture."""
        if self.mode == "per-layer" and num_slots % self.num_layers:
            raise ValueError(
                f"num_slots={num_slots} must be a multiple of num_layers={self.num_layers} in per-layer mode"
            )
        per_range = num_slots // self.num_layers if self.mode == "per-layer" else num_slots
        if per_range >= 1 << 24:
            raise ValueError(f"num_slots={num_slots}: a pool range holds at most 2^24 - 1 slots")
        self.num_slots = num_slots
        keys = self.num_layers * self.num_experts
        dev = self.device
        self.slot_of = torch.full((keys,), -1, dtype=torch.int32, device=dev)
        self.owner = torch.full((num_slots,), -1, dtype=torch.int32, device=dev)
        self.usage = torch.full((num_slots,), -1, dtype=torch.int64, device=dev)
        self.seen = torch.full((keys,), -1, dtype=torch.int64, device=dev)
        self.step = torch.zeros(1, dtype=torch.int64, device=dev)
        self.plan_slot = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.plan_src = torch.zeros(num_slots, dtype=torch.int32, device=dev)
        self.plan_count = torch.zeros(1, dtype=torch.int32, device=dev)
        self.counters = torch.zeros(len(COUNTERS), dtype=torch.int64, device=dev)
        self.arrive = torch.zeros(1, dtype=torch.int32, device=dev)  # programs of the running call
        self._host_counters: torch.Tensor | None = None
        self._cand = torch.empty(1, dtype=torch.int64, device=dev)  # victim proposals (multi-chunk pools)

    def reset(self) -> None:
        """Empty every slot and zero the counters, keeping the pool; outside capture."""
        for t, v in ((self.slot_of, -1), (self.owner, -1), (self.usage, -1), (self.seen, -1)):
            t.fill_(v)
        for t in (self.step, self.plan_count, self.counters, self.arrive):
            t.zero_()

    def slot_range(self, layer: int) -> tuple[int, int]:
        if self.mode == "unified":
            return 0, self.num_slots
        per = self.num_slots // self.num_layers
        return layer * per, (layer + 1) * per

    def ensure_experts(self, layer: int, topk_ids: torch.Tensor, clamp: bool = True) -> None:
        """Admit every miss of this layer's routes (LRU) and rewrite `topk_ids` in place to slots."""
        self._launch(layer, topk_ids, None, clamp)

    def ensure_experts_hybrid(
        self, layer: int, topk_ids: torch.Tensor, fetch: FetchPolicy, clamp: bool = True
    ) -> None:
        """Admit a capped share of the misses; rewrite the other missed routes to -1 (CPU)."""
        if not isinstance(fetch, FetchPolicy):
            raise TypeError(f"fetch must be a FetchPolicy, got {type(fetch).__name__}")
        self._launch(layer, topk_ids, fetch, clamp)

    def stats(self) -> dict[str, int]:
        """The device counters (one sync)."""
        return dict(zip(COUNTERS, self.counters.tolist(), strict=True))

    def counters_async(self) -> torch.Tensor:
        """Enqueue a copy of the counters (COUNTERS order) into a pinned host tensor on the current
        stream and return it without a sync: its values are valid once the stream has passed this
        point (e.g. after the step's own synchronization). May be captured (a device-to-host copy)."""
        if self._host_counters is None:
            pin = self.device.type == "cuda"
            self._host_counters = torch.zeros(len(COUNTERS), dtype=torch.int64, pin_memory=pin)
        self._host_counters.copy_(self.counters, non_blocking=True)
        return self._host_counters

    def plan(self) -> list[tuple[int, int]]:
        """The last call's copy plan as (slot, (layer, expert) key) pairs (one sync)."""
        n = int(self.plan_count.item())
        return list(zip(self.plan_slot[:n].tolist(), self.plan_src[:n].tolist(), strict=True))

    def _launch(self, layer: int, ids: torch.Tensor, fetch: FetchPolicy | None, clamp: bool) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int32 or not ids.is_contiguous():
            raise TypeError("topk_ids must be a contiguous int32 tensor")
        if ids.device != self.device:
            raise ValueError(f"topk_ids is on {ids.device}; the cache lives on {self.device}")
        n = ids.numel()
        lo, hi = self.slot_range(layer)
        if fetch is None:
            rounding, cap, frac_ppm = K.ROUND_ALL.value, 0, 0
        elif fetch.cap is not None:
            rounding, cap, frac_ppm = K.ROUND_CAP.value, fetch.cap, 0
        else:
            rounding, cap, frac_ppm = _ROUNDING[fetch.rounding], 0, fetch.fraction_ppm
        policy = fetch or FetchPolicy(cap=0)
        chunk = min(self.tile, max(16, triton.next_power_of_2(hi - lo)))
        n_chunks = triton.cdiv(hi - lo, chunk)
        block_r = max(16, triton.next_power_of_2(n))
        cand = self._proposals(n_chunks * block_r) if n_chunks > 1 else self._cand
        K.ensure_kernel[(n_chunks,)](
            ids, n, self.slot_of, self.owner, self.usage, self.seen, self.step,
            self.plan_slot, self.plan_src, self.plan_count, self.counters,
            cand, self.arrive,
            layer, self.num_experts, lo, hi, n_chunks,
            cap, frac_ppm, f32(policy.pcie_gbs), f32(policy.cpu_gbs), policy.seed,
            ROUNDING=rounding, ORDER_RECENT=policy.order == "recent", CLAMP=clamp,
            BLOCK_R=block_r, CHUNK=chunk, BLOCK_C=triton.next_power_of_2(n_chunks), SINGLE=n_chunks == 1,
            num_warps=8 if chunk >= 2048 else 4,
        )  # fmt: skip

    def _proposals(self, size: int) -> torch.Tensor:
        """Scratch for the programs' victim proposals, grown outside capture only."""
        if self._cand.numel() < size:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"ensure_experts with {size} proposal entries needs scratch allocated outside graph "
                    "capture: make one call with the largest batch (routes per call) before capturing"
                )
            self._cand = torch.empty(size, dtype=torch.int64, device=self.device)
        return self._cand
