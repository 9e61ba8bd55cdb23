"""Loads the compiled module and says what to do when it cannot."""

from __future__ import annotations

try:
    from ft_kernels_cpu import _ft_kernels_cpu as native
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "ft_kernels_cpu could not load its compiled module _ft_kernels_cpu "
        f"({exc}). It is built by scikit-build-core when the package is installed: reinstall with "
        "`pip install packages/ft-kernels-cpu` (a C++17 compiler, CMake >= 3.18 and pybind11 are needed), "
        "or with `nox -s tests` from the repository root. Importing from the source tree without "
        "installing does not work."
    ) from exc

__all__ = ["native"]
