"""How many of a step's cache misses a hybrid decode step fetches (the rest run on the CPU)."""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from fractions import Fraction
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
    f is taken in parts per million (`fraction_ppm`; 0.3 of 10 misses is exactly 3), `pcie_gbs` and
    `cpu_gbs` at float32 precision (what the kernel receives); the rule is then evaluated exactly, so a
    tie is a tie on the device and in the reference alike.
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
        for name in ("pcie_gbs", "cpu_gbs"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1e30):
                raise ValueError(f"{name} must be a finite number > 0 (GB/s), got {v!r}")
        if not 0 <= self.seed <= _MASK32:
            raise ValueError("seed must fit in 32 bits")

    @property
    def fraction_ppm(self) -> int:
        """The fraction in parts per million, as the rule and the kernel use it."""
        return round((self.fraction or 0.0) * PPM)


def hash_uniform(seed: int, step: int) -> float:
    """A uniform number in [0, 1) from (seed, step): a 32-bit integer mix (the kernel computes the same)."""
    x = (seed * 0x9E3779B1 + (step & _MASK32)) & _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    x ^= x >> 16
    return (x >> 8) / float(1 << 24)


PPM = 1_000_000


def f32(x: float) -> float:
    """x rounded to float32 (the precision the kernel takes a bandwidth at)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fetch_count(policy: FetchPolicy, misses: int, step: int) -> int:
    """Reference rule: how many of `misses` to fetch at `step` (exact arithmetic, see FetchPolicy)."""
    if policy.cap is not None:
        return min(policy.cap, misses)
    exact = Fraction(policy.fraction_ppm * misses, PPM)
    lo = math.floor(exact)
    if policy.rounding == "prefer-fetch":
        n = math.ceil(exact)
    elif policy.rounding == "stochastic":
        n = lo + (1 if Fraction(hash_uniform(policy.seed, step)) < exact - lo else 0)
    else:
        pcie, cpu = Fraction(f32(policy.pcie_gbs)), Fraction(f32(policy.cpu_gbs))

        def wait(f: int) -> Fraction:  # |f / pcie - (M - f) / cpu|, scaled by pcie * cpu > 0
            return abs(f * cpu - (misses - f) * pcie)

        n = lo + 1 if wait(lo + 1) < wait(lo) else lo
    return max(0, min(n, misses))
