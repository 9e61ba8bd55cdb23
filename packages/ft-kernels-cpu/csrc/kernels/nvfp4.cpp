// nvfp4: NVIDIA ModelOpt NVFP4 expert weights. e2m1 values packed two per byte (low nibble = element
// 2j, high nibble = element 2j+1), one e4m3fn scale per 16 consecutive elements of a row, and an f32
// global scale per row (ModelOpt's per-tensor `weight_scale_2`, repeated over the rows; per row lets
// gate and up keep their own in one bank): w = e2m1 * e4m3_scale * global.
//
// Banks (E experts, H hidden, I intermediate; H and I multiples of 16):
//   w13          [E, 2I, H/2]   u8   e2m1 pairs; gate rows 0..I-1, then up rows I..2I-1
//   w13_scale    [E, 2I, H/16]  u8   e4m3fn bits
//   w13_scale_2  [E, 2I]        f32
//   w2           [E, H, I/2]    u8
//   w2_scale     [E, H, I/16]   u8
//   w2_scale_2   [E, H]         f32
//   w13_bias     [E, 2I]        f32  optional
//   w2_bias      [E, H]         f32  optional
//
// Kernels: the low and high nibbles of a run of bytes are looked up separately (16-entry table in a
// register), giving the even and the odd elements of a chunk; the vector tiers therefore take x (and
// the intermediate) rearranged per chunk, prepared once per task (prep_input) and once per route
// (prep_inter).
//  - avx2 with hidden / intermediate multiples of 32: an int8-activation path (W4A8, VPMADDUBSW), x
//    and the intermediate quantized per group of 16 in avx2_pairs.h's records (pairs of 32-blocks).
//  - avx2 otherwise, avx512: fp32 x, each chunk of 32 elements (16 for a last one) as its evens then
//    its odds; e2m1 values widened to fp32 and FMA'd, group scales applied per group.
//  - avx512_bf16 (with AVX512-VNNI): an int8-activation path (W4A8). x and the intermediate are
//    quantized to int8 per group of 16 (scale amax/127, round to nearest); per 256 elements the
//    weight bytes are regrouped by dword so that a VNNI lane holds one group, the nibbles become
//    2*e2m1 + 12 (unsigned 0..24) by VPERMB, four VPDPBUSD sum them against the int8 values
//    exactly, the +12 offset is taken out by starting each lane at -12 * (its group's x sum),
//    precomputed with x; then per group one int -> fp32 conversion and the product of the weight
//    and x group scales (details at kVnniBlockBytes).
// The batched hooks decode each weight chunk once and multiply it into up to 8 vectors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "format.h"
#include "kernels/avx2_pairs.h"
#include "kernels/byte_scan.h"
#include "kernels/fp8nv_common.h"
#include "kernels/int8_codes.h"
#include "kernels/row_reduce.h"
#include "kernels/stream_prefetch.h"

namespace ft {

namespace {

using fp8nv::Prefetch;

constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// dst = src with each chunk [c, c + 32) (or a last [c, c + 16)) of [k0, k1) as evens then odds;
// k0 is a multiple of 32, k1 - k0 a multiple of 16.
void to_even_odd(const float* src, float* dst, int k0, int k1) {
  for (int c = k0; c < k1; c += 32) {
    const int half = std::min(32, k1 - c) / 2;
    for (int j = 0; j < half; ++j) {
      dst[c + j] = src[c + 2 * j];
      dst[c + half + j] = src[c + 2 * j + 1];
    }
  }
}

// One row in natural element order: sum_g e4m3(sc[g]) * sum_{k in group g} e2m1(k) * x[k].
float nvfp4_row_scalar(const uint8_t* w, const uint8_t* sc, const float* x, int K) {
  const float* lut = fp8nv::e4m3_table().v;
  float tot = 0.f;
  for (int g = 0; g < K / 16; ++g) {
    float acc = 0.f;
    for (int j = 0; j < 8; ++j) {
      const uint8_t b = w[8 * g + j];
      acc += kE2m1[b & 15] * x[16 * g + 2 * j] + kE2m1[b >> 4] * x[16 * g + 2 * j + 1];
    }
    tot += lut[sc[g]] * acc;
  }
  return tot;
}

#if FT_X86

// Twice the e2m1 values as int8 (all integers), for VPSHUFB.
FT_TARGET_AVX2 inline __m128i e2m1x2_lut_i8() {
  return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// Rows with N vectors in even/odd chunk order. Per 32 elements: the 16 bytes' nibbles -> int8
// (2 * e2m1) by VPSHUFB, widened to fp32 8 at a time (once for all vectors); the group scales are
// broadcasts, the factor 2 is taken out at the end.
template <int N>
FT_TARGET_AVX2 void nvfp4_row_avx2(const uint8_t* w, const uint8_t* sc, const float* const* xs, int K, float* out,
                                   int os, const Prefetch& pf) {
  const float* lut = fp8nv::e4m3_table().v;
  const __m128i tab = e2m1x2_lut_i8(), low4 = _mm_set1_epi8(0x0f);
  __m256 acc0[N], acc1[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    if ((k & 127) == 0) pf.ahead(w + k / 2);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    const __m256 lo0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 lo1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    const __m256 hi0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 hi1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    const __m256 s0 = _mm256_set1_ps(lut[sc[k / 16]]), s1 = _mm256_set1_ps(lut[sc[k / 16 + 1]]);
    for (int j = 0; j < N; ++j) {
      const float* xp = xs[j] + k;
      const __m256 p0 = _mm256_fmadd_ps(hi0, _mm256_loadu_ps(xp + 16), _mm256_mul_ps(lo0, _mm256_loadu_ps(xp)));
      const __m256 p1 = _mm256_fmadd_ps(hi1, _mm256_loadu_ps(xp + 24), _mm256_mul_ps(lo1, _mm256_loadu_ps(xp + 8)));
      acc0[j] = _mm256_fmadd_ps(p0, s0, acc0[j]);
      acc1[j] = _mm256_fmadd_ps(p1, s1, acc1[j]);
    }
  }
  if (k < K) {  // a last group of 16: evens in xp[k, k + 8), odds in xp[k + 8, k + 16)
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(tab, _mm_and_si128(b, low4))));
    const __m256 hi =
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(b, 4), low4))));
    const __m256 s0 = _mm256_set1_ps(lut[sc[k / 16]]);
    for (int j = 0; j < N; ++j) {
      const float* xp = xs[j] + k;
      const __m256 p = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp + 8), _mm256_mul_ps(lo, _mm256_loadu_ps(xp)));
      acc0[j] = _mm256_fmadd_ps(p, s0, acc0[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j * os] = hsum8(_mm256_add_ps(acc0[j], acc1[j])) * 0.5f;
}

// Rows with N vectors in even/odd chunk order. Per 32 elements (16 bytes, two groups): the bytes
// widened to 16 lanes, VPERMPS with the 16 e2m1 values looks up the low nibbles (it reads index bits
// 3..0) and, after a shift, the high ones; lanes 0..7 are group 2j, lanes 8..15 group 2j+1, scaled by
// a permutation of 16 scales decoded together per 256 elements.
template <int N>
FT_TARGET_AVX512 void nvfp4_row_avx512(const uint8_t* w, const uint8_t* sc, const float* const* xs, int K,
                                       float* out, int os, const Prefetch& pf) {
  const __m512 tab = _mm512_loadu_ps(kE2m1);
  const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i two = _mm512_set1_epi32(2);
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 256 <= K; k += 256) {
    const uint8_t* wb = w + k / 2;
    if (pf.dist) {
      pf.ahead(wb);
      pf.ahead(wb + 64);
    }
    // 16 group scales (times 2^-8, see fp8nv_common.h).
    const __m512 S = fp8nv::e4m3x16_nan_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + k / 16)));
    __m512i idx = pair0;
    for (int q = 0; q < 8; ++q) {
      const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 16 * q)));
      const __m512 lo = _mm512_permutexvar_ps(d, tab);
      const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab);
      const __m512 s = _mm512_permutexvar_ps(idx, S);
      idx = _mm512_add_epi32(idx, two);
      for (int j = 0; j < N; ++j) {
        const float* xb = xs[j] + k + 32 * q;
        const __m512 p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xb)));
        acc[j] = _mm512_fmadd_ps(p, s, acc[j]);
      }
    }
  }
  const float* lut = fp8nv::e4m3_table().v;
  constexpr float kDown = 1.f / fp8nv::kE4m3Fp16Unscale;  // table scales to the 2^-8 of the vector ones
  for (; k < K; k += 32) {  // chunks of 32, then maybe a last group of 16 (lanes 0..7 only)
    const bool full = k + 32 <= K;
    const __mmask16 m = full ? 0xffff : 0x00ff;
    const __m512i d = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(full ? 0xffff : 0x00ff, w + k / 2));
    const __m512 lo = _mm512_permutexvar_ps(d, tab);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab);
    const float s1 = full ? lut[sc[k / 16 + 1]] * kDown : 0.f;
    const __m512 s = _mm512_insertf32x8(_mm512_set1_ps(lut[sc[k / 16]] * kDown), _mm256_set1_ps(s1), 1);
    const int half = full ? 16 : 8;
    for (int j = 0; j < N; ++j) {
      const float* xb = xs[j] + k;
      const __m512 p = _mm512_fmadd_ps(hi, _mm512_maskz_loadu_ps(m, xb + half),
                                       _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, xb)));
      acc[j] = _mm512_fmadd_ps(p, s, acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(acc[j]) * fp8nv::kE4m3Fp16Unscale;
}

#endif  // FT_X86

// The int8 path works on blocks of 256 elements (128 weight bytes, 16 groups). A VNNI dword lane
// takes 4 bytes; a group's 8 bytes are two dwords of its chunk of 64 bytes, so the block's two chunks
// A and B are first regrouped by dword: P = the even dwords of A then of B, Q = the odd ones (two
// VPERMT2D). Lane g of P and of Q then holds group g's 8 bytes, whose low and high nibbles become
// 2 * e2m1 + 12 (unsigned 0..24) by VPERMB: four vectors loP, hiP, loQ, hiQ. A vector's block
// record (kVnniBlockBytes, a last one zero-padded) matches them byte for byte:
//   [0, 64) q of elements 16g + 2p (lane g, byte p)      [64, 128) 16g + 2p + 1
//   [128, 192) 16g + 8 + 2p                               [192, 256) 16g + 9 + 2p
//   [256, 320) int32 -12 * (sum of q over group g)        [320, 384) f32 scale d of group g
// with q = round(v / d), d = amax / 127 per group of 16 (so |q * d - v| <= d / 2). Four VPDPBUSD
// starting from the -12 * sum give lane g = sum_k 2 * e2m1_k * q_k over group g exactly (int32),
// then one int -> fp32 conversion and the product of the weight and x group scales per group.
constexpr int kVnniBlockBytes = 384;

size_t vnni_bytes(int K) { return static_cast<size_t>((K + 255) / 256) * kVnniBlockBytes; }

#if FT_X86

// The code vectors loP, hiP, loQ, hiQ (above) of a block's 128 bytes A, B. VPERMB reads the low 6
// bits of each byte and the table repeats every 16 bytes, so the nibbles need no masking.
FT_TARGET_AVX512_BF16 inline void vnni_codes(__m512i A, __m512i B, __m512i* q) {
  const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i P = _mm512_permutex2var_epi32(A, even, B), Q = _mm512_permutex2var_epi32(A, odd, B);
  q[0] = _mm512_permutexvar_epi8(P, tab);
  q[1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(P, 4), tab);
  q[2] = _mm512_permutexvar_epi8(Q, tab);
  q[3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(Q, 4), tab);
}

// Lane g = sum over group g of (2 e2m1 + 12) * q, less 12 * sum q: exact int32, against the block
// record xr.
FT_TARGET_AVX512_BF16 inline __m512i vnni_sums(const __m512i* q, const uint8_t* xr) {
  __m512i t = _mm512_dpbusd_epi32(_mm512_loadu_si512(xr + 256), q[0], _mm512_loadu_si512(xr));
  t = _mm512_dpbusd_epi32(t, q[1], _mm512_loadu_si512(xr + 64));
  t = _mm512_dpbusd_epi32(t, q[2], _mm512_loadu_si512(xr + 128));
  return _mm512_dpbusd_epi32(t, q[3], _mm512_loadu_si512(xr + 192));
}

// One row with N int8-quantized vectors (block records above) and VPDPBUSD; g: the row's global scale.
template <int N>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void nvfp4_row_vnni(const uint8_t* w, const uint8_t* sc,
                                                                              const uint8_t* const* xs, int K,
                                                                              float* out, int os, const Prefetch& pf,
                                                                              float g) {
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < K; c += 256) {
    const uint8_t* wb = w + c / 2;
    if (pf.dist) {
      pf.ahead(wb);
      pf.ahead(wb + 64);
    }
    __m512i A, B;
    __m128i s16;
    if (c + 256 <= K) {
      A = _mm512_loadu_si512(wb);
      B = _mm512_loadu_si512(wb + 64);
      s16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + c / 16));
    } else {  // a last block of L < 256 elements (a multiple of 16): missing bytes and scales zero
      const int L = K - c;
      A = _mm512_maskz_loadu_epi8(L >= 128 ? ~0ull : (1ull << (L / 2)) - 1, wb);
      B = _mm512_maskz_loadu_epi8(L > 128 ? (1ull << (L / 2 - 64)) - 1 : 0ull, wb + 64);
      s16 = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (L / 16)) - 1u), sc + c / 16);
    }
    __m512i q[4];
    vnni_codes(A, B, q);
    const __m512 S = fp8nv::e4m3x16_nan_avx512(s16);  // lane g: group g (times 2^-8)
    for (int j = 0; j < N; ++j) {
      const uint8_t* xr = xs[j] + static_cast<size_t>(c / 256) * kVnniBlockBytes;
      acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(vnni_sums(q, xr)), S), _mm512_loadu_ps(xr + 320),
                               acc[j]);
    }
  }
  // The table holds 2 * e2m1, the scales carry 2^-8: both undone by one power of two, exactly, so
  // with the global scale it is still one rounding of sum * 2^k * g.
  rowred::store_sums(acc, N, out, os, 0.5f * fp8nv::kE4m3Fp16Unscale * g);
}

// Rows ldw / lds apart, each nvfp4_row_vnni<N>: one call for all of them (a call and a global-scale
// pass per row had taken ~10% of nvfp4's batch 1 in cache on the 2-core Zen 4; docs/benchmarks.md,
// thirtieth session).
template <int N>
FT_TARGET_AVX512_BF16 void nvfp4_rows_vnni(const uint8_t* W, const uint8_t* SC, const float* G, size_t ldw,
                                           size_t lds, int nrows, const uint8_t* const* xs, int K, float* out,
                                           int os, const Prefetch& pf) {
  for (int r = 0; r < nrows; ++r) nvfp4_row_vnni<N>(W + r * ldw, SC + r * lds, xs, K, out + r, os, pf, G[r]);
}

// The e4m3 NaN codes, 0x7f and 0xff.
struct E4m3Nan {
  FT_TARGET_AVX512 __attribute__((always_inline)) __mmask64 operator()(__m512i b) const {
    const __m512i low7 = _mm512_set1_epi8(0x7f);
    return _mm512_cmpeq_epi8_mask(_mm512_and_si512(b, low7), low7);
  }
};
// Whether none of the n scale bytes at s is an e4m3 NaN code.
FT_TARGET_AVX512 bool e4m3_no_nan(const uint8_t* s, size_t n) { return no_byte_hits(s, n, 0, E4m3Nan{}); }

// One row's 256-element block at wb (scales at scb) against x's block record, held in registers (xv:
// its 4 code lines, start: its offset lanes, d: its scales), into acc: exactly nvfp4_row_vnni<1>'s
// arithmetic (vnni_sums, then the same conversion, multiply and FMA).
template <bool NoNan>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void nvfp4_vnni_block1_x(const uint8_t* wb,
                                                                                    const uint8_t* scb,
                                                                                    const __m512i* xv, __m512i start,
                                                                                    __m512 d, __m512& acc) {
  __m512i A = _mm512_loadu_si512(wb), B = _mm512_loadu_si512(wb + 64);
  FT_IN_REGISTER(A);  // VPERMT2D overwrites a source: without this, A and B were each loaded twice
  FT_IN_REGISTER(B);
  __m128i s16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scb));
  FT_IN_REGISTER(s16);
  __m512i q[4];
  vnni_codes(A, B, q);
  const __m512 S = NoNan ? fp8nv::e4m3x16_avx512(s16) : fp8nv::e4m3x16_nan_avx512(s16);
  __m512i t = _mm512_dpbusd_epi32(start, q[0], xv[0]);
  t = _mm512_dpbusd_epi32(t, q[1], xv[1]);
  t = _mm512_dpbusd_epi32(t, q[2], xv[2]);
  t = _mm512_dpbusd_epi32(t, q[3], xv[3]);
  acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t), S), d, acc);
}

// 4 consecutive rows (w, sc: the first; ldw, lds apart) against one vector, K a multiple of 256 (the
// caller's condition), the 4 sums from one transposed reduction; each row's arithmetic is exactly
// nvfp4_row_vnni<1>'s. The rows are interleaved block by block (the 4 rows take the same x record,
// loaded once into registers for the 4, and give the core 4 independent chains): 4 streams, which
// the hardware prefetchers of Zen 5 do not follow, so the software prefetch walks the 4 rows' span in
// address order at 4 times the pace. With the record's 6 lines read by each row from L1 (as memory
// operands, and A and B twice each) a row's block took 10 loads of 64 bytes; with all of them held in
// registers it takes 2 and a quarter of the record's 6: on one Zen 4 core from L3, qwen3-30b-a3b's
// batch 1 went from 104.5 to 99.0 us a step (docs/benchmarks.md, thirty-fourth session).
template <bool NoNan>
FT_TARGET_AVX512_BF16 void nvfp4_rows4_vnni(const uint8_t* w, const uint8_t* sc, const float* g, size_t ldw,
                                            size_t lds, const uint8_t* xq, int K, float* out, const Prefetch& pf,
                                            const Prefetch& pfs) {
  __m512 acc[4];
  #pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
  for (int c = 0; c < K; c += 256) {
    const uint8_t* xr = xq + static_cast<size_t>(c / 256) * kVnniBlockBytes;
    __m512i xv[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      xv[p] = _mm512_loadu_si512(xr + 64 * p);
      FT_IN_REGISTER(xv[p]);
    }
    __m512i start = _mm512_loadu_si512(xr + 256);
    __m512 d = _mm512_loadu_ps(xr + 320);
    FT_IN_REGISTER(start);
    FT_IN_REGISTER(d);
    if (pfs.dist) pfs.ahead(sc + c / 4);  // the 4 rows' scale span in address order, at 4 times the pace
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const uint8_t* wb = w + i * ldw + c / 2;
      if (pf.dist) {  // the 4 rows' span read as one stream at 4 times the pace (address order)
        pf.ahead(w + 2 * c + 128 * i);
        pf.ahead(w + 2 * c + 128 * i + 64);
      }
      nvfp4_vnni_block1_x<NoNan>(wb, sc + i * lds + c / 16, xv, start, d, acc[i]);
    }
  }
  _mm_storeu_ps(out, _mm_mul_ps(rowred::hsum_x4(acc[0], acc[1], acc[2], acc[3]),
                                _mm_mul_ps(_mm_set1_ps(0.5f * fp8nv::kE4m3Fp16Unscale), _mm_loadu_ps(g))));
}

// 2 consecutive rows against N >= 2 vectors, K a multiple of 256: each vector's block record is
// loaded once for both rows (Zen 4 loads one 512-bit line a cycle; docs/benchmarks.md, fourteenth
// session). Each row's arithmetic is exactly nvfp4_row_vnni<N>'s. The two rows' span is prefetched
// as one stream at twice the pace.
template <int N>
FT_TARGET_AVX512_BF16 void nvfp4_rows2_vnni(const uint8_t* w, const uint8_t* sc, const float* g, size_t ldw,
                                            size_t lds, const uint8_t* const* xs, int K, float* out, int os,
                                            const Prefetch& pf) {
  __m512 acc0[N], acc1[N];
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
  for (int c = 0; c < K; c += 256) {
    const uint8_t* wb0 = w + c / 2;
    const uint8_t* wb1 = wb0 + ldw;
    if (pf.dist) {
      for (int o = 0; o < 256; o += 64) pf.ahead(w + c + o);
    }
    __m512i q0[4], q1[4];
    vnni_codes(_mm512_loadu_si512(wb0), _mm512_loadu_si512(wb0 + 64), q0);
    vnni_codes(_mm512_loadu_si512(wb1), _mm512_loadu_si512(wb1 + 64), q1);
    const __m512 S0 = fp8nv::e4m3x16_nan_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + c / 16)));
    const __m512 S1 =
        fp8nv::e4m3x16_nan_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + lds + c / 16)));
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const uint8_t* xr = xs[j] + static_cast<size_t>(c / 256) * kVnniBlockBytes;
      const __m512i start = _mm512_loadu_si512(xr + 256);
      __m512i t0 = start, t1 = start;
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m512i xv = _mm512_loadu_si512(xr + 64 * p);
        t0 = _mm512_dpbusd_epi32(t0, q0[p], xv);
        t1 = _mm512_dpbusd_epi32(t1, q1[p], xv);
      }
      const __m512 d = _mm512_loadu_ps(xr + 320);
      acc0[j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t0), S0), d, acc0[j]);
      acc1[j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t1), S1), d, acc1[j]);
    }
  }
  rowred::store_sums(acc0, N, out, os, 0.5f * fp8nv::kE4m3Fp16Unscale * g[0]);
  rowred::store_sums(acc1, N, out + 1, os, 0.5f * fp8nv::kE4m3Fp16Unscale * g[1]);
}

// Blocks of v[k0, k1) (k0 a multiple of 256, k1 - k0 a multiple of 16) into dst (the whole vector's).
// Per group of 16: amax, q = round-to-nearest-even(v * 127 / amax) (MXCSR default); the int32 ->
// int8 narrowing saturates (|v * 127 / amax| <= 127 up to rounding).
FT_TARGET_AVX512_BF16 void vnni_quantize(const float* v, int k0, int k1, uint8_t* dst) {
  // Elements 0,2,4,6 | 1,3,5,7 | 8,10,12,14 | 9,11,13,15: dwords for loP, hiP, loQ, hiQ.
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int c = k0; c < k1; c += 256) {
    const int L = std::min(256, k1 - c);
    uint8_t* rec = dst + static_cast<size_t>(c / 256) * kVnniBlockBytes;
    if (L < 256) std::memset(rec, 0, kVnniBlockBytes);
    int32_t* negc = reinterpret_cast<int32_t*>(rec + 256);
    float* d = reinterpret_cast<float*>(rec + 320);
    for (int g = 0; g < L / 16; ++g) {
      const __m512 x = _mm512_loadu_ps(v + c + 16 * g);
      const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(x));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      const __m512i q32 = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(inv)));
      const __m128i q8 = _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(q32), order);
      const int32_t d0 = _mm_cvtsi128_si32(q8), d1 = _mm_extract_epi32(q8, 1), d2 = _mm_extract_epi32(q8, 2),
                    d3 = _mm_extract_epi32(q8, 3);
      std::memcpy(rec + 4 * g, &d0, 4);
      std::memcpy(rec + 64 + 4 * g, &d1, 4);
      std::memcpy(rec + 128 + 4 * g, &d2, 4);
      std::memcpy(rec + 192 + 4 * g, &d3, 4);
      negc[g] = -12 * _mm512_reduce_add_epi32(q32);
      d[g] = amax / 127.f;
    }
  }
}
#else
void vnni_quantize(const float*, int, int, uint8_t*) { throw Error("nvfp4: the int8 path needs x86 AVX512-VNNI"); }
#endif  // FT_X86

// ---- avx2 tier: int8 activations (VPMADDUBSW) ----
//
// x and the intermediate quantized per group of 16 (int8_codes: amax over the group, step amax/127,
// round half to even) into avx2_pairs.h's records: pairs of blocks of 32, codes in the nibble order of
// the weights (even elements, then odd), the int32 lanes 0-1 of a block the first group's, 2-3 the
// second's, with their steps. Two blocks (32 bytes) per register; the weights' 8 e4m3 scales of 4
// blocks are converted at once and spread over the lanes by VPERMPS. Weights are 2 e2m1 + 12
// (unsigned 0..24, offset 12): the dot product is twice the value, halved with the global scale.
// For K a multiple of 32 (real checkpoints); other K take the fp32 kernels.
inline bool avx2_int8(Isa isa, int K) { return FT_X86 && isa == Isa::avx2 && K % 32 == 0; }
size_t q8nv_bytes(int K) { return FT_X86 ? pairs::record_bytes(K) : 0; }

// Elements [k0, k1) of v (k0 a multiple of 64, k1 of 32; v and dst indexed from element 0 of the
// vector).
void q8nv_quantize(const float* v, int k0, int k1, uint8_t* dst) {
#if FT_X86
  pairs::quantize(v + k0, k0, k1, pairs::PairOrder::kEvenOdd, 12, 16, dst);
#else
  (void)v, (void)k0, (void)k1, (void)dst;
#endif
}

#if FT_X86
struct Nvfp4Pairs {
  static constexpr int kOffset = 12;
  // two steps per block (16 elements each): rows_by4 keeps them apart (avx2_pairs.h)
  static constexpr bool kScalePerBlock = false;
  const uint8_t* W;
  const uint8_t* SC;
  size_t ldw, lds;
  const Prefetch* pf;
  FT_TARGET_AVX2 void pair(int row, int p, __m256i& L, __m256i& H) const {
    pairs::e2m1_split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(W + row * ldw + 32 * p)), L, H);
  }
  FT_TARGET_AVX2 void half(int row, int p, __m256i& L, __m256i& H) const {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(W + row * ldw + 32 * p));
    pairs::e2m1_split(_mm256_set_m128i(_mm_setzero_si128(), a), L, H);
  }
  // The e4m3fn scale bytes in bytes 0..7 of b as fp32 (lane i from byte i), exactly, without a
  // table: sign-extended to int32, v << 20 holds the magnitude bits at 20..26 (fp32 exponent and
  // mantissa, e << 23 | m << 20) and copies of the sign at 27..31, of which the AND keeps bit 31;
  // times 2^120 that is 2^(e - 7) (1 + m / 8), and for e = 0 the fp32 subnormal m 2^-129 times 2^120
  // = m 2^-9. 0x7f / 0xff (NaN) become all ones (a NaN): v << 25 is 0xfe000000 just for them. Two
  // operations fewer than zero-extending and masking sign and magnitude apart; on the 2-core Zen 3
  // (one vector, 128 rows of K = 2048 in L2, min of 8 runs) the row loop went from 6.03 to 5.69 TSC
  // ticks per 64 weights. (Swapping words so that VUNPCKLPS / VUNPCKHPS replace the VPERMPS below
  // measured slower: 6.31, the swap's scalar operations take dispatch slots the loop needs.)
  FT_TARGET_AVX2 static __m256 e4m3x8(__m128i b) {
    const __m256i v = _mm256_cvtepi8_epi32(b);
    const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(static_cast<int>(0x87f00000u)));
    const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
    const __m256i nan = _mm256_cmpeq_epi32(_mm256_slli_epi32(v, 25), _mm256_set1_epi32(static_cast<int>(0xfe000000u)));
    return _mm256_or_ps(f, _mm256_castsi256_ps(nan));
  }
  // Each scale covers two int32 lanes of a pair (16 elements): lanes [s0 s0 s1 s1 s2 s2 s3 s3] of
  // pair 2g and [s4 s4 .. s7 s7] of pair 2g + 1.
  FT_TARGET_AVX2 void scales4(int row, int g, __m256& s0, __m256& s1) const {
    const __m256 f = e4m3x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(SC + row * lds + 8 * g)));
    s0 = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    s1 = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
  }
  // Pair p's 4 scale bytes (2 for a half pair; the missing ones 0, i.e. 0.0).
  FT_TARGET_AVX2 __m256 scales2(int row, int p, bool half) const {
    uint32_t w = 0;
    std::memcpy(&w, SC + row * lds + 4 * p, half ? 2 : 4);
    const __m256 f = e4m3x8(_mm_cvtsi32_si128(static_cast<int>(w)));
    return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
  void ahead(int row, int g) const {
    if (pf->dist) pf->ahead(W + row * ldw + 64 * g);
  }
};
#endif

// Rows of one matrix against n vectors: W (K/2 bytes a row), SC (K/16 scale bytes a row) and G
// (global scale per row) all point at the first row; out[j * os + r]. Vectors: fp32 in natural order
// (scalar), q8nv records (avx2 with K a multiple of 32), fp32 in even/odd chunk order (avx2, avx512),
// VNNI chunks (avx512_bf16).
// rows4_one: one vector reads 4 rows side by side at every row length (avx512_bf16, K a multiple of
// 256), not only from multirow()'s bytes.
void nvfp4_rows(Isa isa, const uint8_t* W, const uint8_t* SC, const float* G, int nrows, const void* const* xs,
                int n, int K, float* out, int os, int prefetch, bool rows4_one) {
  const size_t ldw = static_cast<size_t>(K) / 2, lds = static_cast<size_t>(K) / 16;
#if FT_X86
#if FT_X86
  if (avx2_int8(isa, K)) {
    const Prefetch pf(W, nrows * ldw, prefetch);
    const Nvfp4Pairs blk{W, SC, ldw, lds, &pf};
    const uint8_t* const* xq = reinterpret_cast<const uint8_t* const*>(xs);
    dispatch_n(n, [&](auto nv) { pairs::rows<decltype(nv)::value>(blk, xq, nrows, K / 32, out, os); });
    for (int j = 0; j < n; ++j)
      for (int r = 0; r < nrows; ++r) out[j * os + r] *= 0.5f * G[r];
    return;
  }
#endif
  if (isa != Isa::scalar) {
    const Prefetch pf(W, nrows * ldw, prefetch);
    int r = 0;
    const bool rows4 = rows4_one || multirow(static_cast<size_t>(K) / 2, 1);
    if (isa == Isa::avx512_bf16 && n == 1 && K % 256 == 0 && rows4) {
      const uint8_t* xq = static_cast<const uint8_t*>(xs[0]);
      // The scale bytes are a stream of their own (an eighth of the values' bytes), prefetched as
      // the values are, at an eighth of their distance: the 4 rows' scale span advances 64 bytes a
      // block where their values advance 512. Without it the hardware prefetchers left the scales
      // behind: on the 2-core Emerald Rapids, 2 threads, batch 1 went from 0.861 to 0.914 of the read
      // (docs/benchmarks.md, thirty-ninth session). Where a group's scale bytes hold no NaN code the
      // 4-row kernel converts them without the NaN check (fp8nv::e4m3x16_avx512, the same bits for
      // every other code; one core in cache, qwen3-30b-a3b batch 1: 100.1 -> 97.4 us a step,
      // thirty-fourth session). The check is made per group of 4 rows, on bytes the prefetch has
      // brought: a check of the whole call's scales before its first row read them from DRAM at once,
      // with nothing to overlap.
      const Prefetch pfs(SC, static_cast<size_t>(nrows) * lds, prefetch ? std::max(64, (prefetch / 8) & ~63) : 0);
      for (; r + 4 <= nrows; r += 4) {
        const uint8_t* sc = SC + r * lds;
        if (e4m3_no_nan(sc, 4 * lds)) {
          nvfp4_rows4_vnni<true>(W + r * ldw, sc, G + r, ldw, lds, xq, K, out + r, pf, pfs);
        } else {
          nvfp4_rows4_vnni<false>(W + r * ldw, sc, G + r, ldw, lds, xq, K, out + r, pf, pfs);
        }
      }
    }
    if (isa == Isa::avx512_bf16 && n >= 2 && K % 256 == 0 && multirow(static_cast<size_t>(K) / 2, n)) {
      const uint8_t* const* xq = reinterpret_cast<const uint8_t* const*>(xs);
      for (; r + 2 <= nrows; r += 2) {
        dispatch_n(n, [&](auto nv) {
          nvfp4_rows2_vnni<decltype(nv)::value>(W + r * ldw, SC + r * lds, G + r, ldw, lds, xq, K, out + r, os, pf);
        });
      }
    }
    if (isa == Isa::avx512_bf16) {
      const uint8_t* const* xq = reinterpret_cast<const uint8_t* const*>(xs);
      dispatch_n(n, [&](auto nv) {
        nvfp4_rows_vnni<decltype(nv)::value>(W + r * ldw, SC + r * lds, G + r, ldw, lds, nrows - r, xq, K, out + r,
                                             os, pf);
      });
      return;
    }
    for (; r < nrows; ++r) {
      const uint8_t* w = W + r * ldw;
      const uint8_t* sc = SC + r * lds;
      if (isa == Isa::avx512) {
        const float* const* xf = reinterpret_cast<const float* const*>(xs);
        dispatch_n(n, [&](auto nv) { nvfp4_row_avx512<decltype(nv)::value>(w, sc, xf, K, out + r, os, pf); });
      } else {
        const float* const* xf = reinterpret_cast<const float* const*>(xs);
        dispatch_n(n, [&](auto nv) { nvfp4_row_avx2<decltype(nv)::value>(w, sc, xf, K, out + r, os, pf); });
      }
      for (int j = 0; j < n; ++j) out[j * os + r] *= G[r];
    }
    return;
  }
#endif
  (void)isa, (void)prefetch;
  for (int j = 0; j < n; ++j) {
    const float* xf = static_cast<const float*>(xs[j]);
    for (int r = 0; r < nrows; ++r) out[j * os + r] = nvfp4_row_scalar(W + r * ldw, SC + r * lds, xf, K) * G[r];
  }
}

class Nvfp4Format final : public MoeFormat {
 public:
  Nvfp4Format(const MoeParams& p, FormatArgs& args) : p_(p) {
    if (p.hidden % 16 != 0 || p.intermediate % 16 != 0) {
      throw Error(args.context() + ": nvfp4 needs hidden and intermediate to be multiples of 16 (one e4m3 " +
                  "scale per 16 elements), got hidden=" + std::to_string(p.hidden) +
                  ", intermediate=" + std::to_string(p.intermediate));
    }
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H / 2}, DType::u8));
    s13_ = static_cast<const uint8_t*>(args.require_bank("w13_scale", {E, 2 * I, H / 16}, DType::u8));
    g13_ = static_cast<const float*>(args.require_bank("w13_scale_2", {E, 2 * I}, DType::f32));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I / 2}, DType::u8));
    s2_ = static_cast<const uint8_t*>(args.require_bank("w2_scale", {E, H, I / 16}, DType::u8));
    g2_ = static_cast<const float*>(args.require_bank("w2_scale_2", {E, H}, DType::f32));
    b13_ = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
    b2_ = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  }

  // prep_inter takes whole chunks of the tier's order (32, 64 for the avx2 int8 records, or 256 for
  // VNNI). Pass-1 units of 64 rows: 96 units per Qwen3-30B-A3B decode step, measured best of 32 / 64
  // / 256 on the 16-core Xeon (docs/benchmarks.md).
  int pass1_rows() const override { return vnni() ? 64 : 32; }
  int prep_rows() const override { return vnni() ? 256 : avx2_int8(p_.isa, p_.intermediate) ? 64 : 32; }
  int pass2_rows() const override { return kPass2Rows; }

  void prep_input(const TaskInput& in) override {
    const size_t H = p_.hidden;
    if (avx2_int8(p_.isa, p_.hidden)) {
      const size_t vb = x_stride();
      xq_.resize(static_cast<size_t>(in.num_tokens) * vb);
      for (int t = 0; t < in.num_tokens; ++t) q8nv_quantize(in.x_f32 + t * H, 0, p_.hidden, xq_.data() + t * vb);
      return;
    }
    if (vnni()) {
      const size_t vb = x_stride();
      xq_.resize(static_cast<size_t>(in.num_tokens) * vb);
      for (int t = 0; t < in.num_tokens; ++t) vnni_quantize(in.x_f32 + t * H, 0, p_.hidden, xq_.data() + t * vb);
      return;
    }
    if (!permuted()) return;
    const size_t xs = x_stride() / 4;
    xp_.resize(static_cast<size_t>(in.num_tokens) * xs);
    for (int t = 0; t < in.num_tokens; ++t) to_even_odd(in.x_f32 + t * H, xp_.data() + t * xs, 0, p_.hidden);
  }

  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    gate_up_tokens(in, e, &t, &in_scale, 1, i0, i1, gate, up, 0);
  }

  void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0, int i1,
                      float* gate, float* up, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const size_t row_g = static_cast<size_t>(e) * 2 * I + i0, row_u = row_g + I;
    const void* xs[fp8nv::kMaxVectors];
    for (int j = 0; j < n; ++j) {
      const int t = tokens[j];
      if (avx2_int8(p_.isa, p_.hidden)) {
        xs[j] = xq_.data() + t * x_stride();
      } else {
        xs[j] = vnni()       ? static_cast<const void*>(xq_.data() + t * x_stride())
                : permuted() ? static_cast<const void*>(xp_.data() + t * (x_stride() / 4))
                             : static_cast<const void*>(in.x_f32 + t * H);
      }
    }
    const int rows = i1 - i0, K = p_.hidden;
    auto part = [&](int r, int c, bool is_up) {
      const size_t row = (is_up ? row_u : row_g) + r;
      nvfp4_rows(p_.isa, w13_ + row * (H / 2), s13_ + row * (H / 16), g13_ + row, c, xs, n, K,
                 (is_up ? up : gate) + r, stride, pf_, rows4_one_);
    };
    gate_up_slices(rows, H / 2, n, part);  // one vector: gate and up in turns (stream_prefetch.h)
    const float* bg = b13_ ? b13_ + row_g : nullptr;
    for (int j = 0; j < n; ++j) {
      float* g = gate + j * stride;
      float* u = up + j * stride;
      for (int i = 0; i < rows; ++i) {
        g[i] = in_scales[j] * g[i] + (bg ? bg[i] : 0.f);
        u[i] = in_scales[j] * u[i] + (bg ? bg[I + i] : 0.f);
      }
    }
  }

  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    return gate_up_down_streams(pass2, w13_, p_.hidden / 2, w2_, p_.intermediate / 2, p_.intermediate, p_.hidden, e,
                                r0, r1, out);
  }


  size_t inter_prep_bytes() const override {
    if (avx2_int8(p_.isa, p_.intermediate)) return q8nv_bytes(p_.intermediate);
    return vnni() ? vnni_bytes(p_.intermediate) : permuted() ? p_.intermediate * sizeof(float) : 0;
  }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
    if (avx2_int8(p_.isa, p_.intermediate)) {
      q8nv_quantize(h, i0, i1, static_cast<uint8_t*>(prepped));
    } else if (vnni()) {
      vnni_quantize(h, i0, i1, static_cast<uint8_t*>(prepped));
    } else {
      to_even_odd(h, static_cast<float*>(prepped), i0, i1);
    }
  }

  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    const size_t row = static_cast<size_t>(e) * H + h0;
    const void* hs[fp8nv::kMaxVectors];
    for (int j = 0; j < n; ++j) hs[j] = permuted() ? routes[j].h_prepped : static_cast<const void*>(routes[j].h);
    nvfp4_rows(p_.isa, w2_ + row * (I / 2), s2_ + row * (I / 16), g2_ + row, rows, hs, n, p_.intermediate, out,
               stride, pf_, rows4_one_);
    if (b2_) {
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < rows; ++i) out[j * stride + i] += b2_[row + i];
      }
    }
  }

 private:
  static constexpr int kPass2Rows = 64;
  bool permuted() const { return p_.isa != Isa::scalar; }
  bool vnni() const { return p_.isa == Isa::avx512_bf16; }
  // Bytes from one token's prepared x to the next (common.h's vec_stride): int8 records (avx2 for H
  // a multiple of 32, VNNI) or fp32 in even/odd order.
  size_t x_stride() const {
    const size_t H = p_.hidden;
    return vec_stride(avx2_int8(p_.isa, p_.hidden) ? q8nv_bytes(p_.hidden) : vnni() ? vnni_bytes(p_.hidden) : H * 4);
  }

  MoeParams p_;
  int pf_ = p_.prefetch;  // after p_ (declaration order)
  // One vector: 4 rows side by side (nvfp4_rows4_vnni) at every row length wherever the software
  // prefetch is on, unless $FT_CPU_MOE_MULTIROW_BYTES says otherwise. The vendor default of AMD
  // before Zen 5 (rows of 2 KiB or more) suits the ggml formats, whose alternative is gate and up
  // rows side by side; nvfp4's alternative is one row at a time, which on the 2-core Zen 4 was the
  // slower (one thread: 984 -> 935 us a step from DRAM, 917 -> 816 from a 20 MiB pool; two threads
  // in cache 473 -> 405; docs/benchmarks.md, thirty-second session). Without software prefetch
  // (Zen 5's default) the hardware prefetchers do not follow 4 interleaved rows (stream_prefetch.h).
  bool rows4_one_ = !p_.multirow_explicit && p_.prefetch > 0;
  const uint8_t* w13_;
  const uint8_t* s13_;
  const float* g13_;
  const uint8_t* w2_;
  const uint8_t* s2_;
  const float* g2_;
  const float* b13_;
  const float* b2_;
  AlignedBuffer<float> xp_;    // x in even/odd chunk order, [T, H] (avx2, avx512)
  AlignedBuffer<uint8_t> xq_;  // x quantized: VNNI blocks (avx512_bf16) or q8nv records (avx2), per token
};

std::unique_ptr<MoeFormat> make_nvfp4_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Nvfp4Format>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("nvfp4", &make_nvfp4_format);

}  // namespace ft
