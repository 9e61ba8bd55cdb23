"""The GPU expert slot cache: LRU admission, hybrid capped fetch, the copy plan (issue #5)."""

from ft_moe_runtime.cache.gather import ExpertBanks
from ft_moe_runtime.cache.policy import FetchPolicy, fetch_count, hash_uniform, rounding_from_env
from ft_moe_runtime.cache.reference import LruReference
from ft_moe_runtime.cache.sizing import parse_bytes, pool_slots
from ft_moe_runtime.cache.slot_cache import COUNTERS, ExpertSlotCache

__all__ = [
    "COUNTERS",
    "ExpertBanks",
    "ExpertSlotCache",
    "FetchPolicy",
    "LruReference",
    "fetch_count",
    "hash_uniform",
    "parse_bytes",
    "pool_slots",
    "rounding_from_env",
]
