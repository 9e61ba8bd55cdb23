// fp8_block: e4m3fn expert weights with 2-D block scales, as DeepSeek-V3 and Qwen3-FP8 checkpoints
// ship them (`weight` e4m3fn + `weight_scale_inv` f32); w = fp8 * scale[row_block, col_block].
//
// Banks (E experts, H hidden, I intermediate, B = option block_size (default 128), nb(n) = ceil(n/B)):
//   w13        [E, 2I, H]                u8   e4m3fn bits; gate rows 0..I-1, then up rows I..2I-1
//   w13_scale  [E, 2*nb(I), nb(H)]       f32  gate row-blocks, then up row-blocks (a checkpoint's
//                                             gate and up scales concatenated, even when I % B != 0)
//   w2         [E, H, I]                 u8   e4m3fn bits
//   w2_scale   [E, nb(H), nb(I)]         f32
//   w13_bias   [E, 2I]                   f32  optional
//   w2_bias    [E, H]                    f32  optional
//
// Kernels: one row at a time in address order (see bf16.cpp). Per column block the products are
// summed in fp32 vectors, then scaled by the block's scale into a running total. Decoding is in
// registers:
//  - avx2, avx512: byte -> fp16 fields -> VCVTPH2PS (fp8nv_common.h), FMA with fp32 x.
//  - avx512_bf16: 64 bytes -> 2 x 32 bf16 words by shifts and one VPTERNLOG each (exact: e4m3 fits
//    bf16), VDPBF16PS with bf16 x and the intermediate rounded to bf16, both in even/odd order per
//    64 elements (prep_input / prep_inter). Exponent-0 codes (zeros, subnormals) take a fix-up.
//    Whole blocks of the usual B = 128 run as straight-line code (both chunks decoded at once).
// The batched hooks decode each weight chunk once and multiply it into up to 8 vectors.
#include <algorithm>
#include <cmath>
#include <string>

#include "format.h"
#include "kernels/amx_tiles.h"
#include "kernels/bf16_pairs.h"
#include "kernels/fp8nv_common.h"
#include "kernels/row_reduce.h"
#include "kernels/stream_prefetch.h"

namespace ft {

namespace {

using fp8nv::Prefetch;

// One row: sum over column blocks c of S[c] * sum_{k in c} e4m3(w[k]) * x[k].
float fp8_row_scalar(const uint8_t* w, const float* S, int B, const float* x, int K) {
  const float* lut = fp8nv::e4m3_table().v;
  float tot = 0.f;
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    float acc = 0.f;
    for (int k = 0; k < n; ++k) acc += lut[w[c0 + k]] * x[c0 + k];
    tot += S[c] * acc;
  }
  return tot;
}

#if FT_X86

// The C chains of vector j, summed in a fixed order (C = 1, 2 or 4).
template <int C, int N>
FT_TARGET_AVX2 __attribute__((always_inline)) inline __m256 sum_chains(const __m256 (&ac)[C][N], int j) {
  if constexpr (C == 4) {
    return _mm256_add_ps(_mm256_add_ps(ac[0][j], ac[1][j]), _mm256_add_ps(ac[2][j], ac[3][j]));
  } else if constexpr (C == 2) {
    return _mm256_add_ps(ac[0][j], ac[1][j]);
  } else {
    return ac[0][j];
  }
}

// The column block [c0, c0 + n) of one row (wb: its n bytes) against N vectors: a[j], the fp8 x
// fp32 products at the 2^-8 scale of the fp16 decode, with the scalar remainder of a short block
// folded in. C chains per vector (the FMA latency: 4 for one vector, 32 weights a step; 2 for two; 1
// for more, whose vectors are the independent chains). With 2 chains one vector was held to 16
// weights per FMA latency (4 cycles on Zen 3).
template <int N, int C>
FT_TARGET_AVX2 __attribute__((always_inline)) inline void fp8_block_avx2(const uint8_t* wb, int n, const float* const* xs,
                                                                         int c0, __m256* a) {
  static_assert(C == 1 || C == 2 || (C == 4 && N == 1), "1, 2 or (one vector) 4 chains");
  __m256 ac[C][N];
  for (int c = 0; c < C; ++c)
    #pragma GCC unroll 8
    for (int j = 0; j < N; ++j) ac[c][j] = _mm256_setzero_ps();
  // 16 weights into chains c0 and c1 (the same chain for C = 1).
  auto step = [&](int k, int ca, int cb) FT_TARGET_AVX2 {
    __m256 w0, w1;
    fp8nv::e4m3x16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + k)), w0, w1);
    for (int j = 0; j < N; ++j) {
      const float* xb = xs[j] + c0 + k;
      ac[ca][j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), ac[ca][j]);
      ac[cb][j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), ac[cb][j]);
    }
  };
  int k = 0;
  if constexpr (C == 4) {
    for (; k + 32 <= n; k += 32) {
      step(k, 0, 1);
      step(k + 16, 2, 3);
    }
  }
  for (; k + 16 <= n; k += 16) step(k, 0, C > 1 ? 1 : 0);
  for (int j = 0; j < N; ++j) {
    a[j] = sum_chains<C, N>(ac, j);
    if (k < n) {
      const float* lut = fp8nv::e4m3_table().v;
      float r = 0.f;
      for (int i = k; i < n; ++i) r += lut[wb[i]] * xs[j][c0 + i];
      // The vector part carries the 2^-8 of the fp16 decode; bring the remainder to the same scale.
      a[j] = _mm256_add_ps(a[j], _mm256_setr_ps(r / fp8nv::kE4m3Fp16Unscale, 0, 0, 0, 0, 0, 0, 0));
    }
  }
}

// The order-permuted path of the avx2 tier (layers whose block size, H and I are multiples of 32):
// 32 weight bytes at a time become fp32 bit patterns with two byte unpacks, a shift and an AND per
// 16 and two word unpacks per 8, with no VPMOVSXBW or VCVTPH2PS (on Zen 3 the 4 sign extensions and
// 8 conversions per 64 bytes of the fp16 decode above held a core at ~14 TSC ticks per 64 weights
// in L1; this decode took ~11, docs/benchmarks.md). A byte b as the high word of an fp32 (b << 8,
// shifted right by 4 with its sign, bits 14..11 cleared) puts the sign at bit 31 and eeeemmm at
// bits 26..20: the e4m3 value times 2^-120, exactly, subnormal codes as fp32 subnormals. The word
// unpacks work within 128-bit lanes, so the 4 vectors of a 32-byte step hold elements
// {0-3, 16-19}, {4-7, 20-23}, {8-11, 24-27}, {12-15, 28-31}; x and the intermediate are stored in that
// order per 32 elements (perm_x_avx2) and scaled by 2^64: the products w * x * 2^-56 stay clear of
// the fp32 subnormal range for |w * x| >= 2^-70, and x' is finite for |x| < 2^64 (a bf16 activation
// of 2^64 or more becomes inf here). The totals are multiplied back by 2^56 (powers of two: exact).
constexpr float kPermXScale = 0x1p64f, kPermUnscale = 0x1p56f;

FT_TARGET_AVX2 inline void e4m3x32_perm_avx2(__m256i b, __m256i* d) {
  const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16(static_cast<short>(0x87FF));
  const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 4), m);
  const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 4), m);
  d[0] = _mm256_unpacklo_epi16(z, lo);
  d[1] = _mm256_unpackhi_epi16(z, lo);
  d[2] = _mm256_unpacklo_epi16(z, hi);
  d[3] = _mm256_unpackhi_epi16(z, hi);
}

// v[k0, k1) (multiples of 32) times kPermXScale into d[k0, k1) in e4m3x32_perm_avx2's order.
FT_TARGET_AVX2 void perm_x_avx2(const float* v, int k0, int k1, float* d) {
  const __m256 sc = _mm256_set1_ps(kPermXScale);
  for (int k = k0; k < k1; k += 32) {
    const __m256 v0 = _mm256_loadu_ps(v + k), v1 = _mm256_loadu_ps(v + k + 8);
    const __m256 v2 = _mm256_loadu_ps(v + k + 16), v3 = _mm256_loadu_ps(v + k + 24);
    _mm256_storeu_ps(d + k, _mm256_mul_ps(_mm256_permute2f128_ps(v0, v2, 0x20), sc));
    _mm256_storeu_ps(d + k + 8, _mm256_mul_ps(_mm256_permute2f128_ps(v0, v2, 0x31), sc));
    _mm256_storeu_ps(d + k + 16, _mm256_mul_ps(_mm256_permute2f128_ps(v1, v3, 0x20), sc));
    _mm256_storeu_ps(d + k + 24, _mm256_mul_ps(_mm256_permute2f128_ps(v1, v3, 0x31), sc));
  }
}

// Accumulator chains per vector of the permuted path: 8 or more FMAs in flight where 16 ymm
// registers allow (4 decoded weight vectors and 2 constants are live with them).
constexpr int perm_chains(int N) { return N <= 2 ? 4 : N <= 4 ? 2 : 1; }

// fp8_block_avx2 for the permuted path: n a multiple of 32; the 4 vectors of a step go to chains
// i % C.
template <int N, int C>
FT_TARGET_AVX2 __attribute__((always_inline)) inline void fp8_block_perm_avx2(const uint8_t* wb, int n,
                                                                              const float* const* xs, int c0,
                                                                              __m256* a) {
  __m256 ac[C][N];
  for (int c = 0; c < C; ++c)
    #pragma GCC unroll 8
    for (int j = 0; j < N; ++j) ac[c][j] = _mm256_setzero_ps();
  for (int k = 0; k < n; k += 32) {
    __m256i d[4];
    e4m3x32_perm_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k)), d);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < N; ++j)
        ac[i % C][j] = _mm256_fmadd_ps(_mm256_castsi256_ps(d[i]), _mm256_loadu_ps(xs[j] + c0 + k + 8 * i), ac[i % C][j]);
  }
  for (int j = 0; j < N; ++j) {
    a[j] = sum_chains<C, N>(ac, j);
  }
}

// One column block of a row for N vectors, by the path P (false: fp16 decode, true: permuted).
template <int N, bool P>
FT_TARGET_AVX2 __attribute__((always_inline)) inline void fp8_block_any_avx2(const uint8_t* wb, int n,
                                                                             const float* const* xs, int c0,
                                                                             __m256* a) {
  if constexpr (P) {
    fp8_block_perm_avx2<N, perm_chains(N)>(wb, n, xs, c0, a);
  } else {
    fp8_block_avx2<N, N == 1 ? 4 : N <= 2 ? 2 : 1>(wb, n, xs, c0, a);
  }
}

// Rows with N fp32 vectors: per column block the fp8 x fp32 products are summed in fp32 vectors (each
// 16 weights decoded once for all vectors), then scaled by the block's scale into a running total.
// One or two vectors: two chains per vector (the FMA latency), totals in registers. Three or more:
// one chain per vector (the vectors are the independent chains) and the totals in memory, touched
// once per block: 2N block accumulators and N totals next to the weights did not fit the 16 ymm
// registers, and the spills sat in the inner loop (8 vectors: 5.3x the time of one vector on a
// 2-core Zen 3, docs/benchmarks.md).
template <int N, bool P>
FT_TARGET_AVX2 void fp8_row_avx2(const uint8_t* w, const float* S, int B, const float* const* xs, int K, float* out,
                                 int os, const Prefetch& pf) {
  constexpr bool two = N <= 2;
  __m256 tot[two ? N : 1];
  alignas(32) float totm[two ? 1 : N][8];
  for (int j = 0; j < N; ++j) {
    if constexpr (two) {
      tot[j] = _mm256_setzero_ps();
    } else {
      _mm256_store_ps(totm[j], _mm256_setzero_ps());
    }
  }
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    pf.ahead_range(w + c0, n);
    __m256 a[N];
    fp8_block_any_avx2<N, P>(w + c0, n, xs, c0, a);
    const __m256 s = _mm256_set1_ps(S[c]);
    for (int j = 0; j < N; ++j) {
      if constexpr (two) {
        tot[j] = _mm256_fmadd_ps(a[j], s, tot[j]);
      } else {
        _mm256_store_ps(totm[j], _mm256_fmadd_ps(a[j], s, _mm256_load_ps(totm[j])));
      }
    }
  }
  for (int j = 0; j < N; ++j) {
    const __m256 t = two ? tot[j] : _mm256_load_ps(totm[two ? 0 : j]);
    out[j * os] = hsum8(t) * (P ? kPermUnscale : fp8nv::kE4m3Fp16Unscale);
  }
}

// Three or more vectors, a group of kFp8Group rows at a time, column block by column block: each
// block's x (N x B floats, 4 KiB for 8 vectors of B = 128) stays in L1 for the group, where the row
// at a time walk read every vector's whole x per row (64 KiB for 8 vectors of 2048: more than Zen 3's
// L1, so every x load came from L2). Per (row, vector) the arithmetic is fp8_row_avx2's for N >= 3,
// in the same order, so results do not depend on which path a row takes. The weights are read as
// kFp8Group streams of B bytes per block; the next group's lines of the same column block are
// prefetched meanwhile.
constexpr int kFp8Group = 8;
template <int N, bool P>
FT_TARGET_AVX2 void fp8_group_avx2(const uint8_t* W, size_t ld, const float* const* S, int B, const float* const* xs,
                                   int K, float* out, int os, const uint8_t* next) {
  static_assert(N >= 3, "fp8_row_avx2 keeps one or two vectors' totals in registers");
  alignas(32) float totm[kFp8Group][N][8] = {};
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    for (int r = 0; r < kFp8Group; ++r) {
      if (next) {
        for (int o = 0; o < n; o += 64) prefetch_line(reinterpret_cast<const char*>(next + r * ld + c0 + o));
      }
      __m256 a[N];
      fp8_block_any_avx2<N, P>(W + r * ld + c0, n, xs, c0, a);
      const __m256 s = _mm256_set1_ps(S[r][c]);
      for (int j = 0; j < N; ++j) _mm256_store_ps(totm[r][j], _mm256_fmadd_ps(a[j], s, _mm256_load_ps(totm[r][j])));
    }
  }
  for (int r = 0; r < kFp8Group; ++r)
    for (int j = 0; j < N; ++j) {
      out[j * os + r] = hsum8(_mm256_load_ps(totm[r][j])) * (P ? kPermUnscale : fp8nv::kE4m3Fp16Unscale);
    }
}

template <int N>
FT_TARGET_AVX512 void fp8_row_avx512(const uint8_t* w, const float* S, int B, const float* const* xs, int K,
                                     float* out, int os, const Prefetch& pf) {
  __m512 tot[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) tot[j] = _mm512_setzero_ps();
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    const uint8_t* wb = w + c0;
    pf.ahead_range(wb, n);
    __m512 a0[N], a1[N];
    #pragma GCC unroll 8
    for (int j = 0; j < N; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= n; k += 32) {
      __m512 w0, w1;
      fp8nv::e4m3x32_avx512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k)), w0, w1);
      for (int j = 0; j < N; ++j) {
        const float* xb = xs[j] + c0 + k;
        a0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), a0[j]);
        a1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), a1[j]);
      }
    }
    for (; k < n; k += 16) {
      const int r = std::min(16, n - k);
      const __mmask16 m = static_cast<__mmask16>((1u << r) - 1u);
      const __m512 wv = fp8nv::e4m3x16_avx512(_mm_maskz_loadu_epi8(m, wb + k));
      for (int j = 0; j < N; ++j) a0[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xs[j] + c0 + k), a0[j]);
    }
    const __m512 s = _mm512_set1_ps(S[c]);
    for (int j = 0; j < N; ++j) tot[j] = _mm512_fmadd_ps(_mm512_add_ps(a0[j], a1[j]), s, tot[j]);
  }
  for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(tot[j]) * fp8nv::kE4m3Fp16Unscale;
}

// e4m3 -> bf16 for the VDPBF16PS tier, 64 bytes at a time read as 32 words: the even elements (low
// bytes) and the odd ones (high bytes) each become 32 bf16 words. A byte s eeee mmm moved so that s
// is bit 15, eeee bits 10..7 and mmm bits 6..4 (an arithmetic shift of the byte at the top of the
// word by 4; bits 14..11 then copy s and are cleared), with bit 14 set: bf16 exponent field 128 + e,
// i.e. the e4m3 value times 2^(128 - 127 - (-7)) = 2^8, exactly, for every normal code (one VPTERNLOG
// clears and sets). Codes with exponent 0 (zeros and subnormals, m * 2^-9) are wrong that way; a
// chunk that holds any takes a fix-up: their bf16 (m / 2, the value times 2^8) from a VPERMW table
// indexed by m, then the sign.
constexpr float kBf16Unscale = 1.f / 256.f;

FT_TARGET_AVX512_BF16 inline __m512i e4m3_sub_bf16_lut() {
  // bf16 of m / 2 for m = 0..7 in words 0..7 (the rest unused).
  return _mm512_setr_epi32(0x3F000000, 0x3FC03F80, 0x40204000, 0x40604040, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

FT_TARGET_AVX512_BF16 inline void e4m3x64_bf16(__m512i b, __mmask64 valid, __m512i& we, __m512i& wo) {
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x87F0)), e128 = _mm512_set1_epi16(0x4000);
  const __m512i te = _mm512_srai_epi16(_mm512_slli_epi16(b, 8), 4);
  const __m512i to = _mm512_srai_epi16(b, 4);
  we = _mm512_ternarylogic_epi32(te, keep, e128, 0xEA);  // (A & B) | C
  wo = _mm512_ternarylogic_epi32(to, keep, e128, 0xEA);
  const __mmask64 sub = _mm512_mask_testn_epi8_mask(valid, b, _mm512_set1_epi8(0x78));
  if (sub) {  // rare in real checkpoints (values under 2^-6 of a code's range)
    const __m512i lut = e4m3_sub_bf16_lut(), sign = _mm512_set1_epi16(static_cast<short>(0x8000));
    const __mmask32 ke = _mm512_testn_epi16_mask(b, _mm512_set1_epi16(0x0078));
    const __mmask32 ko = _mm512_testn_epi16_mask(b, _mm512_set1_epi16(0x7800));
    we = _mm512_mask_permutexvar_epi16(we, ke, b, lut);  // VPERMW reads index bits 4..0: e0 m = m
    wo = _mm512_mask_permutexvar_epi16(wo, ko, _mm512_srli_epi16(b, 8), lut);
    we = _mm512_ternarylogic_epi32(we, te, sign, 0xF8);  // A | (B & C): the sign back
    wo = _mm512_ternarylogic_epi32(wo, to, sign, 0xF8);
  }
}

// A whole block of 128 (b0: elements 0..63, b1: 64..127) as the 4 vectors of its two chunks: even
// and odd words of each, with the exponent-0 fix-up only when the block holds such a code (one test
// for the two chunks).
FT_TARGET_AVX512_BF16 inline void e4m3x128_bf16(__m512i b0, __m512i b1, __m512i& we0, __m512i& wo0, __m512i& we1,
                                                __m512i& wo1) {
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x87F0)), e128 = _mm512_set1_epi16(0x4000);
  const __m512i ex = _mm512_set1_epi8(0x78);
  if (_kortestz_mask64_u8(_mm512_testn_epi8_mask(b0, ex), _mm512_testn_epi8_mask(b1, ex))) {
    we0 = _mm512_ternarylogic_epi32(_mm512_srai_epi16(_mm512_slli_epi16(b0, 8), 4), keep, e128, 0xEA);
    wo0 = _mm512_ternarylogic_epi32(_mm512_srai_epi16(b0, 4), keep, e128, 0xEA);
    we1 = _mm512_ternarylogic_epi32(_mm512_srai_epi16(_mm512_slli_epi16(b1, 8), 4), keep, e128, 0xEA);
    wo1 = _mm512_ternarylogic_epi32(_mm512_srai_epi16(b1, 4), keep, e128, 0xEA);
  } else {
    e4m3x64_bf16(b0, ~0ull, we0, wo0);
    e4m3x64_bf16(b1, ~0ull, we1, wo1);
  }
}

// A whole block of 128 weights at wb (prefetched as the stream asks) as the 4 bf16 vectors of
// e4m3x128_bf16: even and odd words of its two chunks.
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void fp8_block128_words(const uint8_t* wb,
                                                                                   const Prefetch& pf,
                                                                                   __m512i (&wv)[4]) {
  if (pf.dist) {
    pf.ahead(wb);
    pf.ahead(wb + 64);
  }
  e4m3x128_bf16(_mm512_loadu_si512(wb), _mm512_loadu_si512(wb + 64), wv[0], wv[1], wv[2], wv[3]);
}

// A block's products against one vector's 128 slots at xc in two chains (even and odd words), summed:
// the arithmetic of calls of one or two vectors.
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline __m512 fp8_block128_two_chains(const __m512i (&wv)[4],
                                                                                          const uint16_t* xc) {
  const __m512 z = _mm512_setzero_ps();
  __m512 ae = _mm512_dpbf16_ps(z, (__m512bh)wv[0], (__m512bh)_mm512_loadu_si512(xc));
  __m512 ao = _mm512_dpbf16_ps(z, (__m512bh)wv[1], (__m512bh)_mm512_loadu_si512(xc + 32));
  ae = _mm512_dpbf16_ps(ae, (__m512bh)wv[2], (__m512bh)_mm512_loadu_si512(xc + 64));
  ao = _mm512_dpbf16_ps(ao, (__m512bh)wv[3], (__m512bh)_mm512_loadu_si512(xc + 96));
  return _mm512_add_ps(ae, ao);
}

// Rows with N bf16 vectors in the chunk order of fp8_bf16_slot (per column block, chunks of 64: the
// even elements, then the odd ones). Per block: VDPBF16PS into two accumulators (even, odd words)
// per vector, then the block's scale.
template <int N>
FT_TARGET_AVX512_BF16 void fp8_row_bf16x(const uint8_t* w, const float* S, int B, const uint16_t* const* xs, int K,
                                         float* out, int os, const Prefetch& pf) {
  const int CB = (B + 63) / 64 * 64;
  __m512 tot[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) tot[j] = _mm512_setzero_ps();
  int c0 = 0, c = 0;
  if (B == 128) {
    // The usual block size, whole blocks: both chunks of a block decoded at once (one exponent-0 test
    // for the two), the block's products in straight-line code. Same operations in the same order as
    // the general loop below (bit-identical results), without its per-chunk loop and masks: measured
    // on Zen 5 (1 thread, in cache) 20 -> 30-34 GB/s.
    for (; c0 + 128 <= K; c0 += 128, ++c) {
      __m512i wv[4];
      fp8_block128_words(w + c0, pf, wv);
      const __m512 s = _mm512_set1_ps(S[c]);
      for (int j = 0; j < N; ++j) {
        const uint16_t* xc = xs[j] + static_cast<size_t>(c) * 128;
        if constexpr (N <= 2) {
          tot[j] = _mm512_fmadd_ps(fp8_block128_two_chains(wv, xc), s, tot[j]);
        } else {
          __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wv[0], (__m512bh)_mm512_loadu_si512(xc));
          a = _mm512_dpbf16_ps(a, (__m512bh)wv[1], (__m512bh)_mm512_loadu_si512(xc + 32));
          a = _mm512_dpbf16_ps(a, (__m512bh)wv[2], (__m512bh)_mm512_loadu_si512(xc + 64));
          a = _mm512_dpbf16_ps(a, (__m512bh)wv[3], (__m512bh)_mm512_loadu_si512(xc + 96));
          tot[j] = _mm512_fmadd_ps(a, s, tot[j]);
        }
      }
    }
  }
  for (; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    const uint8_t* wb = w + c0;
    pf.ahead_range(wb, n);
    // Two accumulators per vector (even, odd words) while there are few vectors; one beyond 2, where
    // the vectors alone keep the VDPBF16PS units busy and 32 registers would not hold them all.
    constexpr int NO = N <= 2 ? N : 1;
    __m512 ae[N], ao[NO];
    #pragma GCC unroll 8
    for (int j = 0; j < N; ++j) ae[j] = _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int j = 0; j < NO; ++j) ao[j] = _mm512_setzero_ps();
    auto odd = [&](int j) -> __m512& {
      if constexpr (N <= 2) return ao[j];
      return ae[j];
    };
    for (int q = 0; q < n; q += 64) {
      const int L = std::min(64, n - q);
      __m512i we, wo;
      if (L == 64) {
        e4m3x64_bf16(_mm512_loadu_si512(wb + q), ~0ull, we, wo);
        for (int j = 0; j < N; ++j) {
          const uint16_t* xc = xs[j] + static_cast<size_t>(c) * CB + q;
          ae[j] = _mm512_dpbf16_ps(ae[j], (__m512bh)we, (__m512bh)_mm512_loadu_si512(xc));
          odd(j) = _mm512_dpbf16_ps(odd(j), (__m512bh)wo, (__m512bh)_mm512_loadu_si512(xc + 32));
        }
      } else {
        const __mmask64 valid = (1ull << L) - 1;
        const __mmask32 me = static_cast<__mmask32>((1ull << ((L + 1) / 2)) - 1), mo = static_cast<__mmask32>((1ull << (L / 2)) - 1);
        e4m3x64_bf16(_mm512_maskz_loadu_epi8(valid, wb + q), valid, we, wo);
        for (int j = 0; j < N; ++j) {
          const uint16_t* xc = xs[j] + static_cast<size_t>(c) * CB + q;
          ae[j] = _mm512_dpbf16_ps(ae[j], (__m512bh)we, (__m512bh)_mm512_maskz_loadu_epi16(me, xc));
          odd(j) = _mm512_dpbf16_ps(odd(j), (__m512bh)wo, (__m512bh)_mm512_maskz_loadu_epi16(mo, xc + 32));
        }
      }
    }
    const __m512 s = _mm512_set1_ps(S[c]);
    for (int j = 0; j < N; ++j) {
      tot[j] = _mm512_fmadd_ps(N <= 2 ? _mm512_add_ps(ae[j], ao[j % NO]) : ae[j], s, tot[j]);  // NO == N there
    }
  }
  for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(tot[j]) * kBf16Unscale;
}

// One row of fp8_row_bf16x<1> over whole blocks of 128 (K a multiple of 128), before its horizontal
// sum: the same operations in the same order.
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline __m512 fp8_row128_bf16x_total(const uint8_t* w,
                                                                                        const float* S,
                                                                                        const uint16_t* x, int K,
                                                                                        const Prefetch& pf) {
  __m512 tot = _mm512_setzero_ps();
  for (int c0 = 0, c = 0; c0 < K; c0 += 128, ++c) {
    __m512i wv[4];
    fp8_block128_words(w + c0, pf, wv);
    tot = _mm512_fmadd_ps(fp8_block128_two_chains(wv, x + static_cast<size_t>(c) * 128), _mm512_set1_ps(S[c]), tot);
  }
  return tot;
}

// Rows r0 .. r0 + nrows - 1 (W: row r0, ld bytes apart) against one vector, block size 128 and K a
// multiple of 128: fp8_row_bf16x<1>'s arithmetic row by row in address order, in one call, the sums of
// 4 rows at a time from one transposed reduction (row_reduce.h: the tree of _mm512_reduce_add_ps, so
// every row's result is the same bits as fp8_row_bf16x<1>'s). Against a call and a reduction per row,
// one Zen 4 core with a qwen3-30b-a3b expert in cache: pass 1 96 -> 85 us, pass 2 (rows of 768
// bytes) 60 -> 51 (docs/benchmarks.md, thirty-sixth session).
FT_TARGET_AVX512_BF16 void fp8_rows128_one_bf16x(const uint8_t* W, size_t ld, int r0, int nrows, const float* S,
                                                 int nbK, const uint16_t* x, int K, float* out,
                                                 const Prefetch& pf) {
  auto scales = [&](int r) { return S + static_cast<size_t>((r0 + r) / 128) * nbK; };
  int r = 0;
  for (; r + 4 <= nrows; r += 4) {
    const __m512 t0 = fp8_row128_bf16x_total(W + r * ld, scales(r), x, K, pf);
    const __m512 t1 = fp8_row128_bf16x_total(W + (r + 1) * ld, scales(r + 1), x, K, pf);
    const __m512 t2 = fp8_row128_bf16x_total(W + (r + 2) * ld, scales(r + 2), x, K, pf);
    const __m512 t3 = fp8_row128_bf16x_total(W + (r + 3) * ld, scales(r + 3), x, K, pf);
    _mm_storeu_ps(out + r, _mm_mul_ps(rowred::hsum_x4(t0, t1, t2, t3), _mm_set1_ps(kBf16Unscale)));
  }
  for (; r < nrows; ++r) out[r] = rowred::hsum(fp8_row128_bf16x_total(W + r * ld, scales(r), x, K, pf)) * kBf16Unscale;
}

// Two rows of fp8_row_bf16x at once, for N >= 3 vectors and whole blocks of 128 (B == 128, K a
// multiple of 128): each vector's 4 loads of a block serve both rows. Zen 4 loads one 512-bit line
// a cycle and runs VDPBF16PS at about one a cycle, and one row spent 4 loads on 4 products per
// vector (docs/benchmarks.md, fourteenth session). Each row's sums are fp8_row_bf16x's (its N >= 3
// branch): the same products in the same order, so results do not depend on how rows pair up.
template <int N>
FT_TARGET_AVX512_BF16 void fp8_row_pair_bf16x(const uint8_t* w0, const uint8_t* w1, const float* S0, const float* S1,
                                              const uint16_t* const* xs, int K, float* out, int os,
                                              const Prefetch& pf) {
  static_assert(N >= 3, "fp8_row_bf16x keeps two accumulators per vector below 3");
  __m512 t0[N], t1[N];
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) t0[j] = t1[j] = _mm512_setzero_ps();
  for (int c0 = 0, c = 0; c0 < K; c0 += 128, ++c) {
    if (pf.dist) {
      pf.ahead(w0 + c0);
      pf.ahead(w0 + c0 + 64);
      pf.ahead(w1 + c0);
      pf.ahead(w1 + c0 + 64);
    }
    __m512i a[4], b[4];
    e4m3x128_bf16(_mm512_loadu_si512(w0 + c0), _mm512_loadu_si512(w0 + c0 + 64), a[0], a[1], a[2], a[3]);
    e4m3x128_bf16(_mm512_loadu_si512(w1 + c0), _mm512_loadu_si512(w1 + c0 + 64), b[0], b[1], b[2], b[3]);
    dot128_pair_bf16<N>(a, b, _mm512_set1_ps(S0[c]), _mm512_set1_ps(S1[c]), xs, static_cast<size_t>(c) * 128, t0,
                        t1);
  }
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) {
    out[j * os] = _mm512_reduce_add_ps(t0[j]) * kBf16Unscale;
    out[j * os + 1] = _mm512_reduce_add_ps(t1[j]) * kBf16Unscale;
  }
}

// ---- AMX tiles (avx512_bf16 tier on CPUs with AMX-BF16; block_size 128, K a multiple of 128) ----
//
// 16 rows at a time (one row block of scales): per column block each row's 128 bytes decode as above
// to 4 x 32 bf16 words (even and odd elements of its two chunks of 64), stored as 4 A tiles; the x
// vectors' 4 pieces of 32 words of that block are the B tiles (amx_tiles.h). TDPBF16PS sums each
// piece into its own C tile, zeroed per block; the 4 C tiles are then added and scaled by the
// block's scale into 16 rows x tokens fp32 totals. The products are exact (e4m3 in bf16 times bf16
// x), the sums fp32 in an order of the tiles' own. On the GPU machine's Xeon the tiles cost the same
// for 1 to 8 vectors (~500 cycles per 16 rows and 128 columns in ds_fp4's kernels), so the format
// uses them for calls of amx::min_vectors() vectors or more (batch 8 sharing its experts).
struct Fp8AmxScratch {
  AlignedBuffer<uint16_t> a;  // two sets of 4 A tiles
  AlignedBuffer<uint32_t> b;  // packed B tiles (2..8 tokens)
};

FT_TARGET_AVX512_BF16 void fp8_amx_groups(const uint8_t* W, int r0, int groups, const float* S,
                                          const void* const* xs, int n, int K, float* out, int os, int prefetch) {
  using namespace amx;
  constexpr int B = 128;
  const int nbK = K / B;
  const size_t ld = static_cast<size_t>(K);
  Fp8AmxScratch& sc = ThreadObjects::get<Fp8AmxScratch>();
  const int cols = n == 1 ? 1 : kWide;
  const BTiles bt = b_tiles(xs, n, nbK, sc.b);
  sc.a.resize(2 * 4 * kGroup * 32);

  // Prefetch by columns (a block of the group's 16 rows: 2 lines a row), `ahead` columns ahead.
  const int ahead = prefetch > 0 ? std::max(1, prefetch / (kGroup * B)) : 0;
  const long columns = static_cast<long>(groups) * nbK;
  auto prefetch_column = [&](long col) {
    if (col >= columns) return;
    const long g = col / nbK, c = col % nbK;
    const char* p = reinterpret_cast<const char*>(W) + static_cast<size_t>(g) * kGroup * ld + B * c;
    for (int r = 0; r < kGroup; ++r) {
      prefetch_line(p + r * ld);
      prefetch_line(p + r * ld + 64);
    }
  };
  for (long col = 0; col < ahead; ++col) prefetch_column(col);

  load_config(cols);
  alignas(64) float cbuf[4][kGroup * kWide];
  for (int g = 0; g < groups; ++g) {
    const uint8_t* Wg = W + static_cast<size_t>(g) * kGroup * ld;
    const float* sg = S + static_cast<size_t>((r0 + g * kGroup) / B) * nbK;
    __m512 acc[kWide];  // [r * cols + t] flat: cols vectors of 16
    #pragma GCC unroll 8
    for (int v = 0; v < kWide; ++v) acc[v] = _mm512_setzero_ps();
    for (int c = 0; c < nbK; ++c) {
      if (ahead) prefetch_column(static_cast<long>(g) * nbK + c + ahead);
      uint16_t* ab = sc.a.data() + (c & 1) * 4 * kGroup * 32;
      for (int r = 0; r < kGroup; ++r) {
        const uint8_t* wb = Wg + r * ld + static_cast<size_t>(B) * c;
        __m512i we0, wo0, we1, wo1;
        e4m3x128_bf16(_mm512_loadu_si512(wb), _mm512_loadu_si512(wb + 64), we0, wo0, we1, wo1);
        store_a_row(ab, r, we0, wo0, we1, wo1);
      }
      zero_c();
      multiply_step(ab, bt, c);
      store_c(cbuf, cols);
      const __m512 scale = _mm512_set1_ps(sg[c]);
      for (int v = 0; v < cols; ++v) {
        const __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(cbuf[0] + 16 * v), _mm512_load_ps(cbuf[1] + 16 * v)),
                                       _mm512_add_ps(_mm512_load_ps(cbuf[2] + 16 * v), _mm512_load_ps(cbuf[3] + 16 * v)));
        acc[v] = _mm512_fmadd_ps(t, scale, acc[v]);
      }
    }
    float* og = out + g * kGroup;
    const __m512 unscale = _mm512_set1_ps(kBf16Unscale);
    if (n == 1) {
      _mm512_storeu_ps(og, _mm512_mul_ps(acc[0], unscale));
    } else {
      for (int v = 0; v < kWide; ++v) _mm512_store_ps(cbuf[0] + 16 * v, _mm512_mul_ps(acc[v], unscale));
      store_tokens(cbuf[0], n, og, os);
    }
  }
  tile_release();
}

#endif  // FT_X86

// Where element k of a vector goes for the bf16 tier: column block k / B holds ceil(B / 64) chunks of
// 64 slots; a chunk's element i at slot i / 2 (even i) or 32 + i / 2 (odd i).
inline size_t fp8_bf16_slot(int k, int B) {
  const int CB = (B + 63) / 64 * 64, blk = k / B, i = k % B, q = i / 64, r = i % 64;
  return static_cast<size_t>(blk) * CB + q * 64 + (r & 1) * 32 + r / 2;
}
// d[fp8_bf16_slot(k, B)] = value(k) for k in [k0, k1), with one division per column block instead of
// four per element (the prep of x was ~12 us of a decode step on the GPU machine's Xeon).
template <class F>
inline void fill_bf16_slots(int k0, int k1, int B, uint16_t* d, F value) {
  const size_t CB = static_cast<size_t>((B + 63) / 64 * 64);
  for (int k = k0; k < k1;) {
    const int blk = k / B, end = std::min(k1, (blk + 1) * B);
    uint16_t* db = d + blk * CB;
    for (int i = k - blk * B; k < end; ++k, ++i) db[(i & ~63) + (i & 1) * 32 + ((i & 63) >> 1)] = value(k);
  }
}
inline size_t fp8_bf16_len(int K, int B) { return static_cast<size_t>((K + B - 1) / B) * ((B + 63) / 64 * 64); }

#if FT_X86
// fill_bf16_slots with AVX-512 for whole chunks (64 elements from a multiple of 64 within their
// column block, inside [k0, k1)), the rest as above: bf16 words (x) or fp32 rounded to bf16 as
// f32_to_bf16 does (h). Serial on the calling thread before every run, the scalar loop took x ~5 us of
// a decode step on the GPU machine's Xeon, ~40 us at batch 8.
// The 64 words a[0..31], b[0..31] (element e is word e of a:b) as a chunk: evens, then odds.
FT_TARGET_AVX512 inline void store_chunk(__m512i a, __m512i b, uint16_t* dst) {
  alignas(64) uint16_t ie[32], io[32];
  for (int m = 0; m < 32; ++m) ie[m] = static_cast<uint16_t>(2 * m), io[m] = static_cast<uint16_t>(2 * m + 1);
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, _mm512_load_si512(ie), b));
  _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, _mm512_load_si512(io), b));
}
// 32 fp32 as bf16 words (f32_to_bf16: nearest even, a NaN stays a quiet NaN), in order.
FT_TARGET_AVX512 inline __m512i bf16x32(const float* v) {
  __m512i w[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i bits = _mm512_loadu_si512(v + 16 * h);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, bits, _mm512_set1_epi32(0x00400000));
    w[h] = _mm512_srli_epi32(r, 16);
  }
  return _mm512_permutex2var_epi16(w[0], _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36,
                                                          34, 32, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8,
                                                          6, 4, 2, 0),
                                   w[1]);
}
template <class Chunk, class F>
FT_TARGET_AVX512 void fill_bf16_slots_avx512(int k0, int k1, int B, uint16_t* d, Chunk chunk, F value) {
  const size_t CB = static_cast<size_t>((B + 63) / 64 * 64);
  for (int k = k0; k < k1;) {
    const int blk = k / B, end = std::min(k1, (blk + 1) * B), i = k - blk * B;
    if (i % 64 == 0 && k + 64 <= end) {
      __m512i a, b;
      chunk(k, a, b);
      store_chunk(a, b, d + blk * CB + i);
      k += 64;
    } else {
      const int stop = std::min(end, k + 64 - i % 64);  // to the next chunk boundary
      fill_bf16_slots(k, stop, B, d, value);
      k = stop;
    }
  }
}
#endif

// Rows r0..r0+nrows-1 of one matrix against n vectors: W points at row r0 (row stride K bytes); S is
// the matrix's scale grid [nb(rows), nb(K)] whose row-block (r0 + r) / B scales row r;
// out[j * os + r]. Vectors: fp32 (scalar, avx2, avx512), in perm_x_avx2's order and scale where `perm`
// (avx2), or bf16 in fp8_bf16_slot order (avx512_bf16).
void fp8_rows(Isa isa, const uint8_t* W, int r0, int nrows, const float* S, int B, const void* const* xs, int n,
              int K, float* out, int os, int prefetch, int amx_min, bool perm) {
  const int nbK = (K + B - 1) / B;
  const size_t ld = static_cast<size_t>(K);
#if FT_X86
  // amx_min > 0: the tiles for calls of that many vectors or more (whole groups of 16 rows of one
  // row block; the rows after the last group as below).
  if (amx_min > 0 && n >= amx_min && isa == Isa::avx512_bf16 && B == 128 && K % 128 == 0 && r0 % 16 == 0 &&
      nrows >= 16) {
    const int groups = nrows / 16, done = 16 * groups;
    fp8_amx_groups(W, r0, groups, S, xs, std::min(n, amx::kWide), K, out, os, prefetch);
    if (done < nrows) {
      fp8_rows(isa, W + done * ld, r0 + done, nrows - done, S, B, xs, n, K, out + done, os, prefetch, 0, false);
    }
    return;
  }
  if (isa != Isa::scalar) {
    const Prefetch pf(W, nrows * ld, prefetch);
    // fp8_row_pair_bf16x where rows are long enough (stream_prefetch.h's multirow). On the 2-core Zen 5
    // (2 threads, batch 8 shared, us a step) pairs of qwen3-30b-a3b's down rows (768 bytes) lost: 2249
    // with every row paired against 1815 with only the gate/up rows of 2048 bytes (docs/benchmarks.md,
    // twenty-fourth session).
    const bool pairs = multirow(ld, n);
    if (isa == Isa::avx512_bf16 && n == 1 && B == 128 && K % 128 == 0) {
      fp8_rows128_one_bf16x(W, ld, r0, nrows, S, nbK, static_cast<const uint16_t*>(xs[0]), K, out, pf);
      return;
    }
    for (int r = 0; r < nrows; ++r) {
      const float* s = S + static_cast<size_t>((r0 + r) / B) * nbK;
      const uint8_t* w = W + r * ld;
      if (isa == Isa::avx512_bf16) {
        const uint16_t* const* xb = reinterpret_cast<const uint16_t* const*>(xs);
        if (n >= 3 && B == 128 && K % 128 == 0 && r + 1 < nrows && pairs) {
          const float* s1 = S + static_cast<size_t>((r0 + r + 1) / B) * nbK;
          dispatch_n(n, [&](auto nv) {
            if constexpr (decltype(nv)::value >= 3) {
              fp8_row_pair_bf16x<decltype(nv)::value>(w, w + ld, s, s1, xb, K, out + r, os, pf);
            }
          });
          ++r;
          continue;
        }
        dispatch_n(n, [&](auto nv) { fp8_row_bf16x<decltype(nv)::value>(w, s, B, xb, K, out + r, os, pf); });
      } else if (isa == Isa::avx512) {
        const float* const* xf = reinterpret_cast<const float* const*>(xs);
        dispatch_n(n, [&](auto nv) { fp8_row_avx512<decltype(nv)::value>(w, s, B, xf, K, out + r, os, pf); });
      } else {
        const float* const* xf = reinterpret_cast<const float* const*>(xs);
        if (n >= 3 && r + kFp8Group <= nrows) {
          // A group of rows (fp8_group_avx2); the next group's first column block is prefetched by
          // the group itself, this group's by the previous one or the hardware.
          const float* sg[kFp8Group];
          for (int i = 0; i < kFp8Group; ++i) sg[i] = S + static_cast<size_t>((r0 + r + i) / B) * nbK;
          const uint8_t* next = r + 2 * kFp8Group <= nrows && prefetch ? w + kFp8Group * ld : nullptr;
          dispatch_n(n, [&](auto nv) {
            if constexpr (decltype(nv)::value >= 3) {
              if (perm) {
                fp8_group_avx2<decltype(nv)::value, true>(w, ld, sg, B, xf, K, out + r, os, next);
              } else {
                fp8_group_avx2<decltype(nv)::value, false>(w, ld, sg, B, xf, K, out + r, os, next);
              }
            }
          });
          r += kFp8Group - 1;
          continue;
        }
        dispatch_n(n, [&](auto nv) {
          if (perm) {
            fp8_row_avx2<decltype(nv)::value, true>(w, s, B, xf, K, out + r, os, pf);
          } else {
            fp8_row_avx2<decltype(nv)::value, false>(w, s, B, xf, K, out + r, os, pf);
          }
        });
      }
    }
    return;
  }
#endif
  (void)isa, (void)prefetch, (void)perm;
  for (int j = 0; j < n; ++j) {
    const float* x = static_cast<const float*>(xs[j]);
    for (int r = 0; r < nrows; ++r) {
      out[j * os + r] = fp8_row_scalar(W + r * ld, S + static_cast<size_t>((r0 + r) / B) * nbK, B, x, K);
    }
  }
}

// $FT_CPU_MOE_FP8_KERNELS (auto, bf16 or amx), read when a layer is made: in the avx512_bf16 tier
// `amx` (auto where the CPU runs AMX-BF16 tiles) puts calls of amx::min_vectors() vectors or more on
// the tiles (layers of block_size 128; other block sizes keep VDPBF16PS), `bf16` keeps VDPBF16PS for
// every call. Returns the vector count from which the tiles run, 0 for never.
int fp8_amx_min(Isa isa) {
  const std::string v = amx::kernel_choice("FT_CPU_MOE_FP8_KERNELS", isa,
                                           {{"bf16", Isa::avx512_bf16}, {"amx", Isa::avx512_bf16}},
                                           "auto, bf16 or amx");
  if (isa != Isa::avx512_bf16 || v == "bf16" || !cpu_amx_bf16()) return 0;
  return amx::min_vectors();
}

int checked_block_size(FormatArgs& args) {
  const double b = args.option_or("block_size", 128);
  if (!(b >= 1 && b <= 65536) || b != std::floor(b)) {
    throw Error(args.context() + ": option 'block_size' must be an integer in [1, 65536] (rows and columns " +
                "per scale block), got " + std::to_string(b));
  }
  return static_cast<int>(b);
}

class Fp8BlockFormat final : public MoeFormat {
 public:
  Fp8BlockFormat(const MoeParams& p, FormatArgs& args) : p_(p), B_(checked_block_size(args)) {
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    nbH_ = (p.hidden + B_ - 1) / B_;
    nbI_ = (p.intermediate + B_ - 1) / B_;
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H}, DType::u8));
    s13_ = static_cast<const float*>(args.require_bank("w13_scale", {E, 2LL * nbI_, nbH_}, DType::f32));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I}, DType::u8));
    s2_ = static_cast<const float*>(args.require_bank("w2_scale", {E, nbH_, nbI_}, DType::f32));
    b13_ = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
    b2_ = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  }

  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    return gate_up_down_streams(pass2, w13_, p_.hidden, w2_, p_.intermediate, p_.intermediate, p_.hidden, e, r0, r1,
                                out);
  }

  // prep_inter writes each element to its own slot (padding slots are never read: the kernels mask
  // them), so any unit size works.
  int pass1_rows() const override { return 32; }
  // The intermediate is prepared (bf16 slots, or the avx2 order) 256 rows at a time, whatever the
  // units: pass-1 units can then grow where a run has few experts per thread (executor.cpp's
  // pass1_rows_for; 2 threads of the Zen 5 dev box: 882 -> 814 us a batch-1 step, docs/benchmarks.md,
  // twenty-seventh session). Pass 2 waits for a whole expert's intermediate either way.
  int prep_rows() const override { return 256; }
  // $FT_CPU_MOE_FP8_KERNELS's names in avx512_bf16 (amx only where tiles run); fp32 below it.
  std::string kernels() const override { return bf16x() ? (amx_min_ > 0 ? "amx" : "bf16") : "fp32"; }
  int pass2_rows() const override { return kPass2Rows; }
  // Two levels in one-vector calls on Intel at any pool size: on the GPU machine's 16-core Xeon,
  // batch 1 at 16 threads, 8 rounds in two VMs alternating FT_CPU_MOE_PREFETCH_L1=1024 with the
  // default, the paired ratio gain had medians of +0.012 (ahead in 6 of 8); ds_fp4 and nvfp4 showed
  // none (docs/benchmarks.md, thirty-eighth session). Calls of several vectors were not measured.
  bool two_level_prefetch_any_pool(int vectors) const override { return vectors == 1 && cpu_is_intel(); }

  void prep_input(const TaskInput& in) override {
    if (perm_) {
      xp_.resize(static_cast<size_t>(in.num_tokens) * xp_stride());
#if FT_X86
      for (int t = 0; t < in.num_tokens; ++t) {
        perm_x_avx2(in.x_f32 + static_cast<size_t>(t) * p_.hidden, 0, p_.hidden, xp_.data() + t * xp_stride());
      }
#endif
      return;
    }
    if (!bf16x()) return;
    const size_t len = xb_stride();
    xb_.resize(static_cast<size_t>(in.num_tokens) * len);
    for (int t = 0; t < in.num_tokens; ++t) {
      const uint16_t* x = in.x_bf16 + static_cast<size_t>(t) * p_.hidden;
      uint16_t* d = xb_.data() + t * len;
#if FT_X86
      fill_bf16_slots_avx512(
          0, p_.hidden, B_, d,
          [x](int k, __m512i& a, __m512i& b) FT_TARGET_AVX512 {
            a = _mm512_loadu_si512(x + k);
            b = _mm512_loadu_si512(x + k + 32);
          },
          [x](int k) { return x[k]; });
#else
      fill_bf16_slots(0, p_.hidden, B_, d, [x](int k) { return x[k]; });
#endif
    }
  }

  size_t inter_prep_bytes() const override {
    return perm_ ? static_cast<size_t>(p_.intermediate) * 4 : bf16x() ? fp8_bf16_len(p_.intermediate, B_) * 2 : 0;
  }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
#if FT_X86
    if (perm_) {
      perm_x_avx2(h, i0, i1, static_cast<float*>(prepped));
      return;
    }
#endif
    uint16_t* d = static_cast<uint16_t*>(prepped);
#if FT_X86
    fill_bf16_slots_avx512(
        i0, i1, B_, d,
        [h](int k, __m512i& a, __m512i& b) FT_TARGET_AVX512 {
          a = bf16x32(h + k);
          b = bf16x32(h + k + 32);
        },
        [h](int k) { return f32_to_bf16(h[k]); });
#else
    fill_bf16_slots(i0, i1, B_, d, [h](int k) { return f32_to_bf16(h[k]); });
#endif
  }

  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    gate_up_tokens(in, e, &t, &in_scale, 1, i0, i1, gate, up, 0);
  }

  void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0, int i1,
                      float* gate, float* up, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const uint8_t* base = w13_ + static_cast<size_t>(e) * 2 * I * H;
    const float* sg = s13_ + static_cast<size_t>(e) * 2 * nbI_ * nbH_;
    const float* su = sg + static_cast<size_t>(nbI_) * nbH_;
    const void* xs[fp8nv::kMaxVectors];
    for (int j = 0; j < n; ++j) {
      xs[j] = bf16x()  ? static_cast<const void*>(xb_.data() + tokens[j] * xb_stride())
              : perm_ ? static_cast<const void*>(xp_.data() + tokens[j] * xp_stride())
                      : static_cast<const void*>(in.x_f32 + tokens[j] * H);
    }
    const int rows = i1 - i0, K = p_.hidden;
    auto part = [&](int r, int c, bool is_up) {
      fp8_rows(p_.isa, base + ((is_up ? I : 0) + i0 + r) * H, i0 + r, c, is_up ? su : sg, B_, xs, n, K,
               (is_up ? up : gate) + r, stride, pf_, amx_min_, perm_);
    };
    gate_up_slices(rows, H, n, part);  // one vector: gate and up in turns (stream_prefetch.h)
    const float* bg = b13_ ? b13_ + static_cast<size_t>(e) * 2 * I + i0 : nullptr;
    for (int j = 0; j < n; ++j) {
      float* g = gate + j * stride;
      float* u = up + j * stride;
      for (int i = 0; i < rows; ++i) {
        g[i] = in_scales[j] * g[i] + (bg ? bg[i] : 0.f);
        u[i] = in_scales[j] * u[i] + (bg ? bg[I + i] : 0.f);
      }
    }
  }

  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    const uint8_t* w = w2_ + static_cast<size_t>(e) * H * I + static_cast<size_t>(h0) * I;
    const float* s = s2_ + static_cast<size_t>(e) * nbH_ * nbI_;
    const void* hs[fp8nv::kMaxVectors];
    for (int j = 0; j < n; ++j) {
      hs[j] = bf16x() || perm_ ? routes[j].h_prepped : static_cast<const void*>(routes[j].h);
    }
    fp8_rows(p_.isa, w, h0, rows, s, B_, hs, n, p_.intermediate, out, stride, pf_, amx_min_, perm_);
    if (b2_) {
      const float* b = b2_ + static_cast<size_t>(e) * H + h0;
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < rows; ++i) out[j * stride + i] += b[i];
      }
    }
  }

 private:
  static constexpr int kPass2Rows = 32;
  bool bf16x() const { return p_.isa == Isa::avx512_bf16; }
  size_t xp_stride() const { return vec_stride(static_cast<size_t>(p_.hidden) * 4) / 4; }  // floats
  size_t xb_stride() const { return vec_stride(fp8_bf16_len(p_.hidden, B_) * 2) / 2; }      // bf16 words

  MoeParams p_;
  int pf_ = p_.prefetch;  // after p_ (declaration order)
  int B_;
  // Vectors per call from which the AMX tiles run (0: never; FT_CPU_MOE_FP8_KERNELS, amx_tiles.h).
  int amx_min_ = fp8_amx_min(p_.isa);
  // The avx2 tier's permuted path (fp8_block_perm_avx2): block size, H and I multiples of 32.
  bool perm_ = p_.isa == Isa::avx2 && B_ % 32 == 0 && p_.hidden % 32 == 0 && p_.intermediate % 32 == 0;
  int nbH_ = 0, nbI_ = 0;
  const uint8_t* w13_;
  const float* s13_;
  const uint8_t* w2_;
  const float* s2_;
  const float* b13_;
  const float* b2_;
  AlignedBuffer<uint16_t> xb_;  // x as bf16 in fp8_bf16_slot order, [T, xb_stride()] (avx512_bf16)
  AlignedBuffer<float> xp_;     // x in perm_x_avx2's order and scale, [T, xp_stride()] (avx2, perm_)
};

std::unique_ptr<MoeFormat> make_fp8_block_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Fp8BlockFormat>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("fp8_block", &make_fp8_block_format);

}  // namespace ft
