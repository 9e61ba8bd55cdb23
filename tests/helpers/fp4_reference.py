"""Independent numpy references for the FP4 formats (mxfp4, ds_fp4), from the OCP MX spec and ml_dtypes;
random e4m3fn codes for nvfp4's scales and fp8_block's weights.

Nothing here mirrors ft's C++: nibbles are decoded with ml_dtypes.float4_e2m1fn, scales with
float8_e8m0fnu, the fp8 activation round trip with float8_e4m3fn.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn


def dequant_fp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., K/2] (or [..., K/32, 16]) u8 nibbles + [..., K/32] e8m0 bytes -> float64 [..., K].

    Low nibble = element 2j, high nibble = element 2j + 1 (OCP MX); value e2m1 * 2^(s - 127).
    """
    lead = scales.shape[:-1]
    nb = scales.shape[-1]
    b = np.ascontiguousarray(blocks).reshape(*lead, nb * 16)
    nib = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*lead, nb * 32)
    vals = nib.astype(np.uint8).view(E2M1).astype(np.float64)
    s = np.ascontiguousarray(scales).view(E8M0).astype(np.float64)
    return vals * np.repeat(s, 32, axis=-1)


def pow2_ceil(s: np.ndarray) -> np.ndarray:
    """2^ceil(log2(s)) for positive normal float32 s, exactly (frexp, not a rounded log2)."""
    m, e = np.frexp(s.astype(np.float64))  # s = m * 2^e, m in [0.5, 1)
    return np.ldexp(1.0, np.where(m == 0.5, e - 1, e)).astype(np.float32)


def fp8_round_trip(v: np.ndarray, block: int) -> np.ndarray:
    """DeepSeek-style activation quantization, in float32 like the spec states it, per row of v.

    For each block of `block` consecutive elements (the last may be short): amax = max|v| (fp32),
    s = max(amax, 1e-4) / 448 rounded up to a power of two, q = e4m3fn(v / s) (round to nearest
    even, saturated to +-448), result q * s (float32, exact).
    """
    v = np.asarray(v, dtype=np.float32)
    out = np.empty_like(v)
    n = v.shape[-1]
    for b0 in range(0, n, block):
        blk = v[..., b0 : b0 + block]
        amax = np.max(np.abs(blk), axis=-1, keepdims=True)
        s = pow2_ceil(np.maximum(amax, np.float32(1e-4)) / np.float32(448.0))
        y = np.clip(blk / s, np.float32(-448.0), np.float32(448.0))
        out[..., b0 : b0 + block] = y.astype(E4M3).astype(np.float32) * s
    return out


def random_e4m3_codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform e4m3fn codes (subnormals, both zeros and negatives included) without the NaNs 0x7f / 0xff.

    nvfp4's block scales and fp8_block's weights are such codes.
    """
    codes = rng.integers(0, 254, size=shape).astype(np.uint8)
    codes[codes >= 0x7F] += 1  # 0..253 -> every code except 0x7f and 0xff
    return codes


def random_fp4(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def random_scales(rng: np.random.Generator, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """e8m0 bytes in [lo, hi] (2^(lo - 127) .. 2^(hi - 127))."""
    return rng.integers(lo, hi + 1, size=shape, dtype=np.uint8)
