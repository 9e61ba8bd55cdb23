"""How many of a step's cache misses a hybrid decode step fetches (the rest run on the CPU)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

Rounding = Literal["min-wait", "stochastic", "prefer-fetch"]
Order = Literal["recent", "lowest-id"]
ROUNDINGS: tuple[str, ...] = ("min-wait", "stochastic", "prefer-fetch")
ORDERS: tuple[str, ...] = ("recent", "lowest-id")
_MASK32 = 0xFFFFFFFF


def rounding_from_env(default: str = "min-wait") -> str:
    """FT_HYBRID_FETCH_ROUND, validated (an unknown value raises, it is never ignored)."""
    value = os.environ.get("FT_HYBRID_FETCH_ROUND", "") or default
    if value not in ROUNDINGS:
        raise ValueError(
            f"FT_HYBRID_FETCH_ROUND={value!r} is unknown; expected one of {', '.join(ROUNDINGS)}"
        )
    return value


@dataclass(frozen=True)
class FetchPolicy:
    """Of M misses, fetch a fixed `cap`, or the fraction `fraction` rounded by `rounding`.

    min-wait: of floor(fM) and floor(fM) + 1, the count that makes the PCIe fetch and the CPU
        compute finish closest together, given `pcie_gbs` and `cpu_gbs` (ties: the smaller);
    stochastic: floor(fM) plus one with probability frac(fM), from a counter-based hash of
        (`seed`, step): reproducible, graph-safe;
    prefer-fetch: ceil(fM).
    `order`: which misses go first: "recent" (most recently routed, ties by lowest id) or "lowest-id".
    """

    cap: int | None = None
    fraction: float | None = None
    rounding: str = "min-wait"
    order: str = "recent"
    pcie_gbs: float = 1.0
    cpu_gbs: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.cap is None) == (self.fraction is None):
            raise ValueError("FetchPolicy needs exactly one of cap (a count) or fraction (0..1)")
        if self.cap is not None and (
            isinstance(self.cap, bool) or not isinstance(self.cap, int) or self.cap < 0
        ):
            raise ValueError(f"cap must be an int >= 0, got {self.cap!r}")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding={self.rounding!r} is unknown; expected one of {', '.join(ROUNDINGS)}")
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} is unknown; expected one of {', '.join(ORDERS)}")
        if not (self.pcie_gbs > 0 and self.cpu_gbs > 0):
            raise ValueError("pcie_gbs and cpu_gbs must be > 0")
        if not 0 <= self.seed <= _MASK32:
            raise ValueError("seed must fit in 32 bits")


def hash_uniform(seed: int, step: int) -> float:
    """A uniform number in [0, 1) from (seed, step): a 32-bit integer mix (the kernel computes the same)."""
    x = (seed * 0x9E3779B1 + (step & _MASK32)) & _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    x ^= x >> 16
    return (x >> 8) / float(1 << 24)


def fetch_count(policy: FetchPolicy, misses: int, step: int) -> int:
    """Reference rule: how many of `misses` to fetch at `step`."""
    if policy.cap is not None:
        return min(policy.cap, misses)
    exact = policy.fraction * misses
    lo = math.floor(exact)
    if policy.rounding == "prefer-fetch":
        n = math.ceil(exact)
    elif policy.rounding == "stochastic":
        n = lo + (1 if hash_uniform(policy.seed, step) < exact - lo else 0)
    else:

        def wait(f: int) -> float:
            return abs(f / policy.pcie_gbs - (misses - f) / policy.cpu_gbs)

        n = lo + 1 if wait(lo + 1) < wait(lo) else lo
    return max(0, min(n, misses))
