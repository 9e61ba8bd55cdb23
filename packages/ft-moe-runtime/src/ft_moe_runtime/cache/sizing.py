"""How many expert slots a pool gets: a count, or a memory budget (`--moe-cache-mem`).

A pool must hold at least one layer's worth of slots, top_k x max batch, in each pool range (the
whole pool when unified, each layer's share when per-layer): fewer, and one step's routes could not
all be admitted even with every other slot evicted.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


def parse_bytes(text: str | int) -> int:
    """'24GiB', '12.5GB', '800MiB', '1073741824' -> bytes (binary units are powers of 1024, decimal 1000)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"--moe-cache-mem={text!r} is not a size; expected a number with an optional unit "
                "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 24GiB"
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"--moe-cache-mem={text!r} must be > 0 bytes")
    return n


def pool_slots(
    *,
    num_layers: int,
    top_k: int,
    max_batch: int,
    mode: str = "unified",
    slots: int | None = None,
    mem_bytes: int | str | None = None,
    expert_bytes: int | None = None,
) -> int:
    """The pool's slot count from exactly one of `slots` or `mem_bytes` (with `expert_bytes`, the bytes
    of one expert over all its bank roles, e.g. ``ExpertBanks.expert_bytes``). Per-layer pools are
    rounded down to a multiple of num_layers. Raises if the pool is below one layer's worth."""
    for name, v in (("num_layers", num_layers), ("top_k", top_k), ("max_batch", max_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if mode not in ("unified", "per-layer"):
        raise ValueError(f"mode={mode!r} is unknown; expected 'unified' or 'per-layer'")
    if (slots is None) == (mem_bytes is None):
        raise ValueError("give exactly one of slots (a count) or mem_bytes (--moe-cache-mem)")
    if slots is not None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        n, how = slots, f"slots={slots}"
    else:
        if isinstance(expert_bytes, bool) or not isinstance(expert_bytes, int) or expert_bytes < 1:
            raise ValueError(f"expert_bytes must be an int >= 1 with mem_bytes, got {expert_bytes!r}")
        mem = parse_bytes(mem_bytes)
        n, how = mem // expert_bytes, f"--moe-cache-mem={mem_bytes} ({mem} B / {expert_bytes} B per expert)"
    if mode == "per-layer":
        n -= n % num_layers
    need = top_k * max_batch * (num_layers if mode == "per-layer" else 1)
    if n < need:
        per = " per layer" if mode == "per-layer" else ""
        raise ValueError(
            f"{how} gives {n} slots; a {mode} pool needs at least top_k x max_batch = "
            f"{top_k} x {max_batch} = {top_k * max_batch} slots{per} ({need} in all)"
        )
    return n
