"""Coordinator: the CPU side of a GPU<->CPU bridge.

It owns one IO block (the doorbell and done words, then x / ids / weights / y rows), a thread that
waits for the doorbell, runs the task on an ft_kernels_cpu executor through its C ABI without the GIL,
writes y and sets done, and a watchdog that turns a task stuck past ``timeout_ms`` into an error.
The GPU side (publish / wait / combine on a stream) writes and reads the same block through its
mapped address.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

try:
    from ft_gpusync import _ft_gpusync as _native
except ImportError as exc:  # pragma: no cover - only on broken installs
    raise ImportError(
        f"ft_gpusync could not load its compiled module _ft_gpusync ({exc}); reinstall it with "
        "`pip install --no-build-isolation packages/ft-gpusync` after ft-kernels-cpu, or run `nox -s tests`."
    ) from exc


class CoordinatorError(RuntimeError):
    """A task failed or got stuck on the CPU side; the GPU was released and y of that task is invalid."""


def raise_pending(native: Any, errors: list[str]) -> None:
    """Raises the first error a native coordinator recorded since the last call (kept in `errors`), or a
    standing error once it stopped serving after a stuck task."""
    err = native.take_error()
    if err:
        errors.append(err)
        raise CoordinatorError(err)
    if native.poisoned:
        raise CoordinatorError(f"this bridge stopped serving after a stuck task: {errors[0]}")


def _capsule_of(executor: Any) -> Any:
    if hasattr(executor, "capsule") and callable(executor.capsule):
        return executor.capsule()
    return executor


class Coordinator:
    """CPU side of a bridge for one executor.

    Args:
        executor: an ``ft_kernels_cpu.MoeExecutor`` or its ``capsule()``.
        max_tokens: rows of the IO block (at most the executor's max_tokens).
        hidden, top_k: must equal the executor's.
        timeout_ms: a task running longer is reported as stuck (the GPU is released, the bridge stops
            serving and every later call of ``check`` raises).
    """

    def __init__(self, executor: Any, *, max_tokens: int, hidden: int, top_k: int, timeout_ms: int = 10_000):
        for name, value in (
            ("max_tokens", max_tokens),
            ("hidden", hidden),
            ("top_k", top_k),
            ("timeout_ms", timeout_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        self._native = _native._Coordinator(_capsule_of(executor), max_tokens, hidden, top_k, timeout_ms)
        self.max_tokens, self.hidden, self.top_k = max_tokens, hidden, top_k
        self._errors: list[str] = []

    @property
    def address(self) -> int:
        """Host address of the IO block."""
        return self._native.address

    @property
    def layout(self) -> dict[str, int]:
        """Byte offsets of doorbell, done, x, ids, weights, y in the block, and its size ("bytes")."""
        return dict(self._native.layout)

    @property
    def served(self) -> int:
        """Tasks run to completion."""
        return self._native.served

    def views(self) -> dict[str, np.ndarray]:
        """numpy views of the block: doorbell and done (uint64 [1]), x and y (uint16 bf16 bits
        [max_tokens, hidden]), ids (int32) and weights (float32) [max_tokens, top_k]. They keep this
        coordinator alive."""
        lay = self.layout
        raw = (ctypes.c_uint8 * lay["bytes"]).from_address(self.address)
        raw._owner = self  # type: ignore[attr-defined]
        buf = np.frombuffer(raw, dtype=np.uint8)
        T, H, K = self.max_tokens, self.hidden, self.top_k

        def view(name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            return buf[lay[name] : lay[name] + n].view(dtype).reshape(shape)

        return {
            "doorbell": view("doorbell", np.uint64, (1,)),
            "done": view("done", np.uint64, (1,)),
            "x": view("x", np.uint16, (T, H)),
            "ids": view("ids", np.int32, (T, K)),
            "weights": view("weights", np.float32, (T, K)),
            "y": view("y", np.uint16, (T, H)),
        }

    @staticmethod
    def doorbell_word(layer: int, num_tokens: int) -> int:
        """The doorbell value of a task: layer in the high 32 bits, num_tokens in the low 32."""
        return _native.doorbell_word(layer, num_tokens)

    def check(self) -> None:
        """Raises CoordinatorError if a task failed or got stuck since the last check (or ever got stuck)."""
        raise_pending(self._native, self._errors)

    def close(self) -> None:
        """Stops the threads (waiting for a task inside the executor to return)."""
        self._native.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
