// ds_fp4 row kernels of the avx512_bf16 tier (ds_fp4_kernels.h).
//
// One step is 4 blocks of 32 (64 bytes, one load): 3 VPSRLW + 4 VPERMW turn the nibbles into 4
// vectors of 32 bf16 words (word m of vector j holds element 4m + j of the step); 4 VDPBF16PS, one
// chain from zero, sum the step into 16 fp32 lanes (lane l: block l / 4 only); one FMA applies the 4
// blocks' e8m0 scales. The scales come 16 blocks at a time (one conversion per 4 steps). For n
// vectors the decoded words are shared: per vector and step 4 VDPBF16PS + 1 FMA, which on Zen 5
// (both run on the two FMA pipes) is the bound at n = 8. Every loop is unrolled over the vectors
// so that nothing of a step lives in memory (the previous kernels kept per-vector temporaries on the
// stack). Horizontal sums once per row.
#include "ds_fp4_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "amx_tiles.h"
#include "dispatch_n.h"
#include "fp4_avx512.h"
#include "fp4_common.h"
#include "reduce_n.h"
#include "stream_prefetch.h"

namespace ft {
namespace dsfp4 {

namespace {

using Prefetch = StreamPrefetch<PrefetchHint::L2>;  // as fp4_kernels.cpp (measured there)

#if FT_X86

// One step: the 4 blocks at w against every vector's words at element offset xo, scaled by sc.
template <int NV>
FT_TARGET_AVX512_BF16 inline void step(const uint8_t* w, int blocks, __m512 sc, const uint16_t* const* xs, int xo,
                                       __m512i lut, __m512* acc) {
  const __m512i wv = fp4::load_blocks(w, blocks);
  const __m512bh w0 = (__m512bh)_mm512_permutexvar_epi16(wv, lut);
  const __m512bh w1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut);
  const __m512bh w2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut);
  const __m512bh w3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const uint16_t* x = xs[j] + xo;
    __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), w0, (__m512bh)_mm512_loadu_si512(x));
    t = _mm512_dpbf16_ps(t, w1, (__m512bh)_mm512_loadu_si512(x + 32));
    t = _mm512_dpbf16_ps(t, w2, (__m512bh)_mm512_loadu_si512(x + 64));
    t = _mm512_dpbf16_ps(t, w3, (__m512bh)_mm512_loadu_si512(x + 96));
    acc[j] = _mm512_fmadd_ps(t, sc, acc[j]);
  }
}

template <int NV>
FT_TARGET_AVX512_BF16 void rows(const uint8_t* W, const uint8_t* S, int nrows, const uint16_t* const* xs, int K,
                                float* out, int os, const Prefetch& pw, const Prefetch& ps) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) table[i] = f32_to_bf16(fp4::kE2m1[i & 15]);  // index bit 4 ignored
  const __m512i lut = _mm512_load_si512(table);
  const __m512i idx0 = fp4::scale_index(0), idx1 = fp4::scale_index(1);
  const __m512i idx2 = fp4::scale_index(2), idx3 = fp4::scale_index(3);
  const int nb = K / 32;
  // Two accumulator chains per vector for n <= 2 (the FMA latency); from 3 vectors on the vectors
  // themselves are enough independent chains, and one set leaves registers for the rest.
  constexpr bool two = NV <= 2;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (ps.dist) ps.ahead(s);
    __m512 a0[NV], a1[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
      const __m512 sf = fp4::e8m0x16(s + b, 16);
      const uint8_t* wp = w + 16 * b;
      if (pw.dist) {
        pw.ahead(wp);
        pw.ahead(wp + 64);
        pw.ahead(wp + 128);
        pw.ahead(wp + 192);
      }
      step<NV>(wp, 4, _mm512_permutexvar_ps(idx0, sf), xs, 32 * b, lut, a0);
      step<NV>(wp + 64, 4, _mm512_permutexvar_ps(idx1, sf), xs, 32 * b + 128, lut, two ? a1 : a0);
      step<NV>(wp + 128, 4, _mm512_permutexvar_ps(idx2, sf), xs, 32 * b + 256, lut, a0);
      step<NV>(wp + 192, 4, _mm512_permutexvar_ps(idx3, sf), xs, 32 * b + 384, lut, two ? a1 : a0);
    }
    if (b < nb) {
      const __m512 sf = fp4::e8m0x16(s + b, nb - b);
      const __m512i idx[4] = {idx0, idx1, idx2, idx3};
      for (int u = 0; b + 4 * u < nb; ++u) {
        const int bu = b + 4 * u;
        if (pw.dist) pw.ahead(w + 16 * bu);
        step<NV>(w + 16 * bu, nb - bu, _mm512_permutexvar_ps(idx[u], sf), xs, 32 * bu, lut,
                 two && (u & 1) ? a1 : a0);
      }
    }
    if constexpr (two) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) a0[j] = _mm512_add_ps(a0[j], a1[j]);
    }
    reduce_store_n<NV>(a0, out + r, os);
  }
}

// Round trip of v[0, n), n <= 128 elements in blocks of `block` from v[0], into q[0, n).
FT_TARGET_AVX512 void round_trip_avx512(const float* v, int n, int block, float* q) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 small = _mm512_set1_ps(0.015625f), sat = _mm512_set1_ps(448.f);
  for (int b0 = 0; b0 < n; b0 += block) {
    const int m = std::min(block, n - b0);
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < m; i += 16) {
      const __mmask16 k = m - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (m - i)) - 1u);
      mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_maskz_loadu_ps(k, v + b0 + i), absmask));
    }
    // The scale exactly as fp8_round_trip: max(amax, 1e-4) / 448 rounded up to a power of two.
    float s = std::max(_mm512_reduce_max_ps(mx), 1e-4f) / 448.f;
    uint32_t bits;
    std::memcpy(&bits, &s, sizeof bits);
    if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
    std::memcpy(&s, &bits, sizeof s);
    // v / s == v * (1 / s) exactly: s is a power of two within the normal range, so is 1 / s.
    const __m512 inv = _mm512_set1_ps(1.f / s), sv = _mm512_set1_ps(s);
    for (int i = 0; i < m; i += 16) {
      const __mmask16 k = m - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (m - i)) - 1u);
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + b0 + i), inv);
      const __m512 a = _mm512_and_ps(y, absmask);
      // Below 2^-6: multiples of 2^-9, nearest even (ROUNDSCALE keeping 9 fraction bits). Above:
      // 3 mantissa bits, nearest even, by the integer carry of fp8_round_trip.
      const __m512 r_small = _mm512_roundscale_ps(a, (9 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i ai = _mm512_castps_si512(a);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ai, 20), _mm512_set1_epi32(1));
      const __m512i big = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ai, _mm512_set1_epi32(0x7ffff)), odd),
                                           _mm512_set1_epi32(~0xfffff));
      __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, small, _CMP_LT_OQ), _mm512_castsi512_ps(big), r_small);
      r = _mm512_min_ps(r, sat);
      // copysign(r, y), then * s (exact: a power of two, no underflow for r >= 2^-9)
      r = _mm512_or_ps(r, _mm512_andnot_ps(absmask, y));
      _mm512_mask_storeu_ps(q + b0 + i, k, _mm512_mul_ps(r, sv));
    }
  }
}

#endif  // FT_X86

}  // namespace

void fp8_round_trip(Isa isa, const float* v, int n, int block, float* q) {
#if FT_X86
  if (isa >= Isa::avx512) {
    for (int g = 0; g < n; g += 128) round_trip_avx512(v + g, std::min(128, n - g), block, q + g);
    return;
  }
#else
  (void)isa;
#endif
  fp4::fp8_round_trip(v, n, block, q);
}

void bf16_layout(const float* q, int i0, int i1, void* out) {
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);
    // The round-tripped values are exact in bf16: the top half of the fp32 bits.
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 32; ++k) {
        const int e = 4 * k + j;
        uint32_t bits = 0;
        if (e < n) std::memcpy(&bits, q + (g - i0) + e, sizeof bits);
        o[g + 32 * j + k] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }
}

void fp8_prep_vec(const float* v, int i0, int i1, int block, void* out) {
  alignas(64) float q[128];
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);
#if FT_X86
    round_trip_avx512(v + (g - i0), n, block, q);
#else
    fp4::fp8_round_trip(v + (g - i0), n, block, q);
#endif
    bf16_layout(q, g, g + n, out);
  }
}

Kernels choose_kernels(Isa isa) {
  const std::string v = amx::kernel_choice("FT_CPU_MOE_DSFP4_KERNELS", isa, {"fp32", "bf16", "amx"},
                                           "auto, fp32, bf16 or amx");
  if (v == "auto") {
    if (isa != Isa::avx512_bf16) return Kernels::fp32;
    if (cpu_amx_bf16()) return Kernels::amx;
    return cpu_is_intel() ? Kernels::fp32 : Kernels::bf16;
  }
  return v == "amx" ? Kernels::amx : v == "bf16" ? Kernels::bf16 : Kernels::fp32;
}

size_t vec_bytes(int K) { return (static_cast<size_t>(K) + 127) / 128 * 128 * sizeof(uint16_t); }

void dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, float* out,
                    int os, int prefetch) {
  if (nrows <= 0 || n <= 0) return;
  n = std::min(n, fp4::kMaxVectors);
#if FT_X86
  const uint16_t* xh[fp4::kMaxVectors];
  for (int j = 0; j < n; ++j) xh[j] = static_cast<const uint16_t*>(xs[j]);
  const Prefetch pw(W, static_cast<size_t>(nrows) * (K / 2), prefetch);
  const Prefetch ps(S, static_cast<size_t>(nrows) * (K / 32), prefetch / 16);
  dispatch_n(n, [&](auto nv) { rows<decltype(nv)::value>(W, S, nrows, xh, K, out, os, pw, ps); });
#else
  (void)W, (void)S, (void)xs, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("ds_fp4 bf16 kernels need x86");
#endif
}

}  // namespace dsfp4
}  // namespace ft
