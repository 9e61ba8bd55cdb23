"""Test variants over ISA tiers and a format's kernel choice, which the executor reads from an
environment variable when a layer is made (FT_CPU_MOE_DSFP4_KERNELS, FT_CPU_MOE_FP8_KERNELS,
FT_CPU_MOE_Q4_0_GATHER), together with FT_CPU_MOE_AMX_MIN (from how many vectors a call runs on AMX
tiles; "" for the default) and, where a variant has a fourth value, FT_CPU_MOE_MULTIROW_BYTES (from
how many bytes a row the kernels read rows side by side; "" for the default)."""

from __future__ import annotations

import os

import pytest

import ft_kernels_cpu as fk

# (tier, kernels, FT_CPU_MOE_AMX_MIN) or (tier, kernels, FT_CPU_MOE_AMX_MIN, FT_CPU_MOE_MULTIROW_BYTES)
Variant = tuple[str, ...]


def variant_id(variant: Variant) -> str:
    tier, kernels, amx_min, *multirow = variant
    return (
        f"{tier}-{kernels}" + (f"-min{amx_min}" if amx_min else "") + "".join(f"-rows{m}" for m in multirow)
    )


def tier_fixture(env_name: str, variants: list[Variant]):
    """A fixture for a test module (assign it to `isa`): each variant's tier, with `env_name`,
    FT_CPU_MOE_AMX_MIN and FT_CPU_MOE_MULTIROW_BYTES set to the variant's values for the test."""

    @pytest.fixture(params=variants, ids=[variant_id(v) for v in variants])
    def isa(request, monkeypatch) -> str:
        tier, kernels, amx_min, *multirow = request.param
        monkeypatch.setenv("FT_CPU_MOE_MULTIROW_BYTES", multirow[0] if multirow else "")
        monkeypatch.setenv(env_name, kernels)
        monkeypatch.setenv("FT_CPU_MOE_AMX_MIN", amx_min)
        return tier

    return isa


def multirow_tier_fixture():
    """A tier fixture for the formats with 4-row one-vector kernels (nvfp4): every tier, and
    avx512_bf16 twice more, with FT_CPU_MOE_MULTIROW_BYTES=0 and =1048576, so that those kernels read
    4 rows side by side at every row length, and never (by default it depends on the CPU and the
    format: nvfp4 reads 4 rows at every length where the software prefetch is on, unless the variable
    is set)."""
    tiers = fk.isa_tiers()
    extra = [("avx512_bf16", "0", ""), ("avx512_bf16", "1048576", "")]
    variants = [(t, "", "") for t in tiers] + extra * ("avx512_bf16" in tiers)
    return tier_fixture("FT_CPU_MOE_MULTIROW_BYTES", variants)


def q4_0_tier_fixture():
    """A tier fixture for the formats with Q4_0 rows (q4_0, gguf): every tier, the avx512_bf16 tier
    once with each way its Q4_0 kernels gather a group's codes and scales (FT_CPU_MOE_Q4_0_GATHER
    dwords and words: the same results bit for bit, which test_q4_0.py checks), each also with
    FT_CPU_MOE_MULTIROW_BYTES=0 (multirow_tier_fixture)."""
    tiers = fk.isa_tiers()
    variants: list[Variant] = [(t, "", "") for t in tiers if t != "avx512_bf16"]
    if "avx512_bf16" in tiers:
        for gather in ("dwords", "words"):
            variants += [("avx512_bf16", gather, ""), ("avx512_bf16", gather, "", "0")]
    return tier_fixture("FT_CPU_MOE_Q4_0_GATHER", variants)


def current_variant(env_name: str, tier: str) -> Variant:
    """The variant a test runs, from its tier and the environment its fixture set."""
    multirow = os.environ["FT_CPU_MOE_MULTIROW_BYTES"]
    return (tier, os.environ[env_name], os.environ["FT_CPU_MOE_AMX_MIN"]) + ((multirow,) if multirow else ())


def assert_kernel_choice_errors(
    monkeypatch,
    env_name: str,
    values: str,
    add_layer,
    tiers: list[str],
    tiered=(("bf16", "avx512_bf16"), ("amx", "avx512_bf16")),
) -> None:
    """The errors of a kernel choice: an unknown value, each (choice, lowest tier) of `tiered` in the
    scalar tier, amx on a CPU without AMX-BF16 tiles (where the tier exists), a bad FT_CPU_MOE_AMX_MIN
    (where tiles run). add_layer(tier) makes an executor of that tier and adds a layer; values: the
    error's list of accepted values ("auto, bf16 or amx")."""

    def add(tier: str, kernels: str) -> None:
        monkeypatch.setenv(env_name, kernels)
        add_layer(tier)

    with pytest.raises(fk.KernelError, match=rf"{env_name}='fast' is unknown; expected {values}"):
        add("scalar", "fast")
    for kernels, lowest in tiered:
        message = rf"{env_name}='{kernels}' needs the {lowest} tier; this layer runs tier 'scalar'"
        with pytest.raises(fk.KernelError, match=message):
            add("scalar", kernels)
    add("scalar", "auto")
    if "avx512_bf16" in tiers and not fk.cpu_amx_bf16():
        with pytest.raises(fk.KernelError, match=rf"{env_name}='amx': this CPU or OS does not run AMX-BF16"):
            add("avx512_bf16", "amx")
    if fk.cpu_amx_bf16():
        for bad in ("0", "9", "four"):
            monkeypatch.setenv("FT_CPU_MOE_AMX_MIN", bad)
            with pytest.raises(
                fk.KernelError, match=rf"FT_CPU_MOE_AMX_MIN='{bad}' must be an integer from 1 to 8"
            ):
                add("avx512_bf16", "amx")
        monkeypatch.setenv("FT_CPU_MOE_AMX_MIN", "")
