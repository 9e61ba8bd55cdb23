"""What the CPU is, from /proc/cpuinfo, for tests of the executor's vendor and family defaults.

An independent reading: the executor asks CPUID (cpu_features.cpp); these read what Linux reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo to tell the CPU vendor and family")


def cpu_is_intel() -> bool:
    return "GenuineIntel" in _cpuinfo()


def cpu_is_zen5_or_later() -> bool:
    """AuthenticAMD, cpu family 26 (0x1A, Zen 5) or above: the executor's Zen 5 defaults."""
    info = _cpuinfo()
    families = [int(line.split(":")[1]) for line in info.splitlines() if line.startswith("cpu family")]
    return "AuthenticAMD" in info and bool(families) and families[0] >= 26
