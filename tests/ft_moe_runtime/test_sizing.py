"""Pool sizing by count or memory, against hand-worked numbers."""

from __future__ import annotations

import pytest

from ft_moe_runtime.cache import parse_bytes, pool_slots


def test_parse_bytes() -> None:
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("12.5GB") == 12_500_000_000
    assert parse_bytes(" 800 MiB ") == 800 * 2**20
    assert parse_bytes("4096") == 4096 and parse_bytes(4096) == 4096
    for bad in ("", "12 parsecs", "-3GB", "0", "GiB"):
        with pytest.raises(ValueError, match="--moe-cache-mem="):
            parse_bytes(bad)


def test_pool_by_memory() -> None:
    # Qwen3-30B-A3B bf16 expert: 3 x 2048 x 768 x 2 B = 9,437,184 B; 24 GiB holds 2730 of them.
    e = 3 * 2048 * 768 * 2
    assert pool_slots(num_layers=48, top_k=8, max_batch=4, mem_bytes="24GiB", expert_bytes=e) == 2730
    # per-layer: rounded down to a multiple of 48 (2730 -> 2688, 56 per layer)
    assert (
        pool_slots(num_layers=48, top_k=8, max_batch=4, mode="per-layer", mem_bytes="24GiB", expert_bytes=e)
        == 2688
    )


def test_pool_minimum_and_arguments() -> None:
    assert pool_slots(num_layers=48, top_k=8, max_batch=4, slots=32) == 32
    with pytest.raises(ValueError, match=r"slots=31 gives 31 slots; a unified pool needs at least top_k x "):
        pool_slots(num_layers=48, top_k=8, max_batch=4, slots=31)
    with pytest.raises(ValueError, match=r"32 slots per layer \(1536 in all\)"):
        pool_slots(num_layers=48, top_k=8, max_batch=4, mode="per-layer", slots=1535)
    with pytest.raises(ValueError, match="exactly one of slots"):
        pool_slots(num_layers=48, top_k=8, max_batch=4)
    with pytest.raises(ValueError, match="expert_bytes must be an int >= 1"):
        pool_slots(num_layers=48, top_k=8, max_batch=4, mem_bytes="1GiB")
    with pytest.raises(ValueError, match="mode='ring' is unknown"):
        pool_slots(num_layers=48, top_k=8, max_batch=4, mode="ring", slots=64)
