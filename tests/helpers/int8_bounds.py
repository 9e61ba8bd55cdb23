"""Error bounds of the int8-activation (VNNI) paths of the avx512_bf16 tier, from the float64 reference.

Shared by the q4_0, gguf and mxfp4 tests (block_amax also by nvfp4's); nothing here reads the executor's
results. int8_emulated_reference is the sharp check: the float64 reference with x and h rounded to int8
exactly as specified.
"""

from __future__ import annotations

import numpy as np

from helpers.moe_reference import activation


def block_amax(v: np.ndarray, group: int) -> np.ndarray:
    """max |v| over each `group`-element block of the last axis (the last block may be shorter),
    repeated per element."""
    n = v.shape[-1]
    pad = np.zeros((*v.shape[:-1], -n % group))
    a = np.abs(np.concatenate([v, pad], axis=-1)).reshape(*v.shape[:-1], -1, group).max(axis=-1)
    return np.repeat(a, group, axis=-1)[..., :n]


def int8_error_bound(x, ids, w, wref, act, on_input, q8_in, q8_down, groups=(32, 32), **act_options):
    """Bound on |y - y_ref| added by the int8 activations of the avx512_bf16 tier (VNNI paths).

    wref: moe_reference's weight arguments (w_gate, w_up, w_down and optionally b_gate, b_up).
    x (q8_in) and the intermediate h (q8_down) are rounded per group (32 elements, 256 for Q4_0 and
    K-quant weights: `groups` of x and h, the last group of a vector may be shorter) to int8 steps
    of amax/127:
    an element moves by at most amax_block/254. Through gate/up that moves g, u by at most
    dg = |W_gate| @ ex, du = |W_up| @ ex; every activation here has |dh/dg| <= 1.2 * (|u| + 1) and
    |dh/du| <= |g| (their gate-side factor silu/gelu/... is <= |g|, its slope <= 1.13; clamps only
    shrink), so over the box h moves by at most 1.2 * (|u| + du + 1) * dg + (|g| + dg) * du. The
    rounding of h then adds amax_block(|h| + dh)/254 per element; W_down spreads both, router
    weights scale them. Computed from the float64 reference, never from the executor.
    """
    T, k = ids.shape
    bound = np.zeros((T, wref["w_down"].shape[1]))
    x = x.astype(np.float64)
    for t in range(T):
        for r in range(k):
            e = int(ids[t, r])
            if e < 0:
                continue
            wt = float(w[t, r])
            xin = wt * x[t] if on_input else x[t]
            g = wref["w_gate"][e] @ xin + (wref["b_gate"][e] if "b_gate" in wref else 0.0)
            u = wref["w_up"][e] @ xin + (wref["b_up"][e] if "b_up" in wref else 0.0)
            ex = block_amax(xin, groups[0]) / 254.0 if q8_in else np.zeros_like(xin)
            dg, du = np.abs(wref["w_gate"][e]) @ ex, np.abs(wref["w_up"][e]) @ ex
            dh = 1.2 * (np.abs(u) + du + 1.0) * dg + (np.abs(g) + dg) * du
            h = activation(act, g, u, **act_options)
            eh = block_amax(np.abs(h) + dh, groups[1]) / 254.0 if q8_down else 0.0
            bound[t] += (1.0 if on_input else abs(wt)) * (np.abs(wref["w_down"][e]) @ (dh + eh))
    # fp32 evaluation of the bound's own terms and the bf16 rounding of the extra: a 2% margin.
    return 1.02 * bound


def q8_emulate(v: np.ndarray, group: int, flips: bool = False):
    """v rounded as the int8 paths do, in numpy: per `group` elements, fp32 amax, inv = 127/amax, codes
    round-half-even(v * inv) in fp32, values code * amax/127. With `flips`, also the step of every
    element whose v * inv lies within 2e-3 of a rounding boundary (where an fp32 v computed in another
    order could round the other way), else 0."""
    n = v.size
    b = np.concatenate([v.astype(np.float32), np.zeros(-n % group, np.float32)]).reshape(-1, group)
    amax = np.abs(b).max(axis=1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    t = (b * inv).astype(np.float32)
    dx = (amax / np.float32(127)).astype(np.float64)
    out = (np.clip(np.round(t), -127, 127) * dx).reshape(-1)[:n].reshape(v.shape)
    if not flips:
        return out
    near = np.abs(np.abs(t - np.floor(t)) - 0.5) < 2e-3
    return out, (near * dx).reshape(-1)[:n].reshape(v.shape)


def int8_emulated_reference(x, ids, w, wref, act, gin: int, gdn: int):
    """The float64 reference with x and h rounded by q8_emulate; (y, scale, flip bound)."""
    T, k = ids.shape
    y, scale, flip = (np.zeros((T, wref["w_down"].shape[1])) for _ in range(3))
    xf = x.astype(np.float32)
    for t in range(T):
        xin = q8_emulate(xf[t], gin)
        for r in range(k):
            e = int(ids[t, r])
            if e < 0:
                continue
            h = activation(act, wref["w_gate"][e] @ xin, wref["w_up"][e] @ xin)
            hq, fl = q8_emulate(h, gdn, flips=True)
            wd = np.abs(wref["w_down"][e])
            y[t] += w[t, r] * (wref["w_down"][e] @ hq)
            scale[t] += abs(w[t, r]) * (wd @ np.abs(h))
            flip[t] += abs(w[t, r]) * (wd @ fl)
    return y, scale, flip
