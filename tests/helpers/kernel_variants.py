"""Test variants over ISA tiers and a format's kernel choice, which the executor reads from an
environment variable when a layer is made (FT_CPU_MOE_DSFP4_KERNELS, FT_CPU_MOE_FP8_KERNELS), together
with FT_CPU_MOE_AMX_MIN (from how many vectors a call runs on AMX tiles; "" for the default)."""

from __future__ import annotations

import os

import pytest

Variant = tuple[str, str, str]  # (tier, kernels, FT_CPU_MOE_AMX_MIN)


def tier_fixture(env_name: str, variants: list[Variant]):
    """A fixture for a test module (assign it to `isa`): each variant's tier, with `env_name` and
    FT_CPU_MOE_AMX_MIN set to the variant's values for the test."""
    ids = [f"{t}-{k}" + (f"-min{m}" if m else "") for t, k, m in variants]

    @pytest.fixture(params=variants, ids=ids)
    def isa(request, monkeypatch) -> str:
        tier, kernels, amx_min = request.param
        monkeypatch.setenv(env_name, kernels)
        monkeypatch.setenv("FT_CPU_MOE_AMX_MIN", amx_min)
        return tier

    return isa


def current_variant(env_name: str, tier: str) -> Variant:
    """The variant a test runs, from its tier and the environment its fixture set."""
    return (tier, os.environ[env_name], os.environ["FT_CPU_MOE_AMX_MIN"])
