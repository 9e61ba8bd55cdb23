"""Host expert banks and the gather that copies a call's planned experts into their GPU slots.

Each bank role (e.g. "w13", "w2", scales) has, per layer, one pinned host tensor [E, ...] and one
device slot tensor [S, ...] with the same row size for every layer of the pool. The gather is one
launch for every planned expert of every role: program (i, role, chunk) copies chunk `chunk` of plan
entry i's row from the host bank (read through its mapped address) into the slot. Programs past the
plan's device-side count return at once, so the launch has a fixed grid and can be captured.
Rows that are all multiples of 16 bytes are copied in 8-byte words; any other row size falls back to a
byte-wise copy (slower), with a log line naming the banks.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger("ft_moe_runtime")


@triton.jit
def _gather_kernel(
    plan_slot_ptr, plan_src_ptr, plan_count_ptr, num_experts,
    bank_table_ptr, slot_base_ptr, row_words_ptr, max_row_words,
    BLOCK: tl.constexpr, WORD: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    role = tl.program_id(1)
    chunk = tl.program_id(2)
    if i < tl.load(plan_count_ptr):
        slot = tl.load(plan_slot_ptr + i).to(tl.int64)
        key = tl.load(plan_src_ptr + i)
        layer = key // num_experts
        expert = (key % num_experts).to(tl.int64)
        words = tl.load(row_words_ptr + role)
        # Base addresses as integers: host banks are pinned (mapped into the device's address space).
        if WORD == 8:
            src = tl.load(bank_table_ptr + layer * tl.num_programs(1) + role).to(tl.pointer_type(tl.int64))
            dst = tl.load(slot_base_ptr + role).to(tl.pointer_type(tl.int64))
        else:
            src = tl.load(bank_table_ptr + layer * tl.num_programs(1) + role).to(tl.pointer_type(tl.uint8))
            dst = tl.load(slot_base_ptr + role).to(tl.pointer_type(tl.uint8))
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        m = offs < words
        v = tl.load(src + expert * words + offs, mask=m)
        tl.store(dst + slot * words + offs, v, mask=m)


class ExpertBanks:
    """Pinned host banks of every layer and the device slots they are gathered into.

    Args:
        banks: ``{layer: {role: tensor [E, ...]}}``, every layer with the same roles and row sizes.
            Rows of a multiple of 16 bytes (what real formats have) are gathered in 8-byte words; other
            sizes work too, byte by byte, with a log line.
        num_slots: slots per role, as in the ExpertSlotCache.
        device: where the slots live.
        pin: pin the host banks (after filling them; outside capture). Default: when `device` is a GPU
            (a GPU kernel reads the banks through their mapped addresses, which needs pinned memory).
    """

    def __init__(
        self, banks: dict[int, dict[str, torch.Tensor]], num_slots: int, device, pin: bool | None = None
    ):
        if not banks:
            raise ValueError("banks must hold at least one layer")
        layers = sorted(banks)
        if layers != list(range(len(layers))):
            raise ValueError(f"banks must cover layers 0..{len(layers) - 1} without gaps, got {layers}")
        roles = sorted(banks[0])
        self.num_experts = next(iter(banks[0].values())).shape[0]
        row_bytes = {}
        for layer in layers:
            if sorted(banks[layer]) != roles:
                raise ValueError(f"layer {layer} has bank roles {sorted(banks[layer])}; layer 0 has {roles}")
            for role, t in banks[layer].items():
                if t.device.type != "cpu" or not t.is_contiguous() or t.shape[0] != self.num_experts:
                    want = f"a contiguous CPU tensor [E={self.num_experts}, ...]"
                    raise ValueError(f"banks[{layer}][{role!r}] must be {want}")
                nbytes = t[0].numel() * t.element_size()
                if row_bytes.setdefault(role, nbytes) != nbytes:
                    raise ValueError(
                        f"banks[{layer}][{role!r}] rows are {nbytes} bytes; layer 0 has {row_bytes[role]}"
                    )
        if pin is None:
            pin = torch.device(device).type != "cpu"
        if pin:
            banks = {
                layer: {r: t if t.is_pinned() else t.pin_memory() for r, t in rb.items()}
                for layer, rb in banks.items()
            }
        self.roles, self.banks = roles, banks
        self.device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", as tensors report it
        odd = {r: n for r, n in row_bytes.items() if n % 16}
        self.word = 1 if odd else 8
        if odd:
            log.warning(
                "ExpertBanks: rows of %s are not multiples of 16 bytes; the gather copies bytes (slower)",
                ", ".join(f"{r!r} ({n} B)" for r, n in sorted(odd.items())),
            )
        word_dtype = torch.int64 if self.word == 8 else torch.uint8
        self.row_bytes = dict(row_bytes)
        self.slots = {
            r: torch.empty((num_slots, row_bytes[r] // self.word), dtype=word_dtype, device=self.device)
            for r in roles
        }
        table = [[banks[layer][r].data_ptr() for r in roles] for layer in layers]
        self.bank_table = torch.tensor(table, dtype=torch.int64, device=self.device)
        self.slot_base = torch.tensor(
            [self.slots[r].data_ptr() for r in roles], dtype=torch.int64, device=self.device
        )
        self.row_words = torch.tensor(
            [row_bytes[r] // self.word for r in roles], dtype=torch.int64, device=self.device
        )
        self.max_row_words = max(row_bytes.values()) // self.word

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert over every role: what one slot holds (sizes a pool by memory)."""
        return sum(self.row_bytes.values())

    def slot_view(self, role: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """The slots of `role` as [S, *shape] of `dtype` (what an expert GEMM reads)."""
        return self.slots[role].view(dtype).view(self.slots[role].shape[0], *shape)

    def copy_missing(self, cache, max_plan: int, block: int | None = None) -> None:
        """One launch on the current stream: every expert the cache's last call planned, every role.
        `max_plan` bounds the plan (top_k x max batch); the device-side count decides what runs."""
        block = block or (1024 if self.word == 8 else 4096)
        grid = (max_plan, len(self.roles), triton.cdiv(self.max_row_words, block))
        _gather_kernel[grid](
            cache.plan_slot, cache.plan_src, cache.plan_count, self.num_experts,
            self.bank_table, self.slot_base, self.row_words, self.max_row_words, BLOCK=block, WORD=self.word,
        )  # fmt: skip
