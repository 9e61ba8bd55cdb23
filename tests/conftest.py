"""Shared pytest setup: the `gpu` marker.

A test marked `gpu` is skipped, with the reason, where no GPU is usable. With FT_REQUIRE_GPU=1
(scripts/gpu-check sets it) the same test fails instead, so a GPU run cannot pass by skipping.
"""

from __future__ import annotations

import functools
import os

import pytest

_REQUIRE_GPU_VALUES = {"": False, "0": False, "1": True}


def _require_gpu() -> bool:
    value = os.environ.get("FT_REQUIRE_GPU", "")
    if value not in _REQUIRE_GPU_VALUES:
        raise pytest.UsageError(f"FT_REQUIRE_GPU={value!r}: expected 1, 0 or unset")
    return _REQUIRE_GPU_VALUES[value]


@functools.cache
def _no_gpu_reason() -> str | None:
    """Why no GPU is usable here, or None when one is. torch is imported only when a gpu test runs."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__}: torch.cuda.is_available() is False"
    return None


def pytest_configure(config: pytest.Config) -> None:
    _require_gpu()  # an unknown value is a usage error before anything runs


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = _no_gpu_reason()
    if reason is None:
        return
    if _require_gpu():
        pytest.fail(f"FT_REQUIRE_GPU=1 but no GPU: {reason}", pytrace=False)
    pytest.skip(f"no GPU: {reason}")
