"""The C ABI capsule, the installed header, ISA selection and every argument check."""

from __future__ import annotations

import gc
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ft_kernels_cpu as fk
from ft_kernels_cpu._native import native
from helpers.checks import assert_add_layer_refused, random_bf16_executor
from helpers.cpu import cpu_is_intel, cpu_is_zen5_or_later
from helpers.moe_reference import BF16

H, I, E, TOP_K = 64, 32, 4, 2


def small_executor(**kw) -> fk.MoeExecutor:
    return random_bf16_executor(H, I, E, TOP_K, max_tokens=4, **kw)


def task(T: int = 2):
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((T, H)).astype(BF16),
        rng.integers(0, E, (T, TOP_K)).astype(np.int32),
        rng.random((T, TOP_K)).astype(np.float32),
    )


def test_capsule_runs_through_the_c_abi_and_keeps_the_executor_alive() -> None:
    ex = small_executor(num_threads=2)
    x, ids, w = task()
    expect = ex.run(0, x, ids, w).view(np.uint16).copy()
    cap = ex.capsule()
    del ex
    gc.collect()
    y = np.zeros((2, H), np.uint16)
    native._run_through_capsule(cap, 0, 2, x.ctypes.data, ids.ctypes.data, w.ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, expect)
    bad = ids.copy()
    bad[1, 0] = E
    with pytest.raises(ValueError, match=r"C ABI failed: ids\[1, 0\]=4 is out of range"):
        native._run_through_capsule(cap, 0, 2, x.ctypes.data, bad.ctypes.data, w.ctypes.data, y.ctypes.data)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH to compile the header")
def test_header_is_plain_c(tmp_path: Path) -> None:
    header = Path(fk.get_include()) / "ft_kernels_cpu" / "moe_abi.h"
    assert header.is_file()
    src = tmp_path / "use.c"
    src.write_text(
        '#include "ft_kernels_cpu/moe_abi.h"\n'
        "int call(ft_moe_executor_abi* a, ft_moe_task* t) {\n"
        "  return a->abi_version == FT_MOE_ABI_VERSION ? a->run(a->self, t) : -1; }\n"
    )
    subprocess.run(
        ["cc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", "-I", fk.get_include(), str(src)], check=True
    )
    assert fk.CAPSULE_NAME == "ft_kernels_cpu.moe_executor_abi"


def tls_block_bytes(path: str) -> int | None:
    """p_memsz of the PT_TLS program header of a 64-bit little-endian ELF file (None: no such header)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not a 64-bit little-endian ELF"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        (p_type,) = struct.unpack_from("<I", data, phoff + i * phentsize)
        if p_type == 7:  # PT_TLS
            return struct.unpack_from("<Q", data, phoff + i * phentsize + 0x28)[0]
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="ELF module")
def test_module_tls_block_fits_the_static_reserve() -> None:
    # The kernels' per-call settings use the initial-exec TLS model (stream_prefetch.h), so the
    # module's whole TLS block is placed in the static TLS space that glibc reserves for libraries
    # loaded at run time (512 bytes by default, shared with any other such library): a large
    # thread_local added to the module would make its import fail on a busy process.
    size = tls_block_bytes(native.__file__)
    assert size is not None, "the module has no TLS block: the kernels' settings are no longer thread-locals?"
    # 80 bytes with the dev box's GCC 12 and 128 with the GPU machine's toolchain since the kernels'
    # per-thread objects live on the heap (ThreadObjects, common.h); with a thread-local of each it had
    # grown to 320 and 424, and this test failed there (docs/benchmarks.md, thirty-seventh session).
    assert size <= 384, f"the module's TLS block is {size} bytes; keep large per-thread data on the heap"


def test_isa_env_lowers_the_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_CPU_MOE_ISA", "scalar")
    assert fk.isa() == "scalar"
    assert small_executor().isa == "scalar"
    monkeypatch.setenv("FT_CPU_MOE_ISA", "avx9000")
    with pytest.raises(ValueError, match="FT_CPU_MOE_ISA='avx9000' is not an ISA tier"):
        fk.MoeExecutor(hidden=H, top_k=1, max_tokens=1)


ALL_TIERS = ["scalar", "avx2", "avx512", "avx512_bf16"]

# What each tier needs beyond the one below it, in Linux's /proc/cpuinfo flag names (the kernel reads
# CPUID itself, and Linux drops the AVX flags when the OS does not save their registers).
TIER_FLAGS = {
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx512f", "avx512dq", "avx512bw", "avx512vl"},
    "avx512_bf16": {"avx512_bf16", "avx512_vnni", "avx512vbmi", "gfni"},
}


def test_best_tier_follows_the_cpu_flags() -> None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU flags from")
    flags_lines = [ln for ln in lines if ln.startswith("flags")]
    if not flags_lines:
        pytest.skip("/proc/cpuinfo has no x86 flags line")
    flags = set(flags_lines[0].split(":", 1)[1].split())
    expected = "scalar"
    for tier in ["avx2", "avx512", "avx512_bf16"]:
        if not TIER_FLAGS[tier] <= flags:
            break
        expected = tier
    assert fk.isa_tiers()[-1] == expected
    assert fk.isa_tiers() == ALL_TIERS[: ALL_TIERS.index(expected) + 1]


@pytest.mark.parametrize("best", ALL_TIERS)
def test_a_request_can_only_lower_the_tier(monkeypatch: pytest.MonkeyPatch, best: str) -> None:
    # The rule against every possible best tier, whatever this CPU has.
    for requested in ALL_TIERS:
        if ALL_TIERS.index(requested) <= ALL_TIERS.index(best):
            assert native._resolve_isa_with_best(requested, best) == requested
        else:
            with pytest.raises(
                ValueError, match=f"isa='{requested}' asks for a tier this CPU lacks; its best tier"
            ):
                native._resolve_isa_with_best(requested, best)
    monkeypatch.delenv("FT_CPU_MOE_ISA", raising=False)
    assert native._resolve_isa_with_best("", best) == best
    monkeypatch.setenv("FT_CPU_MOE_ISA", "scalar")
    assert native._resolve_isa_with_best("", best) == "scalar"


def test_default_threads_leave_a_core_to_the_caller() -> None:
    assert fk.MoeExecutor(hidden=8, top_k=1, max_tokens=1).num_threads == max(1, fk.physical_cores() - 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"top_k": 65}, r"top_k must be \[1, 64\], got 65"),
        ({"top_k": 0}, r"top_k must be \[1, 64\]"),
        ({"hidden": 0}, r"hidden must be >= 1"),
        ({"max_tokens": 0}, r"max_tokens must be >= 1"),
        ({"num_threads": 0}, r"num_threads must be \[1, 1024\]"),
        ({"isa": "sse9"}, r"isa='sse9' is not an ISA tier"),
    ],
)
def test_constructor_errors(kwargs: dict, match: str) -> None:
    args = {"hidden": H, "top_k": TOP_K, "max_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=match):
        fk.MoeExecutor(**args)


def _banks():
    return {"w13": np.zeros((E, 2 * I, H), BF16), "w2": np.zeros((E, H, I), BF16)}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b, kw: b.update(w13=np.zeros((E, 2 * I, H + 1), BF16)),
            r"layer 0 \(bf16\): bank 'w13' has 33280 bytes; expected 32768 bytes \(\[4, 64, 64\] bf16\)",
        ),
        (
            lambda b, kw: b.update(w2=np.zeros((E, H, I), np.float16)),
            r"bank 'w2' has dtype float16; expected \[4, 64, 32\] bf16",
        ),
        (lambda b, kw: b.pop("w2"), r"missing bank 'w2'; expected \[4, 64, 32\] bf16"),
        (lambda b, kw: b.update(w3=np.zeros(4, BF16)), r"bank 'w3' is not used by this format"),
        (
            lambda b, kw: b.update(w13_bias=np.zeros((E, 2 * I), BF16)),
            r"bank 'w13_bias' has dtype bfloat16; expected \[4, 64\] f32",
        ),
        (lambda b, kw: kw.update(options={"limt": 1.0}), r"option 'limt' is not used"),
        (
            lambda b, kw: kw.update(activation="swiglu_clamp"),
            r"missing option 'limit' \(clamp bound of swiglu_clamp\)",
        ),
        (lambda b, kw: kw.update(activation="relu"), r"activation='relu' is unknown"),
        (
            lambda b, kw: kw.update(weight_format="int3"),
            r"weight_format='int3' is unknown; expected one of bf16",
        ),
        (
            lambda b, kw: b.update(w2=np.zeros((E, I, H), BF16).transpose(0, 2, 1)),
            r"banks\['w2'\] must be C-contiguous",
        ),
        (
            lambda b, kw: b.update(w2=[1, 2]),
            r"banks\['w2'\] must be a numpy array or an \(address, nbytes\) tuple",
        ),
    ],
)
def test_add_layer_errors_name_the_bank_and_shape(change, match: str) -> None:
    assert_add_layer_refused(
        change,
        match,
        _banks(),
        hidden=H,
        num_experts=E,
        top_k=TOP_K,
        errors=(ValueError, TypeError),
        weight_format="bf16",
        intermediate=I,
        activation="silu",
        options={},
    )


def test_layer_added_twice_is_refused() -> None:
    ex = small_executor()
    with pytest.raises(ValueError, match="layer 0 was already added"):
        ex.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=_banks())


def test_raw_address_banks() -> None:
    rng = np.random.default_rng(4)
    banks = {
        "w13": rng.standard_normal((E, 2 * I, H)).astype(BF16),
        "w2": rng.standard_normal((E, H, I)).astype(BF16),
    }
    a = fk.MoeExecutor(hidden=H, top_k=TOP_K, max_tokens=4)
    a.add_layer(0, "bf16", num_experts=E, intermediate=I, banks=banks)
    b = fk.MoeExecutor(hidden=H, top_k=TOP_K, max_tokens=4)
    b.add_layer(
        0,
        "bf16",
        num_experts=E,
        intermediate=I,
        banks={k: (v.ctypes.data, v.nbytes) for k, v in banks.items()},
    )
    x, ids, w = task()
    np.testing.assert_array_equal(a.run(0, x, ids, w).view(np.uint16), b.run(0, x, ids, w).view(np.uint16))
    with pytest.raises(ValueError, match=r"bank 'w2' has 100 bytes; expected 16384 bytes"):
        b.add_layer(
            1,
            "bf16",
            num_experts=E,
            intermediate=I,
            banks={"w13": banks["w13"], "w2": (banks["w2"].ctypes.data, 100)},
        )


def test_run_errors() -> None:
    ex = small_executor()
    x, ids, w = task()
    with pytest.raises(ValueError, match=r"x has 5 tokens; this executor takes at most max_tokens=4"):
        ex.run(0, np.zeros((5, H), BF16), np.zeros((5, TOP_K), np.int32), np.zeros((5, TOP_K), np.float32))
    with pytest.raises(
        TypeError, match=r"x must have dtype bfloat16 \(ml_dtypes\) or uint16 bf16 bits, got float32"
    ):
        ex.run(0, x.astype(np.float32), ids, w)
    with pytest.raises(TypeError, match="ids must have dtype int32, got int64"):
        ex.run(0, x, ids.astype(np.int64), w)
    with pytest.raises(ValueError, match=r"weights must have shape \[2, 2\], got \[2, 3\]"):
        ex.run(0, x, ids, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"x must have shape \[2, 64\], got \[2, 32\]"):
        ex.run(0, x[:, :32].copy(), ids, w)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        ex.run(0, np.zeros((H, 2), BF16).T, ids, w)
    with pytest.raises(ValueError, match=r"layer=3 has not been added \(layers: \[0\]\)"):
        ex.run(3, x, ids, w)
    bad = ids.copy()
    bad[0, 1] = 99
    with pytest.raises(fk.KernelError, match=r"ids\[0, 1\]=99 is out of range for layer 0 with 4 experts"):
        ex.run(0, x, bad, w)
    with pytest.raises(ValueError, match="out must be writeable"):
        out = np.zeros((2, H), BF16)
        out.flags.writeable = False
        ex.run(0, x, ids, w, out=out)
    with pytest.raises(
        ValueError, match=r"num_tokens=9 is out of range; this executor was built for max_tokens=4"
    ):
        ex.run_ptr(0, 9, x.ctypes.data, ids.ctypes.data, w.ctypes.data, x.ctypes.data)


def _check_prefetch_env_errors(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A prefetch distance variable that is not a whole multiple of 64 in [0, 65536] is refused."""
    for value, message in (
        ("lots", rf"{name}='lots' is not an integer"),
        ("100", rf"{name}=100 must be a multiple of 64 in \[0, 65536\]"),
        ("-64", rf"{name}=-64 must be a multiple of 64"),
        ("65600", rf"{name}=65600 must be a multiple of 64 in \[0, 65536\]"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=message):
            small_executor()
    monkeypatch.delenv(name)


def test_prefetch_distance_never_changes_results(monkeypatch: pytest.MonkeyPatch) -> None:
    x, ids, w = task()
    runs = [small_executor(prefetch_bytes=pf).run(0, x, ids, w) for pf in (0, 64, 8192)]
    outs = [y.view(np.uint16) for y in runs]

    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    monkeypatch.setenv("FT_CPU_MOE_PREFETCH", "4096")
    assert small_executor().prefetch_bytes == 4096
    _check_prefetch_env_errors(monkeypatch, "FT_CPU_MOE_PREFETCH")
    with pytest.raises(ValueError, match=r"prefetch_bytes must be \[0, 65536\], got 70000"):
        small_executor(prefetch_bytes=70000)


def test_two_level_prefetch_never_changes_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # The L1 distance of the two-level prefetch: outputs bit-identical with one level, with the
    # default near distance and with one as far as the stream's own distance (near unused), through
    # StreamPrefetch (bf16, layer 0) and StreamPrefetchCursor (q4_0's ggml blocks, layer 1).
    x, ids, w = task()
    outs = []
    for near in ("0", "64", "1024", "2048", "8192"):
        monkeypatch.setenv("FT_CPU_MOE_PREFETCH_L1", near)
        ex = small_executor(prefetch_bytes=8192, num_threads=2)
        _add_q4_0_layer(ex, 1)
        assert ex.prefetch_l1_bytes == ex.layer_prefetch_l1_bytes(1) == int(near)
        outs.append([ex.run(layer, x, ids, w).view(np.uint16) for layer in (0, 1)])
    for o in outs[1:]:
        for layer in (0, 1):
            np.testing.assert_array_equal(o[layer], outs[0][layer])
    assert all(np.isfinite(y.view(BF16).astype(np.float32)).all() for y in outs[0])


# The formats whose one-vector calls take two levels at any pool size on Intel (measured there at 16
# threads, batch 1: docs/benchmarks.md, thirty-eighth session); bf16 takes them in every call.
TWO_LEVEL_ONE_VECTOR_ON_INTEL = {"q4_0", "gguf", "mxfp4", "fp8_block"}


@pytest.mark.parametrize("fmt", fk.weight_formats())
def test_two_level_prefetch_by_vector_count(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ft_kernels_cpu import bench, bench_formats
    from ft_kernels_cpu.shapes import MoeShape

    monkeypatch.delenv("FT_CPU_MOE_PREFETCH_L1", raising=False)
    monkeypatch.delenv("FT_CPU_MOE_PREFETCH", raising=False)
    shape = MoeShape(256, 256, 2, 2, 1, "swigluoai" if fmt == "mxfp4" else "silu")
    banks = bench_formats.load(fmt).banks(shape, 2, np.random.default_rng(3))
    zen5 = cpu_is_zen5_or_later()
    for threads in (2, 4, 16):
        ex = fk.MoeExecutor(shape.hidden, 2, max_tokens=2, num_threads=threads)
        bench.add_bench_layer(ex, fmt, shape, 2, banks)
        pool_default = 2048 if threads <= 2 else 1024 if threads <= 4 else 0
        for v in range(1, 9):
            if zen5:  # no software prefetch by default, so no L1 level
                want = 0
            elif threads <= 4:  # two levels in every call of a pool of up to 4 threads
                want = pool_default
            elif fmt == "bf16" or (v == 1 and fmt in TWO_LEVEL_ONE_VECTOR_ON_INTEL and cpu_is_intel()):
                want = 1024
            else:
                want = pool_default
            assert ex.layer_prefetch_l1_bytes(0, v) == want, (threads, v)


def _add_q4_0_layer(ex: fk.MoeExecutor, layer: int) -> None:
    # Random codes with finite fp16 scales of magnitude [2^-7, 2^-6) in each 18-byte block.
    rng = np.random.default_rng(2)

    def rows(*shape: int) -> np.ndarray:
        b = rng.integers(0, 256, (*shape, 18), dtype=np.uint8)
        scales = rng.integers(0, 1 << 10, shape, dtype=np.uint16) | np.uint16(0x2000)
        b[..., :2] = scales.view(np.uint8).reshape(*shape, 2)
        return b.reshape(*shape[:-1], shape[-1] * 18)

    ex.add_layer(
        layer,
        "q4_0",
        num_experts=E,
        intermediate=I,
        banks={"w13": rows(E, 2 * I, H // 32), "w2": rows(E, H, I // 32)},
    )


def test_prefetch_defaults_by_vendor_and_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8192 unless set, 0 on AMD's Zen 5 and later (docs/benchmarks.md, twenty-seventh session); bf16
    # layers keep to the hardware prefetchers in one-vector calls on AMD (thirteenth and fourteenth
    # sessions), the other formats and calls over several vectors take the default.
    monkeypatch.delenv("FT_CPU_MOE_PREFETCH", raising=False)
    intel = cpu_is_intel()
    base = 0 if cpu_is_zen5_or_later() else 8192
    ex = small_executor()  # layer 0: bf16
    _add_q4_0_layer(ex, 1)
    assert ex.prefetch_bytes == base
    assert ex.layer_prefetch_bytes(0) == ex.layer_prefetch_bytes(0, 1) == (8192 if intel else 0)
    assert [ex.layer_prefetch_bytes(0, v) for v in range(2, 9)] == [base] * 7
    assert [ex.layer_prefetch_bytes(1, v) for v in range(1, 9)] == [base] * 8
    for bad in (0, 9):
        with pytest.raises(ValueError, match=rf"vectors must be \[1, 8\], got {bad}"):
            ex.layer_prefetch_bytes(0, bad)
    # A distance the caller sets applies to every layer, bf16 included.
    for kwargs, env in (({"prefetch_bytes": 2048}, None), ({}, "2048")):
        if env is not None:
            monkeypatch.setenv("FT_CPU_MOE_PREFETCH", env)
        ex = small_executor(**kwargs)
        _add_q4_0_layer(ex, 1)
        distances = (ex.prefetch_bytes, ex.layer_prefetch_bytes(0), ex.layer_prefetch_bytes(0, 8))
        assert distances + (ex.layer_prefetch_bytes(1),) == (2048,) * 4
    with pytest.raises(ValueError, match=r"layer 3 has not been added"):
        ex.layer_prefetch_bytes(3)


def test_two_level_prefetch_default_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FT_CPU_MOE_PREFETCH_L1", raising=False)
    monkeypatch.delenv("FT_CPU_MOE_PREFETCH", raising=False)
    # Two levels for pools of up to 4 threads, at an L1 distance of 2048 with 1 or 2 threads and 1024
    # with 3 or 4 (docs/benchmarks.md, tenth, thirteenth and thirty-ninth sessions); in larger pools at
    # 1024 for bf16 layers and for one-vector calls of q4_0 (gguf, mxfp4, fp8_block) layers on Intel
    # (thirty-eighth session), one level for the rest. bf16 layers on AMD prefetch in calls over
    # several vectors only, and take the L1 level for those. On Zen 5 and later no layer prefetches by
    # default, so none takes the L1 level either.
    zen5 = cpu_is_zen5_or_later()
    intel = cpu_is_intel()
    for threads, expected in ((1, 2048), (2, 2048), (3, 1024), (4, 1024), (5, 0), (16, 0)):
        ex = small_executor(num_threads=threads)  # layer 0: bf16
        _add_q4_0_layer(ex, 1)
        assert ex.prefetch_l1_bytes == expected, threads
        any_pool = expected or 1024  # the calls that take two levels in every pool
        one = 0 if zen5 else any_pool if intel else expected
        assert ex.layer_prefetch_l1_bytes(1) == ex.layer_prefetch_l1_bytes(1, 1) == one, threads
        for v in range(2, 9):
            assert ex.layer_prefetch_l1_bytes(1, v) == (0 if zen5 else expected), (threads, v)
            assert ex.layer_prefetch_l1_bytes(0, v) == (0 if zen5 else any_pool), (threads, v)
        assert ex.layer_prefetch_l1_bytes(0) == (0 if zen5 else any_pool), threads
    for bad in (0, 9):
        with pytest.raises(ValueError, match=r"vectors"):
            ex.layer_prefetch_l1_bytes(1, bad)
        # The native check too, past the Python wrapper's.
        for name in ("layer_prefetch_bytes", "layer_prefetch_l1_bytes"):
            with pytest.raises(ValueError, match=rf"vectors must be in \[1, 8\], got {bad}"):
                getattr(ex._native, name)(1, bad)
    # The variable applies to every layer, bf16 included.
    monkeypatch.setenv("FT_CPU_MOE_PREFETCH_L1", "0")
    assert small_executor(num_threads=16).layer_prefetch_l1_bytes(0) == 0
    monkeypatch.setenv("FT_CPU_MOE_PREFETCH_L1", "4096")
    ex = small_executor(num_threads=2)
    _add_q4_0_layer(ex, 1)
    assert (ex.layer_prefetch_l1_bytes(0), ex.layer_prefetch_l1_bytes(1)) == (4096, 4096)
    with pytest.raises(ValueError, match=r"layer 7 has not been added"):
        ex.layer_prefetch_l1_bytes(7)
    monkeypatch.delenv("FT_CPU_MOE_PREFETCH_L1")
    _check_prefetch_env_errors(monkeypatch, "FT_CPU_MOE_PREFETCH_L1")
