"""The gather copies exactly the planned experts of every bank role into their slots."""

from __future__ import annotations

import os

import pytest
import torch

from ft_moe_runtime.cache import ExpertBanks, ExpertSlotCache

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs a GPU, or TRITON_INTERPRET=1 (set by nox -s tests) to run the Triton kernels on the CPU",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_copy_missing_moves_every_planned_expert_of_every_role() -> None:
    L, E, S = 3, 6, 5
    g = torch.Generator().manual_seed(0)
    banks = {
        layer: {
            "w13": torch.randint(-(2**15), 2**15, (E, 8, 12), dtype=torch.int16, generator=g),  # 192 B rows
            "w2": torch.randint(0, 255, (E, 40), dtype=torch.uint8, generator=g),  # 40 B rows
        }
        for layer in range(L)
    }
    cache = ExpertSlotCache(L, E, S, device=DEVICE, tile=16)
    eb = ExpertBanks(banks, S, DEVICE)
    eb.slots["w13"].zero_()
    eb.slots["w2"].zero_()
    for layer, ids in [(0, [1, 4]), (2, [4, 5, 0]), (1, [3]), (0, [1, 2])]:
        t = torch.tensor([ids], dtype=torch.int32, device=DEVICE)
        cache.ensure_experts(layer, t)
        eb.copy_missing(cache, max_plan=4, block=16)
        for slot, key in cache.plan():
            lay, e = divmod(key, E)
            assert torch.equal(eb.slot_view("w13", torch.int16, (8, 12))[slot].cpu(), banks[lay]["w13"][e])
            assert torch.equal(eb.slot_view("w2", torch.uint8, (40,))[slot].cpu(), banks[lay]["w2"][e])
    # Every cached expert's slot holds its bytes (earlier copies were not disturbed by later ones).
    owner = cache.owner.cpu()
    for slot in range(S):
        if owner[slot] >= 0:
            lay, e = divmod(int(owner[slot]), E)
            assert torch.equal(eb.slot_view("w2", torch.uint8, (40,))[slot].cpu(), banks[lay]["w2"][e])


def test_rows_not_multiple_of_16_fall_back_to_bytes(caplog: pytest.LogCaptureFixture) -> None:
    L, E, S = 2, 5, 3
    g = torch.Generator().manual_seed(1)
    banks = {
        layer: {
            "a": torch.randint(0, 255, (E, 7), dtype=torch.uint8, generator=g),  # 7 B rows
            "b": torch.randint(0, 255, (E, 48), dtype=torch.uint8, generator=g),
        }
        for layer in range(L)
    }
    with caplog.at_level("WARNING", logger="ft_moe_runtime"):
        eb = ExpertBanks(banks, S, DEVICE)
    assert eb.word == 1 and "'a' (7 B)" in caplog.text and "gather copies bytes" in caplog.text
    assert eb.expert_bytes == 55
    cache = ExpertSlotCache(L, E, S, device=DEVICE, tile=16)
    t = torch.tensor([[4, 0, 2]], dtype=torch.int32, device=DEVICE)
    cache.ensure_experts(1, t)
    eb.copy_missing(cache, max_plan=3, block=16)
    for slot, key in cache.plan():
        lay, e = divmod(key, E)
        assert torch.equal(eb.slot_view("a", torch.uint8, (7,))[slot].cpu(), banks[lay]["a"][e])
        assert torch.equal(eb.slot_view("b", torch.uint8, (48,))[slot].cpu(), banks[lay]["b"][e])


def test_bank_checks() -> None:
    ok = {0: {"w": torch.zeros((4, 16), dtype=torch.uint8)}}
    with pytest.raises(ValueError, match=r"layer 1 has bank roles \['v'\]; layer 0 has \['w'\]"):
        ExpertBanks({0: ok[0], 1: {"v": torch.zeros((4, 16), dtype=torch.uint8)}}, 2, DEVICE)
    with pytest.raises(ValueError, match="rows are 24 bytes; layer 0 has 16"):
        ExpertBanks({0: ok[0], 1: {"w": torch.zeros((4, 24), dtype=torch.uint8)}}, 2, DEVICE)
    with pytest.raises(ValueError, match="without gaps"):
        ExpertBanks({1: ok[0]}, 2, DEVICE)
