"""ft-kernels-cpu: the CPU Mixture-of-Experts executor of ft, usable on its own (numpy only).

>>> import ft_kernels_cpu as fk
>>> fk.weight_formats()
['bf16']
>>> ex = fk.MoeExecutor(hidden=2048, top_k=8, max_tokens=8)
>>> ex.add_layer(0, "bf16", num_experts=128, intermediate=768, banks={"w13": w13, "w2": w2})
>>> y = ex.run(0, x, ids, weights)

Other native code runs an executor through ``ex.capsule()`` and the C header in ``get_include()``.
"""

from __future__ import annotations

from pathlib import Path

from ft_kernels_cpu._aligned import BANK_ALIGNMENT, AlignmentWarning, empty_aligned, huge_page_bytes
from ft_kernels_cpu._executor import MoeExecutor
from ft_kernels_cpu._native import native as _native

__version__ = "0.1.0"

KernelError = _native.KernelError
ABI_VERSION: int = _native.ABI_VERSION
CAPSULE_NAME: str = _native.CAPSULE_NAME


def weight_formats() -> list[str]:
    """Names of the registered expert weight formats."""
    return list(_native.weight_formats())


def isa_tiers() -> list[str]:
    """ISA tiers this CPU supports, lowest first (scalar < avx2 < avx512 < avx512_bf16)."""
    return list(_native.isa_tiers())


def isa() -> str:
    """The tier a new executor runs: the best one, or ``$FT_CPU_MOE_ISA`` (which may only lower it)."""
    return _native.resolve_isa("")


def cpu_amx_bf16() -> bool:
    """Whether this process can run AMX-BF16 tiles (CPU, OS state and, on Linux, the permission to
    use tile data, requested on the first call). fp8_block layers of the avx512_bf16 tier put calls of
    several vectors on them when it can, ds_fp4 layers when asked to ($FT_CPU_MOE_FP8_KERNELS,
    $FT_CPU_MOE_DSFP4_KERNELS=amx, $FT_CPU_MOE_AMX_MIN; README)."""
    return bool(_native.cpu_amx_bf16())


def physical_cores() -> int:
    """Physical cores this process may run on (one logical CPU counted per core)."""
    return _native.physical_cores()


def get_include() -> str:
    """Directory holding ``ft_kernels_cpu/moe_abi.h``, the C ABI of executor capsules."""
    return str(Path(__file__).resolve().parent / "include")


__all__ = [
    "ABI_VERSION",
    "BANK_ALIGNMENT",
    "CAPSULE_NAME",
    "AlignmentWarning",
    "KernelError",
    "MoeExecutor",
    "cpu_amx_bf16",
    "empty_aligned",
    "huge_page_bytes",
    "get_include",
    "isa",
    "isa_tiers",
    "physical_cores",
    "weight_formats",
]
