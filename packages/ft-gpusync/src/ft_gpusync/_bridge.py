"""Bridge: the GPU<->CPU handshake of one executor on one device.

``submit`` and ``wait`` only enqueue work on a stream (an integer handle), in eager mode or while a
graph is being captured; the coordinator thread runs the CPU side. The handshake is chosen by probing
at construction (``auto``: kernel, else memop, else host-func) and logged.
"""

from __future__ import annotations

import logging
from typing import Any

from ft_gpusync._coordinator import _capsule_of, _native, raise_pending

log = logging.getLogger("ft_gpusync")

HANDSHAKES = ("auto", "kernel", "memop", "host-func")


class Bridge:
    """Args:
    executor: an ``ft_kernels_cpu.MoeExecutor`` or its ``capsule()``.
    backend: "cuda" or "hip" (the runtime is loaded at run time; ``FT_GPUSYNC_CUDA_LIB`` /
        ``FT_GPUSYNC_HIP_LIB`` name another library).
    device: GPU ordinal. max_tokens, hidden, top_k: as the executor's (max_tokens may be smaller).
    handshake: "auto", "kernel", "memop" or "host-func".
    timeout_ms: a CPU task running longer is released and reported (see ``check``).
    """

    def __init__(
        self,
        executor: Any,
        *,
        backend: str = "cuda",
        device: int = 0,
        max_tokens: int,
        hidden: int,
        top_k: int,
        handshake: str = "auto",
        timeout_ms: int = 10_000,
    ) -> None:
        if handshake not in HANDSHAKES:
            raise ValueError(f"handshake={handshake!r} is unknown; expected one of {', '.join(HANDSHAKES)}")
        self._runtime = _native._Runtime(backend)
        if not self._runtime.available:
            raise RuntimeError(f"no {backend} runtime: {self._runtime.reason}")
        self._native = _native._Bridge(
            self._runtime, _capsule_of(executor), device, max_tokens, hidden, top_k, handshake, timeout_ms
        )
        self.backend, self.device = backend, device
        self._errors: list[str] = []
        log.info(
            "ft_gpusync bridge on %s:%d: handshake=%s (%s)", backend, device, self.handshake, self.detail
        )

    @property
    def handshake(self) -> str:
        """The handshake in use: "kernel", "memop" or "host-func"."""
        return self._native.handshake

    @property
    def detail(self) -> str:
        """Why this handshake: the probe results."""
        return self._native.detail

    @property
    def served(self) -> int:
        """CPU tasks run to completion (steps without CPU routes are not rung with the kernel handshake)."""
        return self._native.served

    def submit(self, stream: int, layer: int, x: int, ids: int, weights: int, num_tokens: int) -> None:
        """Enqueue: hand this layer's CPU routes to the coordinator. Device addresses: x [T, hidden]
        bf16, ids [T, top_k] int32 (< 0: not a CPU route), weights [T, top_k] f32."""
        self.check()
        self._native.submit(stream, layer, x, ids, weights, num_tokens)

    def wait(self, stream: int, out: int, accumulate: bool = False) -> None:
        """Enqueue: wait for the CPU result of the last submit, then write it into ``out`` [T, hidden]
        bf16, or add it into the GPU partial there (``accumulate``)."""
        self._native.wait(stream, out, accumulate)

    def check(self) -> None:
        """Raises CoordinatorError for a CPU task that failed or got stuck since the last check."""
        raise_pending(self._native, self._errors)
