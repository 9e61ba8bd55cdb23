// Row kernels of the FP4 formats (fp4_common.h), one per ISA tier, the prepared-vector layouts and
// the fp8 e4m3 activation round trip. No format is registered here: mxfp4.cpp and ds_fp4.cpp use it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "avx2_pairs.h"
#include "byte_scan.h"
#include "dispatch_n.h"
#include "fp4_avx512.h"
#include "fp4_common.h"
#include "int8_codes.h"
#include "reduce_n.h"
#include "row_reduce.h"
#include "stream_prefetch.h"

namespace ft {
namespace fp4 {

const float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                         -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

E8m0Table::E8m0Table() {
  for (int s = 0; s < 255; ++s) v[s] = std::ldexp(1.f, s - 127);
  v[255] = std::nanf("");
}
const E8m0Table kE8m0;

E8m0Half4Table::E8m0Half4Table() {
  for (int s = 0; s < 256; ++s) {
    for (float& f : v[s]) f = 0.5f * kE8m0.v[s];
  }
}
const E8m0Half4Table kE8m0Half4;

namespace {

// Software prefetch `dist` bytes ahead within one stream (stream_prefetch.h), into L2 (T1), not L1:
// measured on Zen 4 with these compute-heavy rows, a T0 prefetch 8 KiB ahead left them at half the
// read bandwidth (the L1 miss buffers fill), T1 brought them to it.
using Prefetch = StreamPrefetch<PrefetchHint::L2>;

// Weights and scales of one call: two streams, the scales 1/16 of the weights.
struct Streams {
  Prefetch w, s;
};

void dot_rows_scalar(const uint8_t* W, const uint8_t* S, int nrows, const float* x, int K, float* out) {
  const int nb = K / 32;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    float acc = 0.f;
    for (int b = 0; b < nb; ++b) {
      float t = 0.f;
      for (int j = 0; j < 16; ++j) {
        const uint8_t v = w[16 * b + j];
        t += kE2m1[v & 15] * x[32 * b + 2 * j] + kE2m1[v >> 4] * x[32 * b + 2 * j + 1];
      }
      acc += t * kE8m0.v[s[b]];
    }
    out[r] = acc;
  }
}

// N vectors at once (the kernels below): each block of a row is decoded once and multiplied into N
// accumulators, so a batch costs little more than one vector while the weights stream from DRAM.
// out[j * os] = row . xs[j]. Scalar: the same arithmetic, per vector, as dot_rows_scalar.
template <int N>
void dot_row_multi_scalar(const uint8_t* w, const uint8_t* s, const float* const* xs, int K, float* out, int os) {
  const int nb = K / 32;
  float acc[N] = {};
  float v[32];
  for (int b = 0; b < nb; ++b) {
    for (int j = 0; j < 16; ++j) {
      v[2 * j] = kE2m1[w[16 * b + j] & 15];
      v[2 * j + 1] = kE2m1[w[16 * b + j] >> 4];
    }
    const float sc = kE8m0.v[s[b]];
    for (int n = 0; n < N; ++n) {
      const float* x = xs[n] + 32 * b;
      float t = 0.f;
      for (int j = 0; j < 16; ++j) t += v[2 * j] * x[2 * j] + v[2 * j + 1] * x[2 * j + 1];
      acc[n] += t * sc;
    }
  }
  for (int n = 0; n < N; ++n) out[n * os] = acc[n];
}

#if FT_X86


// One block of 32: 2 * e2m1 as int8 through PSHUFB, widened to fp32; x holds the block's 16 even
// then 16 odd elements. Returns 2 * (block . x) in 8 lanes.
FT_TARGET_AVX2 inline __m256 block_avx2(const uint8_t* w, const float* x) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m));
  const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m));
  const __m256 l0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  const __m256 l1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
  const __m256 h0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  const __m256 h1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
  __m256 t = _mm256_mul_ps(l0, _mm256_loadu_ps(x));
  t = _mm256_fmadd_ps(l1, _mm256_loadu_ps(x + 8), t);
  t = _mm256_fmadd_ps(h0, _mm256_loadu_ps(x + 16), t);
  return _mm256_fmadd_ps(h1, _mm256_loadu_ps(x + 24), t);
}

FT_TARGET_AVX2 void dot_rows_avx2(const uint8_t* W, const uint8_t* S, int nrows, const float* x, int K,
                                  float* out, const Streams& pf) {
  const int nb = K / 32;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (pf.s.dist) pf.s.ahead(s);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
      if (pf.w.dist) pf.w.ahead(w + 16 * b);
      a0 = _mm256_fmadd_ps(block_avx2(w + 16 * b, x + 32 * b), _mm256_set1_ps(kE8m0.v[s[b]]), a0);
      a1 = _mm256_fmadd_ps(block_avx2(w + 16 * b + 16, x + 32 * b + 32), _mm256_set1_ps(kE8m0.v[s[b + 1]]), a1);
      a2 = _mm256_fmadd_ps(block_avx2(w + 16 * b + 32, x + 32 * b + 64), _mm256_set1_ps(kE8m0.v[s[b + 2]]), a2);
      a3 = _mm256_fmadd_ps(block_avx2(w + 16 * b + 48, x + 32 * b + 96), _mm256_set1_ps(kE8m0.v[s[b + 3]]), a3);
    }
    for (; b < nb; ++b) {
      a0 = _mm256_fmadd_ps(block_avx2(w + 16 * b, x + 32 * b), _mm256_set1_ps(kE8m0.v[s[b]]), a0);
    }
    // The LUT held 2 * e2m1: halve (exact).
    out[r] = 0.5f * hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

// The avx512 tiers take 4 blocks (64 bytes, 128 elements) per step with one 512-bit load and no
// widening shuffle: each dword (or word) of the load holds 8 (or 4) consecutive nibbles; shifting
// the whole register by 4 bits at a time brings each nibble in turn to the bottom of every lane,
// where one VPERMPS (low 4 index bits) or VPERMW (low 5 bits; the table holds the 16 values twice)
// looks all lanes up at once. Lane m then holds element 8m + k (dwords) or 4m + j (words) of the
// step, and the vector is prepared in that order (prep_vec), so lane m of every product belongs to
// block m / 4 (dwords; for VDPBF16PS words 2m, 2m + 1 sum into fp32 lane m, also block m / 4).
// Intel cores run 512-bit shuffles on one port only: this is 2 (fp32) or 1 (bf16) shuffle per block
// instead of 3 (or 2) with a byte-to-dword widening per block.

// Four blocks against x in the dword layout: 8 vectors of 16 floats, x[16k + m] = element 8m + k.
FT_TARGET_AVX512 inline __m512 step_avx512(__m512i wv, const float* x, __m512 lut) {
  __m512 t0 = _mm512_mul_ps(_mm512_permutexvar_ps(wv, lut), _mm512_loadu_ps(x));
  __m512 t1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 4), lut), _mm512_loadu_ps(x + 16));
  t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 8), lut), _mm512_loadu_ps(x + 32), t0);
  t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 12), lut), _mm512_loadu_ps(x + 48), t1);
  t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 16), lut), _mm512_loadu_ps(x + 64), t0);
  t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 20), lut), _mm512_loadu_ps(x + 80), t1);
  t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 24), lut), _mm512_loadu_ps(x + 96), t0);
  t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(wv, 28), lut), _mm512_loadu_ps(x + 112), t1);
  return _mm512_add_ps(t0, t1);
}

// Four blocks against x in the word layout: 4 vectors of 32 bf16, x[32j + k] = element 4k + j.
FT_TARGET_AVX512_BF16 inline __m512 step_bf16(__m512i wv, const uint16_t* x, __m512i lut) {
  const __m512 z = _mm512_setzero_ps();
  __m512 t0 = _mm512_dpbf16_ps(z, (__m512bh)_mm512_permutexvar_epi16(wv, lut), (__m512bh)_mm512_loadu_si512(x));
  __m512 t1 = _mm512_dpbf16_ps(z, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut),
                               (__m512bh)_mm512_loadu_si512(x + 32));
  t0 = _mm512_dpbf16_ps(t0, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut),
                        (__m512bh)_mm512_loadu_si512(x + 64));
  t1 = _mm512_dpbf16_ps(t1, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut),
                        (__m512bh)_mm512_loadu_si512(x + 96));
  return _mm512_add_ps(t0, t1);
}

// One row: steps of 4 blocks, scales loaded 16 blocks at a time; two accumulators.
#define FT_FP4_ROW_LOOP(STEP, XT)                                                                      \
  const int nb = K / 32;                                                                               \
  for (int r = 0; r < nrows; ++r) {                                                                    \
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);                                           \
    const uint8_t* s = S + static_cast<size_t>(r) * nb;                                                \
    if (pf.s.dist) pf.s.ahead(s);                                                                      \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;                                                          \
    int b = 0;                                                                                         \
    for (; b + 16 <= nb; b += 16) {                                                                    \
      const __m512 sf = e8m0x16(s + b, 16);                                                            \
      for (int u = 0; u < 4; u += 2) {                                                                 \
        const uint8_t* wp = w + 16 * (b + 4 * u);                                                      \
        if (pf.w.dist) {                                                                               \
          pf.w.ahead(wp);                                                                              \
          pf.w.ahead(wp + 64);                                                                         \
        }                                                                                              \
        const XT* xp = x + 32 * (b + 4 * u);                                                           \
        a0 = _mm512_fmadd_ps(STEP(_mm512_loadu_si512(wp), xp, lut), _mm512_permutexvar_ps(idx[u], sf), a0); \
        a1 = _mm512_fmadd_ps(STEP(_mm512_loadu_si512(wp + 64), xp + 128, lut),                         \
                             _mm512_permutexvar_ps(idx[u + 1], sf), a1);                               \
      }                                                                                                \
    }                                                                                                  \
    if (b < nb) {                                                                                      \
      const __m512 sf = e8m0x16(s + b, nb - b);                                                        \
      for (int u = 0; b + 4 * u < nb; ++u) {                                                           \
        const int bu = b + 4 * u;                                                                      \
        if (pf.w.dist) pf.w.ahead(w + 16 * bu);                                                        \
        a0 = _mm512_fmadd_ps(STEP(load_blocks(w + 16 * bu, nb - bu), x + 32 * bu, lut),                \
                             _mm512_permutexvar_ps(idx[u], sf), a0);                                   \
      }                                                                                                \
    }                                                                                                  \
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));                                              \
  }

FT_TARGET_AVX512 void dot_rows_avx512(const uint8_t* W, const uint8_t* S, int nrows, const float* x, int K,
                                     float* out, const Streams& pf) {
  const __m512 lut = _mm512_loadu_ps(kE2m1);
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  FT_FP4_ROW_LOOP(step_avx512, float)
}

FT_TARGET_AVX512_BF16 void dot_rows_bf16(const uint8_t* W, const uint8_t* S, int nrows, const uint16_t* x, int K,
                                         float* out, const Streams& pf) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) table[i] = f32_to_bf16(kE2m1[i & 15]);
  const __m512i lut = _mm512_load_si512(table);
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  FT_FP4_ROW_LOOP(step_bf16, uint16_t)
}

#undef FT_FP4_ROW_LOOP

// The N-vector row kernels of the SIMD tiers. Per step the weights are decoded once (as in the
// single-vector kernels); each vector then takes the products with its own chain and one FMA with the
// block scales into its accumulator. No pre-scaled weights: the same number of operations at N = 8,
// fewer below, and bf16 weights could not carry the scale exactly (VDPBF16PS flushes denormals).

template <int N>
FT_TARGET_AVX2 void dot_row_multi_avx2(const uint8_t* w, const uint8_t* s, const float* const* xs, int K,
                                       float* out, int os, const Streams& pf) {
  const int nb = K / 32;
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m = _mm_set1_epi8(0x0f);
  if (pf.s.dist) pf.s.ahead(s);
  __m256 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    if (pf.w.dist && (b & 3) == 0) pf.w.ahead(w + 16 * b);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * b));
    const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(raw, m));
    const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(raw, 4), m));
    const __m256 l0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 l1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
    const __m256 h0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 h1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
    const __m256 sc = _mm256_set1_ps(kE8m0.v[s[b]]);
    for (int j = 0; j < N; ++j) {
      const float* x = xs[j] + 32 * b;
      __m256 t = _mm256_mul_ps(l0, _mm256_loadu_ps(x));
      t = _mm256_fmadd_ps(l1, _mm256_loadu_ps(x + 8), t);
      t = _mm256_fmadd_ps(h0, _mm256_loadu_ps(x + 16), t);
      t = _mm256_fmadd_ps(h1, _mm256_loadu_ps(x + 24), t);
      acc[j] = _mm256_fmadd_ps(t, sc, acc[j]);
    }
  }
  // The LUT held 2 * e2m1: halve (exact).
  for (int j = 0; j < N; ++j) out[j * os] = 0.5f * hsum8(acc[j]);
}

template <int N>
FT_TARGET_AVX512 void dot_row_multi_avx512(const uint8_t* w, const uint8_t* s, const float* const* xs, int K,
                                           float* out, int os, const Streams& pf, __m512 lut, const __m512i* idx) {
  const int nb = K / 32;
  if (pf.s.dist) pf.s.ahead(s);
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b += 16) {
    const __m512 sf = e8m0x16(s + b, nb - b);
    for (int u = 0; u < 4 && b + 4 * u < nb; ++u) {
      const int bu = b + 4 * u;
      if (pf.w.dist) pf.w.ahead(w + 16 * bu);
      const __m512i wv = load_blocks(w + 16 * bu, nb - bu);
      const __m512 sc = _mm512_permutexvar_ps(idx[u], sf);
      __m512 wk[8];
      wk[0] = _mm512_permutexvar_ps(wv, lut);
      wk[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 4), lut);
      wk[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 8), lut);
      wk[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 12), lut);
      wk[4] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 16), lut);
      wk[5] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 20), lut);
      wk[6] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 24), lut);
      wk[7] = _mm512_permutexvar_ps(_mm512_srli_epi32(wv, 28), lut);
      __m512 t[N];
      for (int j = 0; j < N; ++j) t[j] = _mm512_mul_ps(wk[0], _mm512_loadu_ps(xs[j] + 32 * bu));
      for (int k = 1; k < 8; ++k) {
        for (int j = 0; j < N; ++j) t[j] = _mm512_fmadd_ps(wk[k], _mm512_loadu_ps(xs[j] + 32 * bu + 16 * k), t[j]);
      }
      for (int j = 0; j < N; ++j) acc[j] = _mm512_fmadd_ps(t[j], sc, acc[j]);
    }
  }
  reduce_store_n<N>(acc, out, os);
}

template <int N>
FT_TARGET_AVX512_BF16 void dot_row_multi_bf16(const uint8_t* w, const uint8_t* s, const uint16_t* const* xs, int K,
                                              float* out, int os, const Streams& pf, __m512i lut,
                                              const __m512i* idx) {
  const int nb = K / 32;
  if (pf.s.dist) pf.s.ahead(s);
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b += 16) {
    const __m512 sf = e8m0x16(s + b, nb - b);
    for (int u = 0; u < 4 && b + 4 * u < nb; ++u) {
      const int bu = b + 4 * u;
      if (pf.w.dist) pf.w.ahead(w + 16 * bu);
      const __m512i wv = load_blocks(w + 16 * bu, nb - bu);
      const __m512 sc = _mm512_permutexvar_ps(idx[u], sf);
      const __m512bh w0 = (__m512bh)_mm512_permutexvar_epi16(wv, lut);
      const __m512bh w1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut);
      const __m512bh w2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut);
      const __m512bh w3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut);
      // Vector by vector within each product, so that the N chains are side by side in the
      // instruction stream (one chain after the other left them waiting on each other's latency).
      __m512 t[N];
      for (int j = 0; j < N; ++j) {
        t[j] = _mm512_dpbf16_ps(_mm512_setzero_ps(), w0, (__m512bh)_mm512_loadu_si512(xs[j] + 32 * bu));
      }
      for (int j = 0; j < N; ++j) t[j] = _mm512_dpbf16_ps(t[j], w1, (__m512bh)_mm512_loadu_si512(xs[j] + 32 * bu + 32));
      for (int j = 0; j < N; ++j) t[j] = _mm512_dpbf16_ps(t[j], w2, (__m512bh)_mm512_loadu_si512(xs[j] + 32 * bu + 64));
      for (int j = 0; j < N; ++j) t[j] = _mm512_dpbf16_ps(t[j], w3, (__m512bh)_mm512_loadu_si512(xs[j] + 32 * bu + 96));
      for (int j = 0; j < N; ++j) acc[j] = _mm512_fmadd_ps(t[j], sc, acc[j]);
    }
  }
  reduce_store_n<N>(acc, out, os);
}

// All rows of a call for N vectors; the tables are built once per call.
template <int N>
FT_TARGET_AVX2 void dot_rows_multi_avx2(const uint8_t* W, const uint8_t* S, int nrows, const float* const* xs, int K,
                                        float* out, int os, const Streams& pf) {
  for (int r = 0; r < nrows; ++r) {
    dot_row_multi_avx2<N>(W + static_cast<size_t>(r) * (K / 2), S + static_cast<size_t>(r) * (K / 32), xs, K,
                          out + r, os, pf);
  }
}

template <int N>
FT_TARGET_AVX512 void dot_rows_multi_avx512(const uint8_t* W, const uint8_t* S, int nrows, const float* const* xs,
                                            int K, float* out, int os, const Streams& pf) {
  const __m512 lut = _mm512_loadu_ps(kE2m1);
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  for (int r = 0; r < nrows; ++r) {
    dot_row_multi_avx512<N>(W + static_cast<size_t>(r) * (K / 2), S + static_cast<size_t>(r) * (K / 32), xs, K,
                            out + r, os, pf, lut, idx);
  }
}

template <int N>
FT_TARGET_AVX512_BF16 void dot_rows_multi_bf16(const uint8_t* W, const uint8_t* S, int nrows,
                                               const uint16_t* const* xs, int K, float* out, int os,
                                               const Streams& pf) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) table[i] = f32_to_bf16(kE2m1[i & 15]);
  const __m512i lut = _mm512_load_si512(table);
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  for (int r = 0; r < nrows; ++r) {
    dot_row_multi_bf16<N>(W + static_cast<size_t>(r) * (K / 2), S + static_cast<size_t>(r) * (K / 32), xs, K,
                          out + r, os, pf, lut, idx);
  }
}

// ---- int8 activations (q8_*, fp4_common.h): VPDPBUSD against a byte table of the codes ----
//
// A 4-block step of weights is one 64-byte load; VPERMB looks both nibbles of every byte up in the
// table 12 + 2 * e2m1 (0..24, unsigned), so the low-nibble vector holds the step's even elements and
// the high-nibble one its odd elements, lane m (4 bytes) of both in block m / 4. x's record of the
// step holds its codes in that order, and the lanes start from -12 * (sum of their x codes). Per
// step and vector: 2 VPDPBUSD, a conversion, a VPERMPS (the blocks' scales times dx, multiplied 16
// blocks at a time) and an FMA; with the lookups and a shift about 8 operations per 64 bytes.

// One step (4 blocks at w, `blocks` of them left in the row) against the vectors' records at xo. sx[j]:
// the group's 16 block scales times vector j's dx; idx picks the step's 4 (lane m: block m / 4). The
// permute sits beside its FMA so that only one of them is live: with 8 vectors, 8 of them held across
// the step (and two accumulator sets) spilled 74 registers in the loop.
template <int NV>
FT_TARGET_AVX512_BF16 inline void step_q8(const uint8_t* w, int blocks, const __m512* sx, __m512i idx,
                                          const uint8_t* const* xs, size_t xo, __m512i lut, __m512* acc) {
  __m512i wv = load_blocks(w, blocks);
  FT_IN_REGISTER(wv);
  // VPERMB reads the low 6 bits of each byte and the table repeats every 16: no masking.
  const __m512i lo = _mm512_permutexvar_epi8(wv, lut);
  const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(wv, 4), lut);
  for (int j = 0; j < NV; ++j) {
    const uint8_t* x = xs[j] + xo;
    const __m512i i = _mm512_dpbusd_epi32(
        _mm512_dpbusd_epi32(_mm512_loadu_si512(x + 128), lo, _mm512_loadu_si512(x)), hi, _mm512_loadu_si512(x + 64));
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(idx, sx[j]), acc[j]);
  }
}

// step_q8<1>'s arithmetic with x's step record given as values (held in registers by the caller): its
// even and odd codes xl, xh and its offset lanes start; sx: the group's scales times dx.
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void step_q8_x(const uint8_t* w, int blocks, __m512 sx,
                                                                           __m512i idx, __m512i xl, __m512i xh,
                                                                           __m512i start, __m512i lut, __m512& acc) {
  __m512i wv = load_blocks(w, blocks);
  FT_IN_REGISTER(wv);
  const __m512i lo = _mm512_permutexvar_epi8(wv, lut);
  const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(wv, 4), lut);
  const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, lo, xl), hi, xh);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(idx, sx), acc);
}

// f(std::integral_constant<int, i>) for i = 0 .. N - 1, in order: indices that must be constants (into
// arrays of registers), where a loop is not always unrolled.
template <class F, int... I>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void for_each_index(F&& f,
                                                                               std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

// The n (1 .. 16) blocks of a group whose scales are at s, x's records of the group at xo: their e8m0
// scales times each vector's dx lanes (Normal: every scale of the call in [1, 254], e8m0x16_normal).
template <int NV, bool Normal>
FT_TARGET_AVX512_BF16 inline void q8_group_scales(const uint8_t* s, int n, size_t xo, const uint8_t* const* xs,
                                                  __m512* sx) {
  const __m512 sf = e8m0x16_as<Normal>(s, n);
  const size_t dxo = xo + 4 * kQ8StepBytes;
  for (int j = 0; j < NV; ++j) sx[j] = _mm512_mul_ps(sf, _mm512_loadu_ps(xs[j] + dxo));
}

template <int NV, bool Normal>
FT_TARGET_AVX512_BF16 void dot_rows_q8(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* const* xs,
                                       int K, float* out, int os, const Streams& pf) {
  const __m512i lut = e2m1_u8_table();
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  const int nb = K / 32;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (pf.s.dist) pf.s.ahead(s);
    // Two chains per vector (the FMA latency), steps alternating; from 3 vectors on the vectors'
    // chains interleave and one set of accumulators does (a second set would add NV live registers).
    constexpr bool kTwoSets = NV < 3;
    __m512 a0[NV], a1[kTwoSets ? NV : 1];
    __m512* const second = kTwoSets ? a1 : a0;
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a0[j] = second[j] = _mm512_setzero_ps();
    __m512 sx[NV];
    // Whole groups by pointers that advance (weights 256 bytes, scales 16, x's records a group), not
    // offsets computed from the block index each group: one Zen 4 core from L1, rows of K = 768 32.2
    // -> 33.1 GB/s, K = 2048 37.9 -> 38.5 (docs/benchmarks.md, thirty-fourth session).
    const uint8_t* const wend = w + static_cast<size_t>(nb / 16) * 256;
    const uint8_t* wg = w;
    const uint8_t* sg = s;
    size_t xo = 0;
    for (; wg < wend; wg += 256, sg += 16, xo += kQ8GroupBytes) {
      q8_group_scales<NV, Normal>(sg, 16, xo, xs, sx);
#pragma GCC unroll 2
      for (int u = 0; u < 4; u += 2) {
        const uint8_t* wp = wg + 64 * u;
        if (pf.w.dist) {
          pf.w.ahead(wp);
          pf.w.ahead(wp + 64);
        }
        step_q8<NV>(wp, 4, sx, idx[u], xs, xo + u * kQ8StepBytes, lut, a0);
        step_q8<NV>(wp + 64, 4, sx, idx[u + 1], xs, xo + (u + 1) * kQ8StepBytes, lut, second);
      }
    }
    if (nb % 16) {
      // The row's last group, partial (1 .. 15 blocks): its steps unrolled (last_group_steps).
      q8_group_scales<NV, Normal>(sg, nb % 16, xo, xs, sx);
      using Last = LastGroupStep<&step_q8<NV>, kQ8StepBytes, const uint8_t* const*, Prefetch>;
      last_group_steps<0>(nb % 16, Last{wg, sx, idx, xs, xo, lut, a0, pf.w});
    }
    for (int j = 0; j < NV; ++j) {
      out[j * os + r] = _mm512_reduce_add_ps(kTwoSets ? _mm512_add_ps(a0[j], second[j]) : a0[j]);
    }
  }
}

// The step of 4 blocks at block bu of 4 rows (W: the first, ldw bytes apart; nb blocks a row) against
// x's step record at xo, into acc[i]; sx[i]: row i's group scales times dx, idx picks the step's.
// Each row's arithmetic is step_q8<1>'s.
FT_TARGET_AVX512_BF16 inline void step_q8_x4(const uint8_t* W, size_t ldw, int nb, int bu, __m512i idx,
                                             const __m512* sx, const uint8_t* x, size_t xo, __m512i lut,
                                             __m512* acc, const Streams& pf) {
  const __m512i xl = _mm512_loadu_si512(x + xo), xh = _mm512_loadu_si512(x + xo + 64);
  const __m512i start = _mm512_loadu_si512(x + xo + 128);
  if (pf.w.dist) {  // the 4 rows' span read as one stream at 4 times the pace (address order)
    for (int i = 0; i < 4; ++i) pf.w.ahead(W + 4 * 16 * static_cast<size_t>(bu) + 64 * i);
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    __m512i wv = load_blocks(W + i * ldw + 16 * bu, nb - bu);
    FT_IN_REGISTER(wv);
    const __m512i lo = _mm512_permutexvar_epi8(wv, lut);
    const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(wv, 4), lut);
    const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, lo, xl), hi, xh);
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(idx, sx[i]), acc[i]);
  }
}

// 4 consecutive rows against one vector, step by step (q8_dot_rows_multi's by_multirow): the 4 rows take each of a step's 3
// loads of x once, run 8 independent chains and end in one transposed reduction (row_reduce.h). Each
// row's arithmetic is exactly dot_rows_q8<1>'s (the same two accumulators, steps in the same order,
// the same addition tree), so a row's bits do not depend on whether it ran here.
template <bool Normal>
FT_TARGET_AVX512_BF16 void dot_rows_q8_x4(const uint8_t* W, const uint8_t* S, const uint8_t* x, int K, float* out,
                                          const Streams& pf) {
  const __m512i lut = e2m1_u8_table();
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  const int nb = K / 32;
  const size_t ldw = static_cast<size_t>(K) / 2;
  const uint8_t* const xs[1] = {x};
  __m512 a0[4], a1[4], sx[4];
  #pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  if (pf.s.dist) {
    for (int i = 0; i < 4; ++i) pf.s.ahead(S + i * nb);
  }
  int b = 0;
  for (; b + 16 <= nb; b += 16) {
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      q8_group_scales<1, Normal>(S + i * nb + b, std::min(16, nb - b), static_cast<size_t>(b / 16) * kQ8GroupBytes,
                                 xs, &sx[i]);
    }
    const size_t xo = static_cast<size_t>(b / 16) * kQ8GroupBytes;
    for (int u = 0; u < 4; u += 2) {
      step_q8_x4(W, ldw, nb, b + 4 * u, idx[u], sx, x, xo + u * kQ8StepBytes, lut, a0, pf);
      step_q8_x4(W, ldw, nb, b + 4 * (u + 1), idx[u + 1], sx, x, xo + (u + 1) * kQ8StepBytes, lut, a1, pf);
    }
  }
  if (b < nb) {
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      q8_group_scales<1, Normal>(S + i * nb + b, std::min(16, nb - b), static_cast<size_t>(b / 16) * kQ8GroupBytes,
                                 xs, &sx[i]);
    }
    for (int u = 0; b + 4 * u < nb; ++u) {
      step_q8_x4(W, ldw, nb, b + 4 * u, idx[u], sx, x, q8_step_offset((b + 4 * u) / 4), lut, a0, pf);
    }
  }
  _mm_storeu_ps(out, rowred::hsum_x4(_mm512_add_ps(a0[0], a1[0]), _mm512_add_ps(a0[1], a1[1]),
                                     _mm512_add_ps(a0[2], a1[2]), _mm512_add_ps(a0[3], a1[3])));
}

// One vector against rows of NB <= 24 blocks (K <= 768: the down rows of Qwen3-30B-A3B and Gemma 4),
// x's codes and offset lanes held in registers (18 of the 32 at K = 768) for the whole call: a step
// loads only its 64 bytes of weights, where dot_rows_q8 loads x's record too (3 more 64-byte loads;
// Zen 4 loads one such vector a cycle). One Zen 4 core, rows of K = 768 (tools/row_stream_probe.cpp;
// docs/benchmarks.md, thirty-fifth session): from L2 29 -> 35 GB/s, from DRAM 21.5-21.9 -> 24.0-24.6.
// Each row's arithmetic is dot_rows_q8<1, Normal>'s (the same two accumulators, steps in the same
// order, a partial last group into the first, the same reduction), so its bits are the same.
constexpr int kQ8RegBlocks = 24;

template <int NB, bool Normal>
FT_TARGET_AVX512_BF16 void dot_rows_q8_xreg(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* x,
                                            float* out, const Streams& pf) {
  static_assert(NB >= 1 && NB <= kQ8RegBlocks, "x's records of up to 6 steps fit the registers");
  constexpr int kSteps = (NB + 3) / 4;
  const __m512i lut = e2m1_u8_table();
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  __m512i xl[kSteps], xh[kSteps], xst[kSteps];
  __m512 dxl[(NB + 15) / 16];
  for_each_index(
      [&](auto t) FT_TARGET_AVX512_BF16 __attribute__((always_inline)) {
        xl[t] = _mm512_loadu_si512(x + q8_step_offset(t));
        xh[t] = _mm512_loadu_si512(x + q8_step_offset(t) + 64);
        xst[t] = _mm512_loadu_si512(x + q8_step_offset(t) + 128);
        if constexpr (t % 4 == 0) dxl[t / 4] = _mm512_loadu_ps(x + t / 4 * kQ8GroupBytes + 4 * kQ8StepBytes);
      },
      std::make_integer_sequence<int, kSteps>{});
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (NB * 16);
    const uint8_t* s = S + static_cast<size_t>(r) * NB;
    if (pf.s.dist) pf.s.ahead(s);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), sx;
    for_each_index(
        [&](auto t) FT_TARGET_AVX512_BF16 __attribute__((always_inline)) {
          constexpr int g = t / 4, u = t % 4, left = NB - 16 * g;  // left: blocks from this group on
          if constexpr (u == 0) sx = _mm512_mul_ps(e8m0x16_as<Normal>(s + 16 * g, std::min(left, 16)), dxl[g]);
          const uint8_t* wp = w + 64 * t;
          if (pf.w.dist) pf.w.ahead(wp);
          step_q8_x(wp, std::min(NB - 4 * t, 4), sx, idx[u], xl[t], xh[t], xst[t], lut,
                    left >= 16 && u % 2 == 1 ? a1 : a0);
        },
        std::make_integer_sequence<int, kSteps>{});
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

// dot_rows_q8_xreg<nb, Normal> for the call's nb (1 .. kQ8RegBlocks) blocks a row.
template <bool Normal, int... I>
FT_TARGET_AVX512_BF16 void dot_rows_q8_xreg_nb(int nb, const uint8_t* W, const uint8_t* S, int nrows,
                                               const uint8_t* x, float* out, const Streams& pf,
                                               std::integer_sequence<int, I...>) {
  (void)((nb == I + 1 && (dot_rows_q8_xreg<I + 1, Normal>(W, S, nrows, x, out, pf), true)) || ...);
}

// One vector against rows of G whole groups (1 .. kQ8GroupRowsMax) and `tail` (0 .. 15) blocks after
// them, K > 768: the whole groups' steps unrolled, those of the first two groups (or the one) against
// x's codes held in registers for the call (16 registers; 10 steps spilled), the tail as dot_rows_q8's
// last group. One Zen 4 core in cache, qwen3-30b-a3b's gate/up rows (K = 2048): pass 1 54.4 -> 50.5
// us a step (docs/benchmarks.md, thirty-fifth session), where the same registers followed by a loop
// over the other groups gained nothing. Each row's arithmetic is dot_rows_q8<1, Normal>'s.
constexpr int kQ8GroupRowsMax = 8;  // K < 4608
template <int G, bool Normal>
FT_TARGET_AVX512_BF16 void dot_rows_q8_groups(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* x,
                                              int tail, float* out, const Streams& pf) {
  constexpr int kSteps = 4 * G, kRegSteps = std::min(kSteps, 8);
  const int nb = 16 * G + tail;
  const __m512i lut = e2m1_u8_table();
  const __m512i idx[4] = {scale_index(0), scale_index(1), scale_index(2), scale_index(3)};
  const uint8_t* const xs[1] = {x};
  __m512i xl[kRegSteps], xh[kRegSteps];
  for_each_index(
      [&](auto t) FT_TARGET_AVX512_BF16 __attribute__((always_inline)) {
        xl[t] = _mm512_loadu_si512(x + q8_step_offset(t));
        xh[t] = _mm512_loadu_si512(x + q8_step_offset(t) + 64);
      },
      std::make_integer_sequence<int, kRegSteps>{});
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * nb * 16;
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (pf.s.dist) pf.s.ahead(s);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), sx;
    for_each_index(
        [&](auto t) FT_TARGET_AVX512_BF16 __attribute__((always_inline)) {
          constexpr int u = t % 4;
          const uint8_t* xr = x + q8_step_offset(t);
          if constexpr (u == 0) q8_group_scales<1, Normal>(s + 4 * t, 16, t / 4 * kQ8GroupBytes, xs, &sx);
          if (pf.w.dist) pf.w.ahead(w + 64 * t);
          __m512& acc = u % 2 ? a1 : a0;
          if constexpr (t < kRegSteps) {
            step_q8_x(w + 64 * t, 4, sx, idx[u], xl[t], xh[t], _mm512_loadu_si512(xr + 128), lut, acc);
          } else {
            step_q8_x(w + 64 * t, 4, sx, idx[u], _mm512_loadu_si512(xr), _mm512_loadu_si512(xr + 64),
                      _mm512_loadu_si512(xr + 128), lut, acc);
          }
        },
        std::make_integer_sequence<int, kSteps>{});
    if (tail) {
      const size_t xo = G * kQ8GroupBytes;
      q8_group_scales<1, Normal>(s + 16 * G, tail, xo, xs, &sx);
      using Last = LastGroupStep<&step_q8<1>, kQ8StepBytes, const uint8_t* const*, Prefetch>;
      last_group_steps<0>(tail, Last{w + 256 * G, &sx, idx, xs, xo, lut, &a0, pf.w});
    }
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

// dot_rows_q8_groups<nb / 16, Normal> for the call's nb blocks a row (16 .. 16 kQ8GroupRowsMax + 15).
template <bool Normal, int... I>
FT_TARGET_AVX512_BF16 void dot_rows_q8_groups_nb(int nb, const uint8_t* W, const uint8_t* S, int nrows,
                                                 const uint8_t* x, float* out, const Streams& pf,
                                                 std::integer_sequence<int, I...>) {
  (void)((nb / 16 == I + 1 && (dot_rows_q8_groups<I + 1, Normal>(W, S, nrows, x, nb % 16, out, pf), true)) || ...);
}

// ---- int8 activations in group records (q8g_*, fp4_common.h) ----
//
// A group of 16 blocks (4 steps of 64 bytes) is 4 loads. An in-lane 4 x 4 dword transpose of the 4
// (8 unpacks) puts dword u of block q8g_block_of_lane(p) into lane p of register u; VPERMB then looks
// both nibbles of every byte up in the table 12 + 2 * e2m1 (0..24, unsigned), the low nibbles being
// the even elements and the high ones the odd elements of x's record. Every lane of the 8 products
// thus belongs to one block, and one int32 chain per vector sums the whole group, starting from the
// record's lanes -12 * (sum of the block's codes): per group and vector 8 VPDPBUSD, one conversion,
// one multiply (the blocks' e8m0 scales times the record's dx lanes) and one FMA. Per 64 bytes that
// is 2.75 operations per vector and ~6 shared, where one chain per step (lanes of 4 blocks) took 5
// per vector (a conversion, a scale permute and an FMA every step) and ~3 shared.

// The group's 16 blocks at w (`blocks` of them left in the row, zeros after), transposed: q[u] lane p =
// dword u of block q8g_block_of_lane(p).
FT_TARGET_AVX512_BF16 inline void q8g_group_codes(const uint8_t* w, int blocks, __m512i* q) {
  __m512i r[4];
  if (blocks >= 16) {
    for (int k = 0; k < 4; ++k) r[k] = _mm512_loadu_si512(w + 64 * k);
  } else {
    for (int k = 0; k < 4; ++k) r[k] = load_blocks(w + 64 * k, std::max(0, blocks - 4 * k));
  }
  // Step k's 128-bit lane L is block 4k + L (dwords 0..3); lane p = 4L + k of q[u] takes its dword u.
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  q[0] = _mm512_unpacklo_epi64(t0, t2);
  q[1] = _mm512_unpackhi_epi64(t0, t2);
  q[2] = _mm512_unpacklo_epi64(t1, t3);
  q[3] = _mm512_unpackhi_epi64(t1, t3);
}

template <int NV>
FT_TARGET_AVX512_BF16 void dot_rows_q8g(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* const* xs,
                                       int K, float* out, int os, const Streams& pf) {
  const __m512i lut = e2m1_u8_table();
  // lane p <- scale of block q8g_block_of_lane(p)
  const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const int nb = K / 32, groups = (nb + 15) / 16;
  // Two chains per vector for one or two vectors (VPDPBUSD's latency); from 3 on the vectors' chains
  // interleave.
  constexpr int kChains = NV < 3 ? 2 : 1;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (pf.s.dist) pf.s.ahead(s);
    __m512 acc[NV];
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      const uint8_t* wg = w + 256 * g;
      if (pf.w.dist) {
        for (int k = 0; k < 4; ++k) pf.w.ahead(wg + 64 * k);
      }
      const int blocks = nb - 16 * g;
      __m512i q[4];
      q8g_group_codes(wg, blocks, q);
      __m512i lo[4], hi[4];
      for (int u = 0; u < 4; ++u) {
        // VPERMB reads the low 6 bits of each byte and the table repeats every 16: no masking.
        lo[u] = _mm512_permutexvar_epi8(q[u], lut);
        hi[u] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q[u], 4), lut);
      }
      const __m512 sf = _mm512_permutexvar_ps(lanes, e8m0x16(s + 16 * g, std::min(16, blocks)));
      const size_t xo = static_cast<size_t>(g) * kQ8gGroupBytes;
      // The vectors' chains side by side in the instruction stream (vector by vector they waited on
      // VPDPBUSD's latency).
      __m512i c[NV][kChains];
      for (int j = 0; j < NV; ++j) {
        c[j][0] = _mm512_loadu_si512(xs[j] + xo + kQ8gCorrOffset);
        if (kChains > 1) c[j][kChains - 1] = _mm512_setzero_si512();
      }
      for (int u = 0; u < 4; ++u) {
        for (int j = 0; j < NV; ++j) {
          const uint8_t* x = xs[j] + xo + 128 * u;
          __m512i& t = c[j][u % kChains];
          t = _mm512_dpbusd_epi32(t, lo[u], _mm512_loadu_si512(x));
          t = _mm512_dpbusd_epi32(t, hi[u], _mm512_loadu_si512(x + 64));
        }
      }
      for (int j = 0; j < NV; ++j) {
        const __m512i t = kChains > 1 ? _mm512_add_epi32(c[j][0], c[j][kChains - 1]) : c[j][0];
        const __m512 ws = _mm512_mul_ps(sf, _mm512_loadu_ps(reinterpret_cast<const float*>(xs[j] + xo + kQ8gDxOffset)));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), ws, acc[j]);
      }
    }
    for (int j = 0; j < NV; ++j) out[j * os + r] = _mm512_reduce_add_ps(acc[j]);
  }
}

#endif  // FT_X86

#if FT_X86
// ---- avx2 tier: int8 activations (VPMADDUBSW) ----
//
// Two blocks of 32 (32 bytes, contiguous in a row) per register as avx2_pairs.h describes: the low
// nibbles of both blocks (their even elements) and the high ones (odd elements), looked up by VPSHUFB
// in the table 2 * e2m1 + 12 (unsigned, 0..24): codes with offset 12, scaled by e8m0 / 2. x's records
// hold the codes in the same even/odd order (pairs::PairOrder::kEvenOdd).

// The rows of one call (W, S) as avx2_pairs.h's block policy.
struct Fp4Pairs {
  static constexpr int kOffset = 12;
  static constexpr bool kScalePerBlock = true;
  const uint8_t* W;
  const uint8_t* S;
  int K;
  const Streams* pf;
  const uint8_t* row_w(int row) const { return W + static_cast<size_t>(row) * (K / 2); }
  const uint8_t* row_s(int row) const { return S + static_cast<size_t>(row) * (K / 32); }
  FT_TARGET_AVX2 void pair(int row, int p, __m256i& L, __m256i& H) const {
    pairs::e2m1_split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_w(row) + 32 * p)), L, H);
  }
  FT_TARGET_AVX2 void half(int row, int p, __m256i& L, __m256i& H) const {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row_w(row) + 32 * p));
    pairs::e2m1_split(_mm256_set_m128i(_mm_setzero_si128(), a), L, H);
  }
  // e8m0 / 2 of blocks 4g..4g+3 (0.5 * kE8m0, exact: 2^-128 and 2^-127 stay as subnormals), each
  // block's value in the 4 lanes of its half of s0 or s1: two 16-byte rows of kE8m0Half4 per register.
  // On the 2-core Zen 3 (one vector, rows in L2) this took the row loop from 5.2 to 4.5 TSC ticks
  // per 64 weights against the decode of e8m0x4 and two VPERMPS (two uops each on Zen 3, one on a
  // multiply pipe, where the VPMADDUBSWs run).
  FT_TARGET_AVX2 void scales4(int row, int g, __m256& s0, __m256& s1) const {
    const uint8_t* s = row_s(row) + 4 * g;
    s0 = lanes(s[0], s[1]);
    s1 = lanes(s[2], s[3]);
  }
  FT_TARGET_AVX2 __m256 scales2(int row, int p, bool half) const {
    const uint8_t* s = row_s(row) + 2 * p;
    return half ? _mm256_set_m128(_mm_setzero_ps(), _mm_load_ps(kE8m0Half4.v[s[0]])) : lanes(s[0], s[1]);
  }
  FT_TARGET_AVX2 static __m256 lanes(uint8_t a, uint8_t b) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(kE8m0Half4.v[a])), _mm_load_ps(kE8m0Half4.v[b]),
                                1);
  }
  // The weight stream into L1 (the avx512 kernels' L2 hint was chosen on Zen 4): on the 2-core Zen 3,
  // 3 rounds alternating, 1513 / 1479 / 1540 us per step against 1552 / 1537 / 1814 with L2.
  void ahead(int row, int g) const {
    if (pf->w.dist) pf->w.ahead<PrefetchHint::L1>(row_w(row) + 64 * g);
    if (pf->s.dist && g == 0) pf->s.ahead(row_s(row));
  }
};

template <int NV>
FT_TARGET_AVX2 void dot_rows_q8a(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* const* xs, int K,
                                 float* out, int os, const Streams& pf) {
  pairs::rows<NV>(Fp4Pairs{W, S, K, &pf}, xs, nrows, K / 32, out, os);
}

#endif  // FT_X86

// e4m3fn value nearest to y (ties to even), saturated to +-448; y finite.
float e4m3_rne_sat(float y) {
  const float a = std::fabs(y);
  float r;
  if (a < 0.015625f) {
    // Below 2^-6 the grid is the subnormal step 2^-9 (scaling by 512 is exact; a * 512 < 8).
    r = round_even_small(a * 512.f) * (1.f / 512.f);
  } else {
    // Keep 3 mantissa bits, rounding to nearest even; a carry moves into the exponent as it should.
    uint32_t bits;
    std::memcpy(&bits, &a, sizeof bits);
    bits = (bits + 0x7ffffu + ((bits >> 20) & 1u)) & ~0xfffffu;
    std::memcpy(&r, &bits, sizeof r);
  }
  return std::copysign(std::min(r, 448.f), y);
}

// The kernels a tier runs. On Intel the avx512_bf16 tier runs the fp32 avx512 kernels: there
// VDPBF16PS made the FP4 rows slower, not faster (Xeon, gpt-oss-120b shape, 2 threads: 0.55 of the
// read bandwidth with it, 0.68 without), while on Zen it is the faster of the two.
Isa kernel_isa(Isa isa) {
  static const bool intel = cpu_is_intel();
  return isa == Isa::avx512_bf16 && intel ? Isa::avx512 : isa;
}

}  // namespace

size_t vec_bytes(Isa isa, int K) {
  isa = kernel_isa(isa);
  const size_t k128 = (static_cast<size_t>(K) + 127) / 128 * 128;
  switch (isa) {
    case Isa::avx512_bf16: return k128 * sizeof(uint16_t);
    case Isa::avx512: return k128 * sizeof(float);
    default: return static_cast<size_t>(K) * sizeof(float);
  }
}

void prep_vec(Isa isa, const float* v, int i0, int i1, void* out) {
  switch (kernel_isa(isa)) {
    case Isa::avx512_bf16: {
      // Steps of 128: x[g + 32j + k] = element g + 4k + j; zeros past i1 (the end of the vector).
      uint16_t* o = static_cast<uint16_t*>(out);
      for (int g = i0; g < i1; g += 128) {
        for (int j = 0; j < 4; ++j) {
          for (int k = 0; k < 32; ++k) {
            const int e = g + 4 * k + j;
            o[g + 32 * j + k] = e < i1 ? f32_to_bf16(v[e - i0]) : 0;
          }
        }
      }
      return;
    }
    case Isa::avx512: {
      // Steps of 128: x[g + 16k + m] = element g + 8m + k; zeros past i1.
      float* o = static_cast<float*>(out);
      for (int g = i0; g < i1; g += 128) {
        for (int k = 0; k < 8; ++k) {
          for (int m = 0; m < 16; ++m) {
            const int e = g + 8 * m + k;
            o[g + 16 * k + m] = e < i1 ? v[e - i0] : 0.f;
          }
        }
      }
      return;
    }
    case Isa::avx2: {
      // Blocks of 32: the 16 even, then the 16 odd elements.
      float* o = static_cast<float*>(out);
      for (int b = i0; b < i1; b += 32) {
        for (int j = 0; j < 16; ++j) {
          o[b + j] = v[b - i0 + 2 * j];
          o[b + 16 + j] = v[b - i0 + 2 * j + 1];
        }
      }
      return;
    }
    case Isa::scalar:
      break;
  }
  std::memcpy(static_cast<float*>(out) + i0, v, sizeof(float) * (i1 - i0));
}

void dot_rows(Isa isa, const uint8_t* W, const uint8_t* S, int nrows, const void* x, int K, float* out,
              int prefetch) {
  if (nrows <= 0) return;
  isa = kernel_isa(isa);
#if FT_X86
  const size_t wbytes = static_cast<size_t>(nrows) * (K / 2), sbytes = static_cast<size_t>(nrows) * (K / 32);
  const Streams pf{Prefetch(W, wbytes, prefetch), Prefetch(S, sbytes, prefetch / 16)};
  switch (isa) {
    case Isa::avx512_bf16:
      dot_rows_bf16(W, S, nrows, static_cast<const uint16_t*>(x), K, out, pf);
      return;
    case Isa::avx512:
      dot_rows_avx512(W, S, nrows, static_cast<const float*>(x), K, out, pf);
      return;
    case Isa::avx2:
      dot_rows_avx2(W, S, nrows, static_cast<const float*>(x), K, out, pf);
      return;
    case Isa::scalar:
      break;
  }
#else
  (void)prefetch;
  if (isa != Isa::scalar) throw Error("fp4 kernels: ISA tier " + std::string(isa_name(isa)) + " needs x86");
#endif
  dot_rows_scalar(W, S, nrows, static_cast<const float*>(x), K, out);
}

void dot_rows_multi(Isa isa, const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                    float* out, int os, int prefetch) {
  if (nrows <= 0 || n <= 0) return;
  if (n == 1) {  // out[r]: the single-vector kernels
    dot_rows(isa, W, S, nrows, xs[0], K, out, prefetch);
    return;
  }
  n = std::min(n, kMaxVectors);
  isa = kernel_isa(isa);
  const size_t wrow = static_cast<size_t>(K / 2), srow = static_cast<size_t>(K / 32);
  // The vectors as the tier's element type (bf16 for avx512_bf16, else fp32).
  const float* xf[kMaxVectors];
  for (int j = 0; j < n; ++j) xf[j] = static_cast<const float*>(xs[j]);
#if FT_X86
  const uint16_t* xh[kMaxVectors];
  for (int j = 0; j < n; ++j) xh[j] = static_cast<const uint16_t*>(xs[j]);
  const Streams pf{Prefetch(W, nrows * wrow, prefetch), Prefetch(S, nrows * srow, prefetch / 16)};
  switch (isa) {
    case Isa::avx512_bf16:
      dispatch_n(n, [&](auto nv) { dot_rows_multi_bf16<decltype(nv)::value>(W, S, nrows, xh, K, out, os, pf); });
      return;
    case Isa::avx512:
      dispatch_n(n, [&](auto nv) { dot_rows_multi_avx512<decltype(nv)::value>(W, S, nrows, xf, K, out, os, pf); });
      return;
    case Isa::avx2:
      dispatch_n(n, [&](auto nv) { dot_rows_multi_avx2<decltype(nv)::value>(W, S, nrows, xf, K, out, os, pf); });
      return;
    case Isa::scalar:
      break;
  }
#else
  (void)prefetch;
  if (isa != Isa::scalar) throw Error("fp4 kernels: ISA tier " + std::string(isa_name(isa)) + " needs x86");
#endif
  for (int r = 0; r < nrows; ++r) {
    dispatch_n(n, [&](auto nv) {
      dot_row_multi_scalar<decltype(nv)::value>(W + r * wrow, S + r * srow, xf, K, out + r, os);
    });
  }
}

size_t q8_vec_bytes(int K) { return static_cast<size_t>((K + 511) / 512) * kQ8GroupBytes; }

namespace {
// The portable path of the int8 preps: each step s of [i0, i1) as int8_codes gives it, to
// place(codes, amax, s) (elements past i1 zero).
template <class Place>
void q8_scalar_steps(const float* v, int i0, int i1, Place place) {
  for (int g = i0; g < i1; g += 128) {
    int8_t c[128] = {};
    // The int8 tier runs on AVX512-VNNI CPUs only, so AVX2 is there.
    const float amax = int8_codes(v + (g - i0), std::min(128, i1 - g), c, FT_X86 != 0);
    place(c, amax, static_cast<size_t>(g / 128));
  }
}

// Step s's dx / 2 into its 4 lanes of the group's dx vector; the step that ends the vector (of
// `steps`) zeroes the lanes of the group's missing steps.
inline void q8_store_dx(uint8_t* out, size_t s, size_t steps, float dx2) {
  float* lanes = reinterpret_cast<float*>(out + s / 4 * kQ8GroupBytes + 4 * kQ8StepBytes);
  for (size_t l = 4 * (s % 4); l < 4 * (s % 4) + 4; ++l) lanes[l] = dx2;
  if (s + 1 == steps) {
    for (size_t l = 4 * (s % 4) + 4; l < 16; ++l) lanes[l] = 0.f;
  }
}
}  // namespace

#if FT_X86
namespace {
// One step of 128 elements (n of them at v, zeros after) as int8_codes gives them, bit for bit: amax
// (VMAXPS keeps the running max when the element is NaN) and codes (round half to even, a NaN clamped
// to 127), split by VPMOVWB into the even and odd codes (dword m of each: elements 8m .. 8m + 7).
// Returns amax.
FT_TARGET_AVX512_BF16 inline float q8_step_codes_avx512(const float* v, int n, __m512i& even, __m512i& odd) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 x[8];
  __m512 mx = _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    const int m = std::clamp(n - 16 * i, 0, 16);
    x[i] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << m) - 1u), v + 16 * i);
    mx = _mm512_max_ps(_mm512_and_ps(x[i], absmask), mx);
  }
  const float amax = _mm512_reduce_max_ps(mx);
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  alignas(64) int8_t c[128];
  for (int i = 0; i < 8; ++i) {
    const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(x[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 q = _mm512_max_ps(_mm512_min_ps(r, _mm512_set1_ps(127.f)), _mm512_set1_ps(-127.f));
    _mm_store_si128(reinterpret_cast<__m128i*>(c + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
  }
  const __m512i c0 = _mm512_load_si512(c), c1 = _mm512_load_si512(c + 64);
  even = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(c0)), _mm512_cvtepi16_epi8(c1), 1);
  odd = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(c0, 8))),
                           _mm512_cvtepi16_epi8(_mm512_srli_epi16(c1, 8)), 1);
  return amax;
}

// q8_prep_vec with AVX-512 (the int8 tier runs on AVX512-VNNI CPUs only), bit for bit: the codes of
// q8_step_codes_avx512, the offsets by VPDPBUSD of ones. Serial on the calling thread before every
// run: the scalar split and sums were ~3 us of a decode step on the GPU machine's Xeon (~40 us at
// batch 8).
FT_TARGET_AVX512_BF16 void q8_prep_vec_avx512(const float* v, int i0, int i1, int K, void* out) {
  const size_t steps = (static_cast<size_t>(K) + 127) / 128;
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);
    __m512i even, odd;
    const float amax = q8_step_codes_avx512(v + (g - i0), n, even, odd);
    const size_t s = static_cast<size_t>(g / 128);
    uint8_t* rec = static_cast<uint8_t*>(out) + q8_step_offset(s);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, even), ones, odd);
    _mm512_storeu_si512(rec, even);
    _mm512_storeu_si512(rec + 64, odd);
    _mm512_storeu_si512(rec + 128, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-12)));
    q8_store_dx(static_cast<uint8_t*>(out), s, steps, 0.5f * (amax / 127.f));  // the table holds 2 * e2m1
  }
}
}  // namespace
#endif

void q8_prep_vec(const float* v, int i0, int i1, int K, void* out) {
#if FT_X86
  q8_prep_vec_avx512(v, i0, i1, K, out);
  return;
#endif
  const size_t steps = (static_cast<size_t>(K) + 127) / 128;
  q8_scalar_steps(v, i0, i1, [&](const int8_t* c, float amax, size_t s) {
    uint8_t* rec = static_cast<uint8_t*>(out) + q8_step_offset(s);
    std::memset(rec, 0, kQ8StepBytes);
    int32_t off[16] = {};
    for (int j = 0; j < 64; ++j) {
      rec[j] = static_cast<uint8_t>(c[2 * j]);
      rec[64 + j] = static_cast<uint8_t>(c[2 * j + 1]);
      off[j / 4] += c[2 * j] + c[2 * j + 1];
    }
    for (int l = 0; l < 16; ++l) off[l] *= -12;
    std::memcpy(rec + 128, off, sizeof off);
    q8_store_dx(static_cast<uint8_t*>(out), s, steps, 0.5f * (amax / 127.f));  // the table holds 2 * e2m1
  });
}

size_t q8g_vec_bytes(int K) { return static_cast<size_t>((K + 511) / 512) * kQ8gGroupBytes; }

namespace {
// Scalar placing of step s's 128 codes c (elements past the vector's end 0) and dx / 2 into the group
// record at rec: the lanes of the step's 4 blocks (lane 4L + s % 4: block L of the step), and, when
// the step ends the vector (last), zeros in the lanes of the group's missing steps.
void q8g_place_step(const int8_t* c, float dx2, int k, bool last, uint8_t* rec) {
  for (int L = 0; L < 4; ++L) {
    const int p = 4 * L + k;
    int32_t sum = 0;
    for (int u = 0; u < 4; ++u) {
      for (int i = 0; i < 4; ++i) {
        const int e = 32 * L + 8 * u + 2 * i;  // element of the step
        rec[128 * u + 4 * p + i] = static_cast<uint8_t>(c[e]);
        rec[128 * u + 64 + 4 * p + i] = static_cast<uint8_t>(c[e + 1]);
        sum += c[e] + c[e + 1];
      }
    }
    const int32_t off = -12 * sum;
    std::memcpy(rec + kQ8gCorrOffset + 4 * p, &off, 4);
    std::memcpy(rec + kQ8gDxOffset + 4 * p, &dx2, 4);
  }
  if (!last) return;
  for (int k2 = k + 1; k2 < 4; ++k2) {
    for (int L = 0; L < 4; ++L) {
      const int p = 4 * L + k2;
      for (int u = 0; u < 4; ++u) {
        std::memset(rec + 128 * u + 4 * p, 0, 4);
        std::memset(rec + 128 * u + 64 + 4 * p, 0, 4);
      }
      std::memset(rec + kQ8gCorrOffset + 4 * p, 0, 4);
      std::memset(rec + kQ8gDxOffset + 4 * p, 0, 4);
    }
  }
}
}  // namespace

#if FT_X86
namespace {
// q8g_prep_vec with AVX-512, bit for bit: the codes of q8_step_codes_avx512, the block sums by
// VPDPBUSD of ones, and the lanes placed by VPERMD and masked stores.
FT_TARGET_AVX512_BF16 void q8g_prep_vec_avx512(const float* v, int i0, int i1, int K, void* out) {
  const size_t steps = (static_cast<size_t>(K) + 127) / 128;
  const __m512i lane4 = _mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(~3));  // 4 * (d / 4)
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);
    __m512i even, odd;
    const float amax = q8_step_codes_avx512(v + (g - i0), n, even, odd);
    const size_t s = static_cast<size_t>(g / 128);
    const int k = static_cast<int>(s % 4);
    uint8_t* rec = static_cast<uint8_t*>(out) + s / 4 * kQ8gGroupBytes;
    // This step's lanes 4L + k (block L of the step); record u's lane takes dword u of the block, i.e.
    // dword 4L + u of even / odd.
    const __mmask16 mine = static_cast<__mmask16>(0x1111u << k);
    for (int u = 0; u < 4; ++u) {
      const __m512i idx = _mm512_add_epi32(lane4, _mm512_set1_epi32(u));
      _mm512_mask_storeu_epi32(rec + 128 * u, mine, _mm512_permutexvar_epi32(idx, even));
      _mm512_mask_storeu_epi32(rec + 128 * u + 64, mine, _mm512_permutexvar_epi32(idx, odd));
    }
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, even), ones, odd);
    sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32(sum, _MM_PERM_CDAB));  // sums of the 4 lanes of each block
    sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32(sum, _MM_PERM_BADC));
    _mm512_mask_storeu_epi32(rec + kQ8gCorrOffset, mine, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-12)));
    // the table holds 2 * e2m1
    _mm512_mask_storeu_ps(rec + kQ8gDxOffset, mine, _mm512_set1_ps(0.5f * (amax / 127.f)));
    if (s + 1 == steps) {  // the step ends the vector: zero the lanes of the group's missing steps
      unsigned later = 0;
      for (int k2 = k + 1; k2 < 4; ++k2) later |= 0x1111u << k2;
      for (size_t o = 0; later != 0 && o < kQ8gGroupBytes; o += 64) {
        _mm512_mask_storeu_epi32(rec + o, static_cast<__mmask16>(later), _mm512_setzero_si512());
      }
    }
  }
}
}  // namespace
#endif

void q8g_prep_vec(const float* v, int i0, int i1, int K, void* out) {
#if FT_X86
  q8g_prep_vec_avx512(v, i0, i1, K, out);
  return;
#endif
  const size_t steps = (static_cast<size_t>(K) + 127) / 128;
  q8_scalar_steps(v, i0, i1, [&](const int8_t* c, float amax, size_t s) {
    q8g_place_step(c, 0.5f * (amax / 127.f), static_cast<int>(s % 4), s + 1 == steps,
                   static_cast<uint8_t*>(out) + s / 4 * kQ8gGroupBytes);  // the table holds 2 * e2m1
  });
}

size_t q8a_vec_bytes(int K) { return FT_X86 ? pairs::record_bytes(K) : 0; }

void q8a_prep_vec(const float* v, int i0, int i1, void* out) {
#if FT_X86
  pairs::quantize(v, i0, i1, pairs::PairOrder::kEvenOdd, 12, 32, out);
#else
  (void)v, (void)i0, (void)i1, (void)out;
  throw Error("fp4 int8 kernels need x86 (AVX2)");
#endif
}

#if FT_X86
namespace {
// The e8m0 bytes that are not a normal power of two: 0 (the denormal 2^-127) and 255 (NaN).
struct E8m0Special {
  FT_TARGET_AVX512 __attribute__((always_inline)) __mmask64 operator()(__m512i b) const {
    return _mm512_cmpeq_epi8_mask(b, _mm512_setzero_si512()) | _mm512_cmpeq_epi8_mask(b, _mm512_set1_epi8(-1));
  }
};
}  // namespace

FT_TARGET_AVX512 bool e8m0_all_normal(const uint8_t* s, size_t n) { return no_byte_hits(s, n, 1, E8m0Special{}); }

namespace {
// The weight and scale streams of a call of nrows rows of K (its software prefetch, `prefetch` bytes ahead).
Streams q8_streams(const uint8_t* W, const uint8_t* S, int nrows, int K, int prefetch) {
  const size_t wbytes = static_cast<size_t>(nrows) * (K / 2), sbytes = static_cast<size_t>(nrows) * (K / 32);
  return Streams{Prefetch(W, wbytes, prefetch), Prefetch(S, sbytes, prefetch / 16)};
}

// One call of an int8 row kernel: the vectors as bytes (at most kMaxVectors), the weight and scale
// streams, and `kernel(nv, xq, pf)` with the call's number of vectors as a compile-time constant nv.
template <class Kernel>
void q8_call(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, int prefetch,
             Kernel kernel) {
  if (nrows <= 0 || n <= 0) return;
  n = std::min(n, kMaxVectors);
  const uint8_t* xq[kMaxVectors];
  for (int j = 0; j < n; ++j) xq[j] = static_cast<const uint8_t*>(xs[j]);
  const Streams pf = q8_streams(W, S, nrows, K, prefetch);
  dispatch_n(n, [&](auto nv) { kernel(nv, xq, pf); });
}
}  // namespace
#endif

void q8a_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch) {
#if FT_X86
  q8_call(W, S, nrows, xs, n, K, prefetch, [&](auto nv, const uint8_t* const* xq, const Streams& pf) {
    dot_rows_q8a<decltype(nv)::value>(W, S, nrows, xq, K, out, os, pf);
  });
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("fp4 int8 kernels need x86 (AVX2)");
#endif
}

namespace {
#if FT_X86
// Rows [0, nrows) of an int8 call in chunks, each chunk's e8m0 scales checked for codes outside
// [1, 254] just before it runs: f(r, n, normal) for rows [r, r + n), normal when none of their scales
// is special. A chunk is as many rows as half the scale stream's prefetch distance holds (whole
// groups of 4, at least 4; the whole call without software prefetch), so that a chunk's check reads
// lines requested a chunk earlier. A check of the whole call's scales before its first row read them
// from DRAM at once, with nothing to overlap. On the 2-core Emerald Rapids (2 threads, batch 1, 6
// alternating rounds against the whole-call check) ds_fp4 went from 0.876 to 0.898 of the read and
// mxfp4 stayed about even (0.877 / 0.872; docs/benchmarks.md, thirty-ninth session). Rows of either
// kind give the same bits. Calls of one vector take it, and since the fortieth session
// q8_dot_rows_multi's calls of several (a token's routes to one expert; tasks of several tokens take
// the group records, q8g, which convert every code the general way), on the same grounds; those
// were not timed.
template <class F>
inline void by_checked_scale_chunks(const uint8_t* S, int nrows, int K, const Streams& pf, F&& f) {
  const size_t lds = static_cast<size_t>(K) / 32;
  const int chunk =
      pf.s.dist > 0 ? std::max(4, static_cast<int>(static_cast<size_t>(pf.s.dist) / 2 / lds) / 4 * 4) : nrows;
  for (int r = 0; r < nrows; r += chunk) {
    const int n = std::min(chunk, nrows - r);
    f(r, n, e8m0_all_normal(S + r * lds, static_cast<size_t>(n) * lds));
  }
}

// One vector's rows by `how` (q8_dot_rows_one_vector).
template <bool Normal>
FT_TARGET_AVX512_BF16 void q8_one_vector_rows(const uint8_t* W, const uint8_t* S, int nrows, const uint8_t* x, int K,
                                              float* out, const Streams& pf, Q8Rows how) {
  const size_t ldw = static_cast<size_t>(K) / 2, lds = static_cast<size_t>(K) / 32;
  int r = 0;
  if (how == Q8Rows::four_at_a_time) {
    for (; r + 4 <= nrows; r += 4) dot_rows_q8_x4<Normal>(W + r * ldw, S + r * lds, x, K, out + r, pf);
  }
  if (r == nrows) return;
  if (how != Q8Rows::from_records && K / 32 <= kQ8RegBlocks) {
    dot_rows_q8_xreg_nb<Normal>(K / 32, W + r * ldw, S + r * lds, nrows - r, x, out + r, pf,
                                std::make_integer_sequence<int, kQ8RegBlocks>{});
  } else if (how != Q8Rows::from_records && K / 32 < 16 * (kQ8GroupRowsMax + 1)) {
    dot_rows_q8_groups_nb<Normal>(K / 32, W + r * ldw, S + r * lds, nrows - r, x, out + r, pf,
                                  std::make_integer_sequence<int, kQ8GroupRowsMax>{});
  } else {
    const uint8_t* const xs[1] = {x};
    dot_rows_q8<1, Normal>(W + r * ldw, S + r * lds, nrows - r, xs, K, out + r, 0, pf);
  }
}
#endif
}  // namespace

void q8_dot_rows_one_vector(const uint8_t* W, const uint8_t* S, int nrows, const void* x, int K, float* out,
                            int prefetch, Q8Rows how) {
#if FT_X86
  if (nrows <= 0) return;
  const Streams pf = q8_streams(W, S, nrows, K, prefetch);
  const auto* xq = static_cast<const uint8_t*>(x);
  const size_t ldw = static_cast<size_t>(K) / 2, lds = static_cast<size_t>(K) / 32;
  by_checked_scale_chunks(S, nrows, K, pf, [&](int r, int n, bool normal) {
    if (normal) {
      q8_one_vector_rows<true>(W + r * ldw, S + r * lds, n, xq, K, out + r, pf, how);
    } else {
      q8_one_vector_rows<false>(W + r * ldw, S + r * lds, n, xq, K, out + r, pf, how);
    }
  });
#else
  (void)W, (void)S, (void)nrows, (void)x, (void)K, (void)out, (void)prefetch, (void)how;
  throw Error("fp4 int8 kernels need x86 (AVX512-VNNI)");
#endif
}

void q8_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                       float* out, int os, int prefetch, bool by_multirow) {
#if FT_X86
  if (n == 1) {
    const bool four = by_multirow && multirow(static_cast<size_t>(K) / 2, 1);
    q8_dot_rows_one_vector(W, S, nrows, xs[0], K, out, prefetch, four ? Q8Rows::four_at_a_time : Q8Rows::fastest);
    return;
  }
  q8_call(W, S, nrows, xs, n, K, prefetch, [&](auto nv, const uint8_t* const* xq, const Streams& pf) {
    constexpr int NV = decltype(nv)::value;
    const size_t ldw = static_cast<size_t>(K) / 2, lds = static_cast<size_t>(K) / 32;
    by_checked_scale_chunks(S, nrows, K, pf, [&](int r, int rows, bool normal) {
      if (normal) {
        dot_rows_q8<NV, true>(W + r * ldw, S + r * lds, rows, xq, K, out + r, os, pf);
      } else {
        dot_rows_q8<NV, false>(W + r * ldw, S + r * lds, rows, xq, K, out + r, os, pf);
      }
    });
  });
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch, (void)by_multirow;
  throw Error("fp4 int8 kernels need x86 (AVX512-VNNI)");
#endif
}

void q8g_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch) {
#if FT_X86
  q8_call(W, S, nrows, xs, n, K, prefetch, [&](auto nv, const uint8_t* const* xq, const Streams& pf) {
    dot_rows_q8g<decltype(nv)::value>(W, S, nrows, xq, K, out, os, pf);
  });
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("fp4 int8 kernels need x86 (AVX512-VNNI)");
#endif
}

void fp8_round_trip(const float* v, int n, int block, float* out) {
  for (int b0 = 0; b0 < n; b0 += block) {
    const int b1 = std::min(n, b0 + block);
    float amax = 0.f;
    for (int i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float s = fp8_scale_of_amax(amax);
    for (int i = b0; i < b1; ++i) out[i] = e4m3_rne_sat(v[i] / s) * s;
  }
}

}  // namespace fp4
}  // namespace ft
