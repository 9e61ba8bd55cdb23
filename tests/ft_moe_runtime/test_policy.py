"""The fetch-count rules, checked by hand-worked cases (no kernel)."""

from __future__ import annotations

import pytest

from ft_moe_runtime.cache import FetchPolicy, fetch_count, hash_uniform, rounding_from_env


def test_min_wait_balances_pcie_and_cpu_time() -> None:
    # 10 misses, PCIe 30 GB/s, CPU 70 GB/s: fetching 3 waits |3/30 - 7/70| = 0; the rule must pick 3.
    p = FetchPolicy(fraction=0.3, pcie_gbs=30.0, cpu_gbs=70.0)
    assert fetch_count(p, 10, step=1) == 3
    # f = 0.25 of 10 = 2.5: 2 -> |2/30 - 8/70| = 0.048, 3 -> |3/30 - 7/70| = 0: take 3.
    assert fetch_count(FetchPolicy(fraction=0.25, pcie_gbs=30.0, cpu_gbs=70.0), 10, 1) == 3
    # A single miss at f = 0.3 is not fetched (|1/30 - 0| > |0 - 1/70|).
    assert fetch_count(p, 1, 1) == 0


def test_min_wait_tie_takes_the_smaller() -> None:
    # 35 misses at f = 0.3 (10.5): 10 -> |10/30 - 25/70| = 1/42, 11 -> |11/30 - 24/70| = 1/42, an exact
    # tie that float64 division breaks the wrong way (the large-pool lockstep test found it).
    p = FetchPolicy(fraction=0.3, pcie_gbs=30.0, cpu_gbs=70.0)
    assert fetch_count(p, 35, 1) == 10 and fetch_count(p, 65, 1) == 19
    # f is taken in parts per million: 0.3 of 10 is exactly 3, so prefer-fetch takes 3, not the 4 that
    # float arithmetic (0.3 * 10 = 3.0000000000000004) would give.
    assert fetch_count(FetchPolicy(fraction=0.3, rounding="prefer-fetch"), 10, 1) == 3
    assert FetchPolicy(fraction=0.1234567).fraction_ppm == 123457


def test_prefer_fetch_and_cap() -> None:
    assert fetch_count(FetchPolicy(fraction=0.1, rounding="prefer-fetch"), 1, 1) == 1
    assert fetch_count(FetchPolicy(fraction=0.0, rounding="prefer-fetch"), 5, 1) == 0
    assert fetch_count(FetchPolicy(cap=2), 5, 1) == 2 and fetch_count(FetchPolicy(cap=2), 1, 1) == 1


def test_stochastic_is_reproducible_and_unbiased() -> None:
    p = FetchPolicy(fraction=0.35, rounding="stochastic", seed=7)
    counts = [fetch_count(p, 2, step) for step in range(1, 20001)]  # fM = 0.7: 0 or 1
    assert set(counts) == {0, 1}
    assert abs(sum(counts) / len(counts) - 0.7) < 0.02
    assert counts == [fetch_count(p, 2, step) for step in range(1, 20001)]
    assert 0.0 <= hash_uniform(0, 0) < 1.0 and hash_uniform(1, 5) != hash_uniform(2, 5)


def test_env_rounding_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_HYBRID_FETCH_ROUND", "stochastic")
    assert rounding_from_env() == "stochastic"
    monkeypatch.setenv("FT_HYBRID_FETCH_ROUND", "sometimes")
    with pytest.raises(ValueError, match="FT_HYBRID_FETCH_ROUND='sometimes' is unknown"):
        rounding_from_env()
