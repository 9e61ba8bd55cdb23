// ds_fp4's int16 kernels of the avx2 tier (ds_fp4_kernels.h): VPMADDWD against the round-tripped x as
// exact integers, the avx2 counterpart of the avx512_bf16 tier's VPDPWSSD kernels (ds_fp4_kernels.cpp,
// whose comment explains the integers: hi = x >> 3 in int16 for every element, lo = x & 7 where a
// record needs it).
//
// A step is 2 blocks (32 bytes of a row, one load): AND / shift / AND split the nibbles, VPSHUFB looks
// them up as int8 2 * e2m1 (the low nibbles' bytes E, the high nibbles' O), and VPUNPCK{L,H}BW with
// zero make 4 vectors of 16 words w * 256 (the code in the high byte: no sign extension needed). 4
// VPMADDWD against x's hi words sum the step into 8 int32 lanes, 4 per block; one conversion, a
// multiply of the blocks' scales and one FMA. The lo part (0 .. 7) meets E and O as bytes: 2
// VPMADDUBSW (lo unsigned, w signed: pair sums <= 168), a VPADDW and one VPMADDWD by ones, where
// 4 VPMADDWD against lo words and 3 additions took twice the lo loads. About 28 vector operations
// per 64 weights (32 bytes) with lo, against ~40 for the fp32 kernels (fp4_kernels.cpp, block_avx2).
//
// Record of 64 elements (kAvx2Record bytes), for blocks L = 0, 1 of 32 elements:
//   bytes 0..127    hi words: word 16v + 8L + i = element 32L + 16 (v & 1) + 2i + (v >> 1), i < 8
//   bytes 128..159  8 fp32 lanes: lanes 4L .. 4L + 3 = block L's activation scale * 2^-15
//   bytes 160..163  int32, non-zero if the record carries lo
//   bytes 192..255  lo bytes (0 .. 7): byte 32q + 16L + i = element 32L + 2i + q (q = 0: meets E,
//                   q = 1: meets O)
// Products |w * 256 * hi| <= 12 * 256 * 28672 < 2^27 and a lane sums 8 of them (< 2^30); lo adds
// 32 * t_lo (t_hi + t_lo / 8 in units of the words' 256; |t_lo| <= 8 * 12 * 7) before the one
// conversion, so nothing overflows int32.
#include <algorithm>
#include <cstring>

#include "dispatch_n.h"
#include "ds_fp4_kernels.h"
#include "fp4_common.h"
#include "stream_prefetch.h"

namespace ft {
namespace dsfp4 {

namespace {

constexpr size_t kAvx2Record = 320;
constexpr size_t kAvx2Scale = 128, kAvx2Flag = 160, kAvx2Lo = 192;

using Prefetch = StreamPrefetch<PrefetchHint::L2>;  // as fp4_kernels.cpp

#if FT_X86

// Rows [0, nrows) of W (nrows a multiple of R) against NV vectors, R rows side by side: each step of
// R rows meets every vector's record once, so with R = 2 the second row's loads of the record hit L1
// (8 vectors' records of H = 2048 are 48 KiB of lines, more than Zen 3's L1d). Each row takes the
// same operations in the same order whatever R, so results do not depend on how rows are grouped.
template <int NV, int R>
FT_TARGET_AVX2 void rows(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int K, float* out,
                         int os, const Prefetch& pw, const Prefetch& ps) {
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
  const __m256i m = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
  const int nb = K / 32;
  constexpr bool two = NV <= 2;  // two accumulator chains per vector (the FMA latency)
  static_assert(R == 1 || !two, "rows side by side only for 3+ vectors (one chain each)");
  for (int r = 0; r < nrows; r += R) {
    const uint8_t* w[R];
    const uint8_t* s[R];
    for (int i = 0; i < R; ++i) {
      w[i] = W + static_cast<size_t>(r + i) * (K / 2);
      s[i] = S + static_cast<size_t>(r + i) * nb;
      if (ps.dist) ps.ahead(s[i]);
    }
    __m256 a0[R][NV], a1[R][NV];
    for (int i = 0; i < R; ++i)
      #pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) a0[i][j] = a1[i][j] = _mm256_setzero_ps();
    // Blocks b and b + 1 (if `pair`) of the R rows against every vector's record b / 2, into acc.
    // ws[i]: row i's scales of blocks b, b + 1 per int32 lane (4 each).
    auto step = [&](int b, bool pair, const __m256* ws, __m256 (*acc)[NV]) FT_TARGET_AVX2 {
      __m256i lo[R], hi[R], wd[R][4];
      for (int i = 0; i < R; ++i) {
        const __m256i wv = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i] + 16 * b))
                                : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i] + 16 * b)));
        lo[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(wv, m));
        hi[i] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(wv, 4), m));
        wd[i][0] = _mm256_unpacklo_epi8(zero, lo[i]), wd[i][1] = _mm256_unpackhi_epi8(zero, lo[i]);
        wd[i][2] = _mm256_unpacklo_epi8(zero, hi[i]), wd[i][3] = _mm256_unpackhi_epi8(zero, hi[i]);
      }
      const size_t xo = static_cast<size_t>(b / 2) * kAvx2Record;
      for (int j = 0; j < NV; ++j) {
        const char* x = static_cast<const char*>(xs[j]) + xo;
        auto ld = [x](size_t o) FT_TARGET_AVX2 { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + o)); };
        int32_t flag;
        std::memcpy(&flag, x + kAvx2Flag, sizeof flag);
        const __m256 xsc = _mm256_loadu_ps(reinterpret_cast<const float*>(x + kAvx2Scale));
        for (int i = 0; i < R; ++i) {
          __m256i t = _mm256_add_epi32(
              _mm256_add_epi32(_mm256_madd_epi16(wd[i][0], ld(0)), _mm256_madd_epi16(wd[i][1], ld(32))),
              _mm256_add_epi32(_mm256_madd_epi16(wd[i][2], ld(64)), _mm256_madd_epi16(wd[i][3], ld(96))));
          if (__builtin_expect(flag != 0, 0)) {
            const __m256i u16 = _mm256_add_epi16(_mm256_maddubs_epi16(ld(kAvx2Lo), lo[i]),
                                                 _mm256_maddubs_epi16(ld(kAvx2Lo + 32), hi[i]));
            const __m256i u = _mm256_madd_epi16(u16, _mm256_set1_epi16(1));
            // t_hi + t_lo / 8, t_hi from the words w * 256: t_lo * 256 / 8, exactly in int32 (|t| <
            // 2^30, |32 u| < 2^15)
            t = _mm256_add_epi32(t, _mm256_slli_epi32(u, 5));
          }
          acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(ws[i], xsc), acc[i][j]);
        }
      }
    };
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
      __m256 ws0[R], ws1[R];
      for (int i = 0; i < R; ++i) {
        if (pw.dist) pw.ahead(w[i] + 16 * b);
        // The 4 blocks' scales at once (fp4::e8m0x4), spread over the lanes.
        const __m256 f = _mm256_castps128_ps256(fp4::e8m0x4(s[i] + b));
        ws0[i] = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        ws1[i] = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
      }
      step(b, true, ws0, a0);
      step(b + 2, true, ws1, two ? a1 : a0);
    }
    for (; b < nb; b += 2) {
      const bool pair = b + 1 < nb;
      __m256 ws[R];
      for (int i = 0; i < R; ++i) {
        if (pw.dist) pw.ahead(w[i] + 16 * b);
        ws[i] = _mm256_setr_m128(_mm_set1_ps(fp4::kE8m0.v[s[i][b]]),
                                 _mm_set1_ps(pair ? fp4::kE8m0.v[s[i][b + 1]] : 0.f));
      }
      step(b, pair, ws, a0);
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NV; ++j) out[j * os + r + i] = hsum8(two ? _mm256_add_ps(a0[i][j], a1[i][j]) : a0[i][j]);
  }
}

// The 32 integers x of block L of a record into its hi words and lo bytes (the order at the top): per 8
// elements their 4 even ones are 4 consecutive words (bytes), and so are the 4 odd ones. Returns
// whether any lo is non-zero.
FT_TARGET_AVX2 inline bool pack_block(const int32_t* x, int L, int16_t* hi, uint8_t* lo) {
  const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), zero = _mm256_setzero_si256();
  __m256i any = zero;
  for (int sub = 0; sub < 4; ++sub) {
    // evens | odds, then as int16 (|x >> 3| <= 28672): the evens' 4 words in the low 8 bytes of the
    // low half, the odds' in those of the high half.
    const __m256i v = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * sub)), perm);
    const __m256i l32 = _mm256_and_si256(v, _mm256_set1_epi32(7));
    any = _mm256_or_si256(any, l32);
    const __m256i h16 = _mm256_packs_epi32(_mm256_srai_epi32(v, 3), zero);
    const int we = 16 * (sub / 2) + 8 * L + 4 * (sub % 2), wo = we + 32;
    _mm_storel_epi64(reinterpret_cast<__m128i*>(hi + we), _mm256_castsi256_si128(h16));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(hi + wo), _mm256_extracti128_si256(h16, 1));
    // Elements 8 sub + 2i (even) and + 2i + 1 (odd), i < 4, are bytes 16L + 4 sub + i and 32 + the
    // same: the low bytes of l32's lanes i (evens) and 4 + i (odds).
    const __m256i l8 = _mm256_shuffle_epi8(l32, _mm256_set1_epi32(0x0c080400));
    const int be = 16 * L + 4 * sub;
    const int e4 = _mm_cvtsi128_si32(_mm256_castsi256_si128(l8)), o4 = _mm_cvtsi128_si32(_mm256_extracti128_si256(l8, 1));
    std::memcpy(lo + be, &e4, 4);
    std::memcpy(lo + 32 + be, &o4, 4);
  }
  return !_mm256_testz_si256(any, any);
}

// fp4_common.h's fp8_round_trip of v[0, n) (n a multiple of 8, blocks of `block` dividing 128 from
// v[0], n <= 128), bit for bit, 8 lanes at a time: q the round-tripped values, xi the e4m3 values
// times 2^9 (exact integers), s32[b] the scale of elements 32b .. 32b + 31. VMAXPS keeps the running
// max when an element is NaN (as std::max(amax, NaN) does), and VMINPS(448, r) keeps a NaN as
// std::min(r, 448) does.
FT_TARGET_AVX2 void round_trip_avx2(const float* v, int n, int block, float* q, int32_t* xi, float* s32) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int b0 = 0; b0 < n; b0 += block) {
    const int m = std::min(block, n - b0);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < m; i += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + b0 + i), absmask), mx);
    const float s = fp4::fp8_scale_of_amax(hmax8(mx));
    for (int i = b0; i < b0 + m; i += 32) s32[i / 32] = s;
    const __m256 inv = _mm256_set1_ps(1.f / s), sv = _mm256_set1_ps(s);
    for (int i = b0; i < b0 + m; i += 8) {
      const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(v + i), inv);
      const __m256 a = _mm256_and_ps(y, absmask);
      const __m256 small = _mm256_mul_ps(
          _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_set1_ps(1.f / 512.f));
      const __m256i ai = _mm256_castps_si256(a);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ai, 20), _mm256_set1_epi32(1));
      const __m256i big = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(ai, _mm256_set1_epi32(0x7ffff)), odd),
                                           _mm256_set1_epi32(~0xfffff));
      __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(big), small, _mm256_cmp_ps(a, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
      r = _mm256_min_ps(_mm256_set1_ps(448.f), r);
      r = _mm256_or_ps(r, _mm256_andnot_ps(absmask, y));  // copysign(r, y)
      _mm256_storeu_ps(q + i, _mm256_mul_ps(r, sv));
      if (xi) _mm256_storeu_si256(reinterpret_cast<__m256i*>(xi + i), _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(512.f))));
    }
  }
}
#endif

}  // namespace

bool avx2_round_trip(const float* v, int n, int block, float* q) {
#if FT_X86
  if (n % 8 != 0 || block % 8 != 0 || 128 % block != 0) return false;
  float s32[4];
  for (int g = 0; g < n; g += 128) round_trip_avx2(v + g, std::min(128, n - g), block, q + g, nullptr, s32);
  return true;
#else
  (void)v, (void)n, (void)block, (void)q;
  return false;
#endif
}

void avx2_int16_prep(Isa isa, const float* v, int i0, int i1, int block, void* out, void* fp32_out) {
#if FT_X86
  alignas(32) float q[128];
  alignas(32) int32_t xi[128];
  float s32[4] = {0.f, 0.f, 0.f, 0.f};
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);  // a multiple of 32 (ds_fp4's H and I)
    round_trip_avx2(v + (g - i0), n, block, q, xi, s32);
    // Records g / 64 and g / 64 + 1 (the second only if the vector reaches it).
    for (int h = 0; h < 2 && 64 * h < n; ++h) {
      char* rec = static_cast<char*>(out) + (g / 64 + h) * kAvx2Record;
      std::memset(rec, 0, kAvx2Record);
      int16_t* hi = reinterpret_cast<int16_t*>(rec);
      uint8_t* lo = reinterpret_cast<uint8_t*>(rec + kAvx2Lo);
      float* sc = reinterpret_cast<float*>(rec + kAvx2Scale);
      int32_t flag = 0;
      for (int L = 0; L < 2 && 64 * h + 32 * L < n; ++L) {
        const int e0 = 64 * h + 32 * L;
        for (int l = 0; l < 4; ++l) sc[4 * L + l] = s32[e0 / 32] * 0x1p-15f;
        flag |= pack_block(xi + e0, L, hi, lo) ? 1 : 0;
      }
      std::memcpy(rec + kAvx2Flag, &flag, sizeof flag);
    }
    if (fp32_out) fp4::prep_vec(isa, q, g, g + n, fp32_out);
  }
#else
  (void)isa, (void)v, (void)i0, (void)i1, (void)block, (void)out, (void)fp32_out;
  throw Error("ds_fp4 int16 kernels need x86");
#endif
}

void avx2_int16_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                               float* out, int os, int prefetch) {
  if (nrows <= 0 || n <= 0) return;
  n = std::min(n, fp4::kMaxVectors);
#if FT_X86
  const Prefetch pw(W, static_cast<size_t>(nrows) * (K / 2), prefetch);
  const Prefetch ps(S, static_cast<size_t>(nrows) * (K / 32), prefetch / 16);
  dispatch_n(n, [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    if constexpr (NV >= 3) {
      // rows two at a time, a last odd row alone
      const int even = nrows & ~1;
      rows<NV, 2>(W, S, even, xs, K, out, os, pw, ps);
      if (even < nrows) {
        rows<NV, 1>(W + static_cast<size_t>(even) * (K / 2), S + static_cast<size_t>(even) * (K / 32), 1, xs, K,
                    out + even, os, pw, ps);
      }
    } else {
      rows<NV, 1>(W, S, nrows, xs, K, out, os, pw, ps);
    }
  });
#else
  (void)W, (void)S, (void)xs, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("ds_fp4 int16 kernels need x86");
#endif
}

}  // namespace dsfp4
}  // namespace ft
