"""MoeExecutor: numpy front end of the native CPU MoE executor.

Checks every argument before it reaches native code, keeps the weight banks alive, and passes raw
addresses down. Callers that already hold raw memory use ``run_ptr`` and ``(address, nbytes)`` banks.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ft_kernels_cpu._aligned import BANK_ALIGNMENT, AlignmentWarning, huge_page_bytes_at, misaligned_banks
from ft_kernels_cpu._native import native

ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swigluoai", "swiglu_clamp")
MAX_TOP_K = 64

BankLike = Any  # np.ndarray, or (address, nbytes) for zero-copy callers


def _is_bf16(dtype: np.dtype) -> bool:
    return dtype.name in ("bfloat16", "uint16") and dtype.itemsize == 2


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v


def _check_array(
    name: str, a: object, shape: tuple[int, ...], kind: str, writeable: bool = False
) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    ok = {"bf16": _is_bf16(a.dtype), "int32": a.dtype == np.int32, "float32": a.dtype == np.float32}[kind]
    if not ok:
        want = "bfloat16 (ml_dtypes) or uint16 bf16 bits" if kind == "bf16" else kind
        raise TypeError(f"{name} must have dtype {want}, got {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return a


class MoeExecutor:
    """CPU executor for the routed experts of one or more MoE layers.

    Args:
        hidden: model hidden size (rows of x and y).
        top_k: routes per token (at most 64).
        max_tokens: largest batch a single run takes.
        num_threads: worker threads including the calling thread; None picks the physical cores
            available minus one, leaving a core to the thread that drives the GPU.
        isa: ISA tier ("scalar", "avx2", "avx512", "avx512_bf16"); None uses ``$FT_CPU_MOE_ISA`` or
            the best tier of the CPU. A tier the CPU lacks raises.
        prefetch_bytes: software prefetch distance of the weight streams (a multiple of 64 in
            [0, 65536], 0 = hardware prefetch only); None uses ``$FT_CPU_MOE_PREFETCH``, else 8192
            (bf16 layers on AMD then take 0 in one-vector calls; ``layer_prefetch_bytes`` reports a
            layer's distances).
            With ``$FT_CPU_MOE_PREFETCH_L1`` (bytes, a multiple of 64 in [0, 65536]) the far lines go
            to L2 and a second prefetch that many bytes ahead to L1; the default is 2048 with at
            most 2 threads, 1024 with 3 or 4, else 0 (one level); see ``prefetch_l1_bytes`` and
            ``layer_prefetch_l1_bytes`` (in larger pools bf16 layers take two levels at 1024, and
            so do the one-vector calls of q4_0, gguf, mxfp4 and fp8_block layers on Intel; a layer
            without software prefetch reports 0).

    Threading: ``run`` releases the GIL and blocks; concurrent runs on one executor are serialised.
    """

    def __init__(
        self,
        hidden: int,
        top_k: int,
        max_tokens: int,
        num_threads: int | None = None,
        isa: str | None = None,
        prefetch_bytes: int | None = None,
    ) -> None:
        hidden = _check_int("hidden", hidden, 1)
        top_k = _check_int("top_k", top_k, 1, MAX_TOP_K)
        max_tokens = _check_int("max_tokens", max_tokens, 1)
        threads = 0 if num_threads is None else _check_int("num_threads", num_threads, 1, 1024)
        if isa is not None and not isinstance(isa, str):
            raise TypeError(f"isa must be a str or None, got {type(isa).__name__}")
        prefetch = -1 if prefetch_bytes is None else _check_int("prefetch_bytes", prefetch_bytes, 0, 65536)
        self._native = native._Executor(hidden, top_k, max_tokens, threads, isa or "", prefetch)
        self._banks: dict[int, list[object]] = {}
        self._experts: dict[int, int] = {}

    hidden = property(lambda self: self._native.hidden)
    top_k = property(lambda self: self._native.top_k)
    max_tokens = property(lambda self: self._native.max_tokens)
    num_threads = property(lambda self: self._native.num_threads, doc="worker threads, the caller included")
    claims = property(
        lambda self: self._native.claims,
        doc="how workers claim units: 'ranges' (each takes a contiguous range of each pass first) or "
        "'shared' (one counter in order); $FT_CPU_MOE_CLAIMS, else the vendor's default",
    )
    isa = property(lambda self: self._native.isa, doc="ISA tier the kernels run")
    prefetch_bytes = property(lambda self: self._native.prefetch_bytes, doc="software prefetch distance")
    prefetch_l1_bytes = property(
        lambda self: self._native.prefetch_l1_bytes,
        doc="L1 distance of the two-level prefetch (0: one level; $FT_CPU_MOE_PREFETCH_L1)",
    )
    multirow_min_bytes = property(
        lambda self: self._native.multirow_min_bytes,
        doc="least row bytes for which int8 kernels read several rows side by side in calls of one "
        "vector ($FT_CPU_MOE_MULTIROW_BYTES's first value, else 2048 on AMD and 0 on Intel)",
    )
    multirow_several_min_bytes = property(
        lambda self: self._native.multirow_several_min_bytes,
        doc="the same for calls of several vectors ($FT_CPU_MOE_MULTIROW_BYTES's second value, else its "
        "first; default 0 on Intel, 2048 on AMD's Zen 5 and later, 1024 on older AMD)",
    )
    gate_up_slice_bytes = property(
        lambda self: self._native.gate_up_slice_bytes,
        doc="bytes of gate rows, then of up rows, that one-vector pass-1 calls read in turns "
        "(0: all gate rows, then all up rows; $FT_CPU_MOE_GATE_UP_SLICE, else 2048 on AMD Zen 5 "
        "and later, 0 elsewhere)",
    )

    @property
    def layers(self) -> list[int]:
        return list(self._native.layers)

    def layer_format(self, layer: int) -> str:
        return self._native.layer_format(layer)

    def layer_kernels(self, layer: int) -> str | None:
        """The kernels ``layer`` runs, for a format with a choice of them, as its variable names them:
        ds_fp4 ``$FT_CPU_MOE_DSFP4_KERNELS`` (``q8`` is W4A8, the others exact), mxfp4
        ``$FT_CPU_MOE_MXFP4_KERNELS`` (or ``q8a`` / ``fp32`` in the tiers without that choice),
        fp8_block ``$FT_CPU_MOE_FP8_KERNELS`` (or ``fp32`` below avx512_bf16); None for the formats
        with one set of kernels per tier."""
        return self._native.layer_kernels(_check_int("layer", layer, 0)) or None

    def layer_prefetch_bytes(self, layer: int, vectors: int = 1) -> int:
        """Software prefetch distance of ``layer``'s kernel calls over ``vectors`` (1 to 8) tokens or
        routes of one expert (0: hardware prefetch only).

        ``prefetch_bytes``, except that when neither ``prefetch_bytes`` nor ``$FT_CPU_MOE_PREFETCH``
        is set a format may use its own measured default (bf16 on AMD: 0 for one vector).
        """
        layer = _check_int("layer", layer, 0)
        return self._native.layer_prefetch_bytes(layer, _check_int("vectors", vectors, 1, 8))

    def layer_prefetch_l1_bytes(self, layer: int, vectors: int = 1) -> int:
        """L1 distance of the two-level prefetch for ``layer``'s kernel calls over ``vectors`` (1 to
        8) tokens or routes of one expert (0: one level).

        ``prefetch_l1_bytes``, except that unless ``$FT_CPU_MOE_PREFETCH_L1`` is set the calls a
        format measured to gain from two levels at any pool size take 1024 in pools of more than 4
        threads (bf16: every call; q4_0, gguf, mxfp4 and fp8_block: calls of one vector on Intel),
        and a layer without software prefetch in any call (``layer_prefetch_bytes`` 0 for every
        vector count) takes 0.
        """
        layer = _check_int("layer", layer, 0)
        return self._native.layer_prefetch_l1_bytes(layer, _check_int("vectors", vectors, 1, 8))

    def add_layer(
        self,
        layer: int,
        weight_format: str,
        *,
        num_experts: int,
        intermediate: int,
        banks: Mapping[str, BankLike],
        activation: str = "silu",
        options: Mapping[str, float] | None = None,
        router_weight_on_input: bool = False,
    ) -> None:
        """Registers one MoE layer's experts.

        Args:
            layer: layer id used by ``run``; any int >= 0, each added once.
            weight_format: one of ``ft_kernels_cpu.weight_formats()``.
            banks: the format's weight arrays by name (C-contiguous numpy arrays, kept alive by the
                executor) or ``(address, nbytes)`` pairs the caller keeps alive. See the package README
                for each format's banks. A bank of 1 MiB or more whose first byte is not at a multiple
                of 64 (numpy's large arrays start 16 bytes past one) emits an ``AlignmentWarning``:
                allocate banks with ``empty_aligned``.
            activation: silu, gelu, gelu_tanh, swigluoai (options alpha=1.702, limit=7.0), or
                swiglu_clamp (option limit, required).
            options: numeric options of the format and activation; an unused option raises.
            router_weight_on_input: scale each route's input by its router weight instead of its output.
        """
        layer = _check_int("layer", layer, 0)
        num_experts = _check_int("num_experts", num_experts, 1)
        intermediate = _check_int("intermediate", intermediate, 1)
        if not isinstance(weight_format, str):
            raise TypeError(f"weight_format must be a str, got {type(weight_format).__name__}")
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation={activation!r} is unknown; expected one of {', '.join(ACTIVATIONS)}"
            )
        if not isinstance(banks, Mapping):
            raise TypeError(f"banks must be a mapping of name -> array, got {type(banks).__name__}")
        opts: dict[str, float] = {}
        for name, value in (options or {}).items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"options[{name!r}] must be a number, got {type(value).__name__}")
            opts[str(name)] = float(value)

        native_banks: dict[str, tuple[int, int, str]] = {}
        keep: list[object] = []
        for name, bank in banks.items():
            if isinstance(bank, np.ndarray):
                if not bank.flags.c_contiguous:
                    raise ValueError(f"banks[{name!r}] must be C-contiguous (use np.ascontiguousarray)")
                native_banks[name] = (bank.ctypes.data, bank.nbytes, bank.dtype.name)
                keep.append(bank)
            elif (
                isinstance(bank, tuple)
                and len(bank) == 2
                and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in bank)
            ):
                native_banks[name] = (int(bank[0]), int(bank[1]), "")
            else:
                raise TypeError(
                    f"banks[{name!r}] must be a numpy array or an (address, nbytes) tuple, "
                    f"got {type(bank).__name__}"
                )
        for name, offset, nbytes in misaligned_banks(native_banks):
            warnings.warn(
                f"layer {layer} ({weight_format}): banks[{name!r}] ({nbytes / 2**20:.1f} MiB) starts "
                f"{offset} bytes past a multiple of {BANK_ALIGNMENT}, so every load of its rows crosses "
                "a cache line (one Zen 5 core read mxfp4 rows from DRAM at 21-25 GB/s against 30-33 "
                "aligned); allocate banks with ft_kernels_cpu.empty_aligned or copy them into one",
                AlignmentWarning,
                stacklevel=2,
            )
        self._native.add_layer(
            layer,
            weight_format,
            num_experts,
            intermediate,
            activation,
            native_banks,
            opts,
            bool(router_weight_on_input),
        )
        self._banks[layer] = keep
        self._experts[layer] = num_experts

    def _check_task(self, layer: int, x: object, ids: object, weights: object) -> int:
        if layer not in self._experts:
            raise ValueError(f"layer={layer} has not been added (layers: {self.layers})")
        if not isinstance(x, np.ndarray) or x.ndim != 2:
            raise ValueError(f"x must be a 2-D numpy array [num_tokens, {self.hidden}]")
        T = x.shape[0]
        if self.max_tokens < T:
            raise ValueError(f"x has {T} tokens; this executor takes at most max_tokens={self.max_tokens}")
        _check_array("x", x, (T, self.hidden), "bf16")
        _check_array("ids", ids, (T, self.top_k), "int32")
        _check_array("weights", weights, (T, self.top_k), "float32")
        return T

    def run(
        self,
        layer: int,
        x: np.ndarray,
        ids: np.ndarray,
        weights: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Routed-expert output of one layer for a batch.

        Args:
            x: [T, hidden] bf16 hidden states (ml_dtypes.bfloat16 or uint16 bits).
            ids: [T, top_k] int32 expert ids; a negative id skips that route.
            weights: [T, top_k] float32 router weights.
            out: optional [T, hidden] array of x's dtype to write into.

        Returns:
            y [T, hidden], same dtype as x: sum over routes of weight * expert(x).

        Raises:
            TypeError/ValueError on a bad argument; KernelError (a ValueError) for ids out of range.
        """
        T = self._check_task(layer, x, ids, weights)
        if out is None:
            out = np.empty((T, self.hidden), dtype=x.dtype)
        else:
            _check_array("out", out, (T, self.hidden), "bf16", writeable=True)
        self._native.run(layer, T, x.ctypes.data, ids.ctypes.data, weights.ctypes.data, out.ctypes.data)
        return out

    def run_ptr(self, layer: int, num_tokens: int, x: int, ids: int, weights: int, y: int) -> None:
        """``run`` on raw addresses (layouts as in ``run``); only the task's range is checked."""
        self._native.run(layer, num_tokens, x, ids, weights, y)

    def time_runs(
        self,
        layer: int,
        x: np.ndarray,
        ids_seq: np.ndarray,
        weights_seq: np.ndarray,
        out: np.ndarray | None = None,
    ) -> float:
        """Seconds for ``len(ids_seq)`` back-to-back runs, run i routing by ids_seq[i] (benchmarks).

        ``out`` (bf16 or its uint16 bits, [num_tokens, hidden], C-contiguous, writeable), when given,
        receives the last run's output.
        """
        if not isinstance(ids_seq, np.ndarray) or ids_seq.ndim != 3:
            raise ValueError("ids_seq must be a 3-D array [count, num_tokens, top_k]")
        count = ids_seq.shape[0]
        T = self._check_task(
            layer, x, ids_seq[0], weights_seq[0] if isinstance(weights_seq, np.ndarray) else None
        )
        _check_array("ids_seq", ids_seq, (count, T, self.top_k), "int32")
        _check_array("weights_seq", weights_seq, (count, T, self.top_k), "float32")
        if np.any(ids_seq >= self._experts[layer]):
            raise ValueError(f"ids_seq has ids >= num_experts={self._experts[layer]}")
        if out is None:
            out = np.empty((T, self.hidden), dtype=x.dtype)
        else:
            _check_array("out", out, (T, self.hidden), "bf16", writeable=True)
        return self._native.time_runs(
            layer, T, x.ctypes.data, ids_seq.ctypes.data, weights_seq.ctypes.data, count, out.ctypes.data
        )

    def read_bandwidth_gbs(self, nbytes: int = 512 << 20, passes: int = 2, huge_pages: bool = True) -> float:
        """Read bandwidth of this executor's threads streaming ``nbytes`` (kept between calls), GB/s.

        ``huge_pages``: the buffer on transparent huge pages (2 MiB aligned, ``madvise(MADV_HUGEPAGE)``;
        the default, as numpy and ``empty_aligned`` place large banks), else on 4 KiB pages
        (``MADV_NOHUGEPAGE``). Set it to the pages the banks are on: on one Zen 4 core a stream over 4 KiB
        pages read 24 GB/s against 31 over huge pages (docs/benchmarks.md, thirty-first session), so a
        ceiling on other pages than the banks' misstates the ratio. ``read_buffer_huge_page_bytes()``
        says how much of the buffer the kernel backed with huge pages."""
        nbytes = _check_int("nbytes", nbytes, 1 << 20)
        passes = _check_int("passes", passes, 1)
        if not isinstance(huge_pages, bool):
            raise TypeError(f"huge_pages must be a bool, got {huge_pages!r}")
        return self._native.read_bandwidth_gbs(nbytes, passes, huge_pages)

    @property
    def read_buffer_bytes(self) -> int:
        """Size of ``read_bandwidth_gbs``'s buffer (0 before its first call)."""
        return int(self._native.read_buffer_span()[1])

    def read_buffer_huge_page_bytes(self) -> int | None:
        """Bytes of transparent huge pages in the mappings of ``read_bandwidth_gbs``'s buffer (0 before its
        first call; None where the kernel does not report them)."""
        addr, nbytes = self._native.read_buffer_span()
        return huge_page_bytes_at([(addr, nbytes)]) if nbytes else 0

    def pool_profile(self) -> dict[str, float]:
        """Where the worker pool's time went since the last ``reset_pool_profile()``, summed over workers.

        Keys: ``runs``; ``wall_s`` (each run's duration x num_threads); ``pass1_s`` / ``pass2_s`` (inside
        units of each pass); ``barrier_s`` (holding a pass-2 unit while its expert's pass 1 finishes);
        ``units1`` / ``units2``. ``wall_s`` minus those is time outside any unit, of which ``join_s`` is
        from the start of a run to a worker's first unit and ``tail_s`` from its last unit to the end.
        ``read_bandwidth_gbs`` runs on the same pool and counts too. ``chain_links``: weight streams
        whose prefetch ran on into the next one (0 with ``FT_CPU_MOE_CHAIN=0``).
        """
        return dict(self._native.pool_profile())

    def reset_pool_profile(self) -> None:
        """Zeroes the counters behind ``pool_profile()``."""
        self._native.reset_pool_profile()

    def capsule(self) -> object:
        """PyCapsule ``ft_kernels_cpu.moe_executor_abi`` holding the C ABI (see ``get_include()``).

        The capsule keeps this executor and its banks alive for as long as it is referenced.
        """
        return self._native.capsule(self)

    def __repr__(self) -> str:
        return (
            f"MoeExecutor(hidden={self.hidden}, top_k={self.top_k}, max_tokens={self.max_tokens}, "
            f"num_threads={self.num_threads}, isa={self.isa!r}, layers={self.layers})"
        )
