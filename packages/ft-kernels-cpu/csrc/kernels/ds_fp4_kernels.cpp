// ds_fp4 row kernels of the avx512_bf16 tier and the preparation of their vectors (ds_fp4_kernels.h):
// bf16 and int16 kernels (below), int8 kernels (further down, after the int16 records).
//
// Both kernels decode a step of 4 blocks of 32 (64 bytes, one load) the same way: 3 VPSRLW + 4 VPERMW
// turn the nibbles into 4 vectors of 32 words (word m of vector j holds element 4m + j of the step),
// and then, per vector of the call:
//   bf16   the words are bf16 values; 4 VDPBF16PS, one chain from zero, sum the step into 16 fp32
//          lanes (lane l: elements 8l .. 8l + 7, block l / 4 only); one FMA applies the blocks' e8m0
//          scales. On Zen 5 VDPBF16PS runs on both FMA pipes; on the GPU machine's Xeon it costs ~2.5
//          cycles (docs/benchmarks.md), four or five FMAs.
//   int16  the words are 2 * e2m1 as int16, the vector int16 (layout below); 4 VPDPWSSD (two per
//          cycle on that Xeon) sum the step exactly into 16 int32 lanes, converted and scaled by one
//          multiply and one FMA. About 19 operations per 64 bytes for one vector (the 4 VPERMW are
//          two uops each), against ~25 for fp4_kernels.cpp's fp32 kernels.
// For n vectors the decoded words are shared. Every loop is unrolled over the vectors so that nothing
// of a step lives in memory; horizontal sums once per row. The e8m0 scales come 16 blocks at a time.
//
// The int16 vectors are exact: a round-tripped value is q * s with q an e4m3 value (a multiple of
// 2^-9, |q| <= 448) and s the power-of-two scale of its activation block, so x = q * 2^9 is an integer
// of up to 18 bits. The record of a step holds hi = x >> 3 (|hi| <= 28672, int16) for every element;
// x & 7 is non-zero only for |q| < 2^-3, values below 2^-11 of their block's largest, and a step
// holding any such element also carries lo = x & 7 and a flag, so that the kernels add 8 * hi . w +
// lo . w for it (a branch per step and vector that real activations rarely take).
#include "ds_fp4_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "amx_tiles.h"
#include "bf16_pairs.h"
#include "dispatch_n.h"
#include "fp4_avx512.h"
#include "fp4_common.h"
#include "reduce_n.h"
#include "stream_prefetch.h"

namespace ft {
namespace dsfp4 {

namespace {

using Prefetch = StreamPrefetch<PrefetchHint::L2>;  // as fp4_kernels.cpp (measured there)

// The int16 record of a step of 128 elements (int16_vec_bytes): words as the bf16 layout.
constexpr size_t kHi = 0;       // 4 x 32 int16 hi
constexpr size_t kScale = 256;  // 16 fp32 lanes: lane l = s * 2^-7 of elements 8l .. 8l + 7
constexpr size_t kFlag = 320;   // int32: non-zero if the step carries lo
constexpr size_t kLo = 384;     // 4 x 32 int16 lo (0 .. 7)
constexpr size_t kRecord = 640;

// The int8 record of a step (int8_dot_rows_multi): the integers X of its 128 elements in base-256
// digit planes, most significant first, each plane 64 bytes of the even elements' digits (byte k:
// element 2k, the low nibble of weight byte k) and 64 of the odd ones', then 16 int32 lanes
// -12 * (sum of X over elements 8l .. 8l + 7) and the number of planes. The steps come in groups of
// 4 followed by 16 fp32 lanes, lane b the unit of X in block 16g + b of the group times 1/2 (the
// weights are 2 * e2m1), so that 16 blocks take their weight scales in one multiply.
constexpr size_t kI8Plane = 128;
constexpr size_t kI8Corr = 3 * kI8Plane;
constexpr size_t kI8Planes = kI8Corr + 64;  // int32: 2 or 3
constexpr size_t kI8Record = 512;
constexpr size_t kI8Group = 4 * kI8Record + 64;
constexpr size_t i8_step_offset(size_t s) { return s / 4 * kI8Group + s % 4 * kI8Record; }
constexpr size_t i8_unit_offset(size_t s) { return s / 4 * kI8Group + 4 * kI8Record; }

#if FT_X86

// ---- the fp8 e4m3 round trip, 128 elements at a time ----

// One step of n <= 128 elements of v in activation blocks of `block` (a multiple of 16 dividing 128)
// from v[0]: r[i] holds the e4m3 values (v / s rounded, signed, as fp32) of elements 16i .. 16i + 15,
// zero past n; s[i] their block's scale (fp4_common.h's fp8_round_trip, bit for bit).
FT_TARGET_AVX512 void e4m3_step(const float* v, int n, int block, __m512* r, float* s) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 small = _mm512_set1_ps(0.015625f), sat = _mm512_set1_ps(448.f);
  for (int b0 = 0; b0 < 128; b0 += block) {
    const int m = std::clamp(n - b0, 0, block);
    if (m == 0) {
      for (int i = b0 / 16; i < (b0 + block) / 16; ++i) r[i] = _mm512_setzero_ps(), s[i] = 0.f;
      continue;
    }
    auto mask = [&](int i) {
      return m - i >= 16 ? static_cast<__mmask16>(0xffff) : m > i ? static_cast<__mmask16>((1u << (m - i)) - 1u) : 0;
    };
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < m; i += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_maskz_loadu_ps(mask(i), v + b0 + i), absmask));
    // The scale exactly as fp8_round_trip.
    const float sc = fp4::fp8_scale_of_amax(_mm512_reduce_max_ps(mx));
    // v / s == v * (1 / s) exactly: s is a power of two within the normal range, so is 1 / s.
    const __m512 inv = _mm512_set1_ps(1.f / sc);
    for (int i = 0; i < block; i += 16) {
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask(i), v + b0 + i), inv);
      const __m512 a = _mm512_and_ps(y, absmask);
      // Below 2^-6: multiples of 2^-9, nearest even (ROUNDSCALE keeping 9 fraction bits). Above:
      // 3 mantissa bits, nearest even, by the integer carry of fp8_round_trip.
      const __m512 r_small = _mm512_roundscale_ps(a, (9 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i ai = _mm512_castps_si512(a);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(ai, 20), _mm512_set1_epi32(1));
      const __m512i big = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ai, _mm512_set1_epi32(0x7ffff)), odd),
                                           _mm512_set1_epi32(~0xfffff));
      __m512 q = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, small, _CMP_LT_OQ), _mm512_castsi512_ps(big), r_small);
      q = _mm512_min_ps(q, sat);
      r[(b0 + i) / 16] = _mm512_or_ps(q, _mm512_andnot_ps(absmask, y));  // copysign(q, y)
      s[(b0 + i) / 16] = sc;
    }
  }
}

// The word layout of 128 elements, element e in lane e % 16 of v[e / 16] (the low word of each dword,
// or the high one): out + 32j + k = element 4k + j. Per pair of v one VPERMT2W puts the 8 words k of
// each j in 128-bit lane j; a 4 x 4 transpose of those lanes makes the 4 vectors.
template <bool High>
FT_TARGET_AVX512 void store_words(const __m512i* v, uint16_t* out) {
  alignas(64) uint16_t idx[32];
  for (int j = 0; j < 4; ++j) {
    for (int k = 0; k < 8; ++k) idx[8 * j + k] = static_cast<uint16_t>(2 * (4 * k + j) + (High ? 1 : 0));
  }
  const __m512i ix = _mm512_load_si512(idx);
  __m512i p[4];
  for (int q = 0; q < 4; ++q) p[q] = _mm512_permutex2var_epi16(v[2 * q], ix, v[2 * q + 1]);
  const __m512i t0 = _mm512_shuffle_i64x2(p[0], p[1], 0x44), t1 = _mm512_shuffle_i64x2(p[0], p[1], 0xee);
  const __m512i t2 = _mm512_shuffle_i64x2(p[2], p[3], 0x44), t3 = _mm512_shuffle_i64x2(p[2], p[3], 0xee);
  _mm512_storeu_si512(out, _mm512_shuffle_i64x2(t0, t2, 0x88));
  _mm512_storeu_si512(out + 32, _mm512_shuffle_i64x2(t0, t2, 0xdd));
  _mm512_storeu_si512(out + 64, _mm512_shuffle_i64x2(t1, t3, 0x88));
  _mm512_storeu_si512(out + 96, _mm512_shuffle_i64x2(t1, t3, 0xdd));
}

// The round-tripped values q * s of r, s (e4m3_step) in the bf16 layout: the top half of their fp32
// bits, exact.
FT_TARGET_AVX512 void store_bf16(const __m512* r, const float* s, uint16_t* out) {
  __m512i q[8];
  for (int i = 0; i < 8; ++i) q[i] = _mm512_castps_si512(_mm512_mul_ps(r[i], _mm512_set1_ps(s[i])));
  store_words<true>(q, out);
}

// The int16 record of r, s (e4m3_step).
FT_TARGET_AVX512 void store_int16(const __m512* r, const float* s, char* rec) {
  __m512i hi[8], lo[8];
  __m512i any = _mm512_setzero_si512();
  for (int i = 0; i < 8; ++i) {
    const __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(r[i], _mm512_set1_ps(512.f)));  // exact integers
    hi[i] = _mm512_srai_epi32(x, 3);
    lo[i] = _mm512_and_si512(x, _mm512_set1_epi32(7));
    any = _mm512_or_si512(any, lo[i]);
  }
  store_words<false>(hi, reinterpret_cast<uint16_t*>(rec + kHi));
  float* sl = reinterpret_cast<float*>(rec + kScale);
  for (int l = 0; l < 16; ++l) sl[l] = s[l / 2] * 0x1p-7f;
  const int32_t flag = _mm512_test_epi32_mask(any, any) != 0;
  std::memcpy(rec + kFlag, &flag, sizeof flag);
  if (flag) {
    store_words<false>(lo, reinterpret_cast<uint16_t*>(rec + kLo));
  } else {
    std::memset(rec + kLo, 0, kRecord - kLo);  // never read; defined anyway
  }
}

// VPERMT2B indices of the even and the odd bytes of two vectors.
struct EvenOdd {
  alignas(64) uint8_t even[64];
  alignas(64) uint8_t odd[64];
  constexpr EvenOdd() : even(), odd() {
    for (int k = 0; k < 64; ++k) even[k] = static_cast<uint8_t>(2 * k), odd[k] = static_cast<uint8_t>(2 * k + 1);
  }
};
constexpr EvenOdd kEvenOdd{};

// The int8 record of r, s (e4m3_step) as step st of the vector at vec. X = q * 2^9 (|X| < 2^18);
// when every X of the step is a multiple of 8 (no e4m3 value below 2^-3 of its scale: 2^-11 of the
// block's largest), the record holds X / 8 in two planes (|X / 8| <= 28672), else X in three.
// Digits are signed bytes: d0 = X's low byte sign-extended, X1 = (X - d0) / 256, and so on.
FT_TARGET_AVX512_BF16 void store_int8(const __m512* r, const float* s, char* vec, size_t st) {
  __m512i x[8];
  __m512i any = _mm512_setzero_si512();
  for (int i = 0; i < 8; ++i) {
    x[i] = _mm512_cvtps_epi32(_mm512_mul_ps(r[i], _mm512_set1_ps(512.f)));  // exact integers
    any = _mm512_or_si512(any, x[i]);
  }
  const bool three = _mm512_test_epi32_mask(any, _mm512_set1_epi32(7)) != 0;
  const int planes = three ? 3 : 2;
  alignas(64) int8_t digits[3][128];  // natural element order, most significant plane first
  for (int i = 0; i < 8; ++i) {
    const __m512i v = three ? x[i] : _mm512_srai_epi32(x[i], 3);
    const __m512i d0 = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
    const __m512i v1 = _mm512_srai_epi32(_mm512_sub_epi32(v, d0), 8);
    const __m512i d1 = _mm512_srai_epi32(_mm512_slli_epi32(v1, 24), 24);
    const __m512i d2 = _mm512_srai_epi32(_mm512_sub_epi32(v1, d1), 8);  // 0 with two planes
    const __m512i d[3] = {d2, d1, d0};
    for (int p = 0; p < planes; ++p) {
      _mm_store_si128(reinterpret_cast<__m128i*>(digits[p] + 16 * i), _mm512_cvtepi32_epi8(d[p + 3 - planes]));
    }
  }
  const __m512i ie = _mm512_load_si512(kEvenOdd.even), io = _mm512_load_si512(kEvenOdd.odd);
  // The lanes' sums of X by the kernels' own chain with 12 for every weight.
  const __m512i twelve = _mm512_set1_epi8(12);
  char* rec = vec + i8_step_offset(st);
  __m512i t = _mm512_setzero_si512();
  for (int p = 0; p < planes; ++p) {
    const __m512i a = _mm512_load_si512(digits[p]), b = _mm512_load_si512(digits[p] + 64);
    const __m512i e = _mm512_permutex2var_epi8(a, ie, b), o = _mm512_permutex2var_epi8(a, io, b);
    _mm512_storeu_si512(rec + p * kI8Plane, e);
    _mm512_storeu_si512(rec + p * kI8Plane + 64, o);
    if (p > 0) t = _mm512_slli_epi32(t, 8);
    t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, twelve, e), twelve, o);
  }
  _mm512_storeu_si512(rec + kI8Corr, _mm512_sub_epi32(_mm512_setzero_si512(), t));
  std::memcpy(rec + kI8Planes, &planes, sizeof planes);
  float* unit = reinterpret_cast<float*>(vec + i8_unit_offset(st)) + 4 * (st % 4);
  for (int b = 0; b < 4; ++b) unit[b] = s[2 * b] * (three ? 0x1p-10f : 0x1p-7f);
}

// fp8_round_trip for the avx512 tiers (blocks of 16 .. 128 dividing 128).
FT_TARGET_AVX512 void round_trip_avx512(const float* v, int n, int block, float* q) {
  __m512 r[8];
  float s[8];
  for (int g = 0; g < n; g += 128) {
    const int m = std::min(128, n - g);
    e4m3_step(v + g, m, block, r, s);
    for (int i = 0; 16 * i < m; ++i) {
      const __mmask16 k =
          m - 16 * i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (m - 16 * i)) - 1u);
      _mm512_mask_storeu_ps(q + g + 16 * i, k, _mm512_mul_ps(r[i], _mm512_set1_ps(s[i])));
    }
  }
}

// fp8_prep (ds_fp4_kernels.h).
FT_TARGET_AVX512 void prep_avx512(const float* v, int i0, int i1, int block, void* int16_out, void* bf16_out) {
  __m512 r[8];
  float s[8];
  for (int g = i0; g < i1; g += 128) {
    e4m3_step(v + (g - i0), std::min(128, i1 - g), block, r, s);
    if (int16_out) store_int16(r, s, static_cast<char*>(int16_out) + g / 128 * kRecord);
    if (bf16_out) store_bf16(r, s, static_cast<uint16_t*>(bf16_out) + g);
  }
}

// int8_prep (ds_fp4_kernels.h).
FT_TARGET_AVX512_BF16 void prep_int8_avx512(const float* v, int i0, int i1, int K, int block, void* int8_out,
                                            void* bf16_out) {
  __m512 r[8];
  float s[8];
  char* vec = static_cast<char*>(int8_out);
  for (int g = i0; g < i1; g += 128) {
    e4m3_step(v + (g - i0), std::min(128, i1 - g), block, r, s);
    store_int8(r, s, vec, static_cast<size_t>(g) / 128);
    if (bf16_out) store_bf16(r, s, static_cast<uint16_t*>(bf16_out) + g);
  }
  // The group's units past the vector's last step: never used, defined anyway.
  const size_t steps = (static_cast<size_t>(K) + 127) / 128;
  if (i1 == K && steps % 4) {
    float* unit = reinterpret_cast<float*>(vec + i8_unit_offset(steps - 1));
    std::fill(unit + 4 * (steps % 4), unit + 16, 0.f);
  }
}

// bf16_layout (ds_fp4_kernels.h).
FT_TARGET_AVX512 void bf16_layout_avx512(const float* q, int i0, int i1, uint16_t* out) {
  for (int g = i0; g < i1; g += 128) {
    const int n = std::min(128, i1 - g);
    __m512i v[8];
    for (int i = 0; i < 8; ++i) {
      const int m = std::clamp(n - 16 * i, 0, 16);
      v[i] = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << m) - 1u), q + (g - i0) + 16 * i);
    }
    store_words<true>(v, out + g);
  }
}

// ---- row kernels ----

// One step of 4 blocks of the bf16 kernels: x in the bf16 layout, xo its word offset.
struct Bf16Step {
  static uint16_t word(float v) { return f32_to_bf16(v); }
  template <int NV>
  FT_TARGET_AVX512_BF16 static inline void run(const __m512i* wd, __m512 sc, const void* const* xs, int st,
                                               __m512* acc) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const uint16_t* x = static_cast<const uint16_t*>(xs[j]) + 128 * st;
      __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)wd[0], (__m512bh)_mm512_loadu_si512(x));
      t = _mm512_dpbf16_ps(t, (__m512bh)wd[1], (__m512bh)_mm512_loadu_si512(x + 32));
      t = _mm512_dpbf16_ps(t, (__m512bh)wd[2], (__m512bh)_mm512_loadu_si512(x + 64));
      t = _mm512_dpbf16_ps(t, (__m512bh)wd[3], (__m512bh)_mm512_loadu_si512(x + 96));
      acc[j] = _mm512_fmadd_ps(t, sc, acc[j]);
    }
  }
};

// One step of the int16 kernels: x as int16 records (kRecord bytes a step).
struct Int16Step {
  static uint16_t word(float v) { return static_cast<uint16_t>(static_cast<int16_t>(2.f * v)); }
  template <int NV>
  FT_TARGET_AVX512_BF16 static inline void run(const __m512i* wd, __m512 sc, const void* const* xs, int st,
                                               __m512* acc) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const char* rec = static_cast<const char*>(xs[j]) + kRecord * st;
      __m512i t = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wd[0], _mm512_loadu_si512(rec + kHi));
      t = _mm512_dpwssd_epi32(t, wd[1], _mm512_loadu_si512(rec + kHi + 64));
      t = _mm512_dpwssd_epi32(t, wd[2], _mm512_loadu_si512(rec + kHi + 128));
      t = _mm512_dpwssd_epi32(t, wd[3], _mm512_loadu_si512(rec + kHi + 192));
      __m512 f;
      if (__builtin_expect(*reinterpret_cast<const int32_t*>(rec + kFlag) != 0, 0)) {
        t = _mm512_slli_epi32(t, 3);
        t = _mm512_dpwssd_epi32(t, wd[0], _mm512_loadu_si512(rec + kLo));
        t = _mm512_dpwssd_epi32(t, wd[1], _mm512_loadu_si512(rec + kLo + 64));
        t = _mm512_dpwssd_epi32(t, wd[2], _mm512_loadu_si512(rec + kLo + 128));
        t = _mm512_dpwssd_epi32(t, wd[3], _mm512_loadu_si512(rec + kLo + 192));
        f = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(0.125f));
      } else {
        f = _mm512_cvtepi32_ps(t);
      }
      acc[j] = _mm512_fmadd_ps(f, _mm512_mul_ps(sc, _mm512_loadu_ps(reinterpret_cast<const float*>(rec + kScale))),
                               acc[j]);
    }
  }
};

// The 4 blocks at w (`blocks` of them, zeros after) decoded to words through lut, step st of every vector.
template <class Step, int NV>
FT_TARGET_AVX512_BF16 inline void step(const uint8_t* w, int blocks, __m512 sc, const void* const* xs, int st,
                                       __m512i lut, __m512* acc) {
  const __m512i wv = fp4::load_blocks(w, blocks);
  const __m512i wd[4] = {_mm512_permutexvar_epi16(wv, lut), _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut),
                         _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut),
                         _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut)};
  Step::template run<NV>(wd, sc, xs, st, acc);
}

template <class Step, int NV>
FT_TARGET_AVX512_BF16 void rows(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int K,
                                float* out, int os, const Prefetch& pw, const Prefetch& ps) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) table[i] = Step::word(fp4::kE2m1[i & 15]);  // index bit 4 ignored
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
      const int st = b / 4;
      step<Step, NV>(wp, 4, _mm512_permutexvar_ps(idx0, sf), xs, st, lut, a0);
      step<Step, NV>(wp + 64, 4, _mm512_permutexvar_ps(idx1, sf), xs, st + 1, lut, two ? a1 : a0);
      step<Step, NV>(wp + 128, 4, _mm512_permutexvar_ps(idx2, sf), xs, st + 2, lut, a0);
      step<Step, NV>(wp + 192, 4, _mm512_permutexvar_ps(idx3, sf), xs, st + 3, lut, two ? a1 : a0);
    }
    if (b < nb) {
      const __m512 sf = fp4::e8m0x16(s + b, nb - b);
      const __m512i idx[4] = {idx0, idx1, idx2, idx3};
      for (int u = 0; b + 4 * u < nb; ++u) {
        const int bu = b + 4 * u;
        if (pw.dist) pw.ahead(w + 16 * bu);
        // a0 only: a runtime choice of array would keep both in memory (a1 is for the latency of
        // the main loop).
        step<Step, NV>(w + 16 * bu, nb - bu, _mm512_permutexvar_ps(idx[u], sf), xs, bu / 4, lut, a0);
      }
    }
    if constexpr (two) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) a0[j] = _mm512_add_ps(a0[j], a1[j]);
    }
    reduce_store_n<NV>(a0, out + r, os);
  }
}

// Two rows of the bf16 kernels at once, from 3 vectors on, for rows long enough (dot_rows_with): each
// vector's 4 lines of a step are loaded once for both rows. Zen 4 loads one 512-bit line a cycle and
// runs VDPBF16PS at about one a cycle, and one row spent 4 loads on 4 products per vector
// (docs/benchmarks.md, fourteenth session). Each row's sums are rows<Bf16Step, NV>'s: the same
// products in the same order, so results do not depend on how rows pair up.
FT_TARGET_AVX512_BF16 inline void decode_step(const uint8_t* w, int blocks, __m512i lut, __m512i* wd) {
  const __m512i wv = fp4::load_blocks(w, blocks);
  wd[0] = _mm512_permutexvar_epi16(wv, lut);
  wd[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut);
  wd[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut);
  wd[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut);
}

template <int NV>
FT_TARGET_AVX512_BF16 inline void step_bf16_pair(const uint8_t* w0, const uint8_t* w1, int blocks, __m512 sc0,
                                                 __m512 sc1, const void* const* xs, int st, __m512i lut,
                                                 __m512* acc0, __m512* acc1) {
  __m512i wd0[4], wd1[4];
  decode_step(w0, blocks, lut, wd0);
  decode_step(w1, blocks, lut, wd1);
  dot128_pair_bf16<NV>(wd0, wd1, sc0, sc1, xs, 128 * static_cast<size_t>(st), acc0, acc1);
}

template <int NV>
FT_TARGET_AVX512_BF16 void rows_bf16_pairs(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs,
                                           int K, float* out, int os, const Prefetch& pw, const Prefetch& ps) {
  static_assert(NV >= 3, "rows<Bf16Step, NV> keeps two accumulator sets below 3 vectors");
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) table[i] = Bf16Step::word(fp4::kE2m1[i & 15]);
  const __m512i lut = _mm512_load_si512(table);
  const int nb = K / 32;
  const size_t wrow = K / 2;
  int r = 0;
  for (; r + 2 <= nrows; r += 2) {
    const uint8_t* w0 = W + static_cast<size_t>(r) * wrow;
    const uint8_t* w1 = w0 + wrow;
    const uint8_t* s0 = S + static_cast<size_t>(r) * nb;
    const uint8_t* s1 = s0 + nb;
    if (ps.dist) {
      ps.ahead(s0);
      ps.ahead(s1);
    }
    __m512 a0[NV], a1[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 16 <= nb; b += 16) {
      const __m512 sf0 = fp4::e8m0x16(s0 + b, 16), sf1 = fp4::e8m0x16(s1 + b, 16);
      if (pw.dist) {
        for (int o = 0; o < 256; o += 64) {
          pw.ahead(w0 + 16 * b + o);
          pw.ahead(w1 + 16 * b + o);
        }
      }
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const __m512i idx = fp4::scale_index(u);
        step_bf16_pair<NV>(w0 + 16 * b + 64 * u, w1 + 16 * b + 64 * u, 4, _mm512_permutexvar_ps(idx, sf0),
                           _mm512_permutexvar_ps(idx, sf1), xs, b / 4 + u, lut, a0, a1);
      }
    }
    if (b < nb) {
      const __m512 sf0 = fp4::e8m0x16(s0 + b, nb - b), sf1 = fp4::e8m0x16(s1 + b, nb - b);
      for (int u = 0; b + 4 * u < nb; ++u) {
        const int bu = b + 4 * u;
        if (pw.dist) {
          pw.ahead(w0 + 16 * bu);
          pw.ahead(w1 + 16 * bu);
        }
        const __m512i idx = fp4::scale_index(u);
        step_bf16_pair<NV>(w0 + 16 * bu, w1 + 16 * bu, nb - bu, _mm512_permutexvar_ps(idx, sf0),
                           _mm512_permutexvar_ps(idx, sf1), xs, bu / 4, lut, a0, a1);
      }
    }
    reduce_store_n<NV>(a0, out + r, os);
    reduce_store_n<NV>(a1, out + r + 1, os);
  }
  if (r < nrows) {
    rows<Bf16Step, NV>(W + static_cast<size_t>(r) * wrow, S + static_cast<size_t>(r) * nb, 1, xs, K, out + r, os,
                       pw, ps);
  }
}

// ---- int8 kernels: VPDPBUSD over the digit planes ----
//
// A step's weights are looked up as mxfp4's int8 kernels do (fp4_avx512.h's e2m1_u8_table: one
// VPERMB per nibble, 12 + 2 * e2m1 unsigned). Per vector each plane's VPDPBUSD pair is a chain of
// its own, the least significant one starting from the record's offset lanes; the chains are
// combined by shifts of 8 and adds (with three planes the top two share one chain, which saves an
// add). The lanes then hold 2 * e2m1 . X exactly (|sum| < 2^25; a lane past 2^24 rounds once in the
// conversion, as an fp32 sum would). One conversion and one FMA per step, the units times the
// blocks' scales 16 blocks at a time. Per 64 bytes of weights and one vector: 2 VPERMB, a shift and
// a VPERMPS, and 4 VPDPBUSD, a shift, an add, a conversion and an FMA with two planes (12), 15 with
// three.

// One plane of a step: t + the lanes' sums of the weights lo (even elements), hi (odd) times its digits.
FT_TARGET_AVX512_BF16 inline __m512i i8_plane(__m512i t, __m512i lo, __m512i hi, const char* p) {
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, lo, _mm512_loadu_si512(p)), hi, _mm512_loadu_si512(p + 64));
}

// One step of NV vectors: sx[j] the group's units times the weight scales of vector j, permuted to
// the step's lanes by idx (in the loop, so that 8 vectors need no array of them).
template <int NV>
FT_TARGET_AVX512_BF16 inline void step_i8(const uint8_t* w, int blocks, const __m512* sx, __m512i idx,
                                          const void* const* xs, size_t xo, __m512i lut, __m512* acc) {
  __m512i wv = fp4::load_blocks(w, blocks);
  FT_IN_REGISTER(wv);
  const __m512i lo = _mm512_permutexvar_epi8(wv, lut);
  const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(wv, 4), lut);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const char* rec = static_cast<const char*>(xs[j]) + xo;
    const __m512i t_zero = _mm512_setzero_si512();
    __m512i t;
    if (*reinterpret_cast<const int32_t*>(rec + kI8Planes) == 3) {
      const __m512i t21 = i8_plane(_mm512_slli_epi32(i8_plane(t_zero, lo, hi, rec), 8), lo, hi, rec + kI8Plane);
      const __m512i t0 = i8_plane(_mm512_loadu_si512(rec + kI8Corr), lo, hi, rec + 2 * kI8Plane);
      t = _mm512_add_epi32(_mm512_slli_epi32(t21, 8), t0);
    } else {
      const __m512i t1 = i8_plane(t_zero, lo, hi, rec);
      const __m512i t0 = i8_plane(_mm512_loadu_si512(rec + kI8Corr), lo, hi, rec + kI8Plane);
      t = _mm512_add_epi32(_mm512_slli_epi32(t1, 8), t0);
    }
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_permutexvar_ps(idx, sx[j]), acc[j]);
  }
}

// Normal: every scale of the call in [1, 254] (fp4::e8m0_all_normal; fp4::e8m0x16_normal).
template <int NV, bool Normal>
FT_TARGET_AVX512_BF16 void rows_i8(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int K,
                                   float* out, int os, const Prefetch& pw, const Prefetch& ps) {
  const __m512i lut = fp4::e2m1_u8_table();
  const __m512i idx[4] = {fp4::scale_index(0), fp4::scale_index(1), fp4::scale_index(2), fp4::scale_index(3)};
  const int nb = K / 32;
  // Two accumulator chains per vector for n <= 2 (the FMA latency); from 3 vectors on the vectors
  // themselves are enough independent chains, and one set leaves registers for the rest (with two
  // sets of 8 vectors spilling, batch 8 shared on int8 alone took 3903 us a step on the dev box,
  // with one 3572-3711; docs/benchmarks.md).
  constexpr bool two = NV <= 2;
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + static_cast<size_t>(r) * (K / 2);
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    if (ps.dist) ps.ahead(s);
    __m512 a0[NV], a1[NV], sx[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 16) {
      const __m512 sf = fp4::e8m0x16_as<Normal>(s + b, std::min(16, nb - b));
      const size_t go = static_cast<size_t>(b) / 16 * kI8Group;  // the group's records
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        sx[j] = _mm512_mul_ps(sf, _mm512_loadu_ps(reinterpret_cast<const float*>(static_cast<const char*>(xs[j]) +
                                                                                  go + 4 * kI8Record)));
      }
      if (b + 16 <= nb) {
        const uint8_t* wp = w + 16 * b;
        if (pw.dist) {
          pw.ahead(wp);
          pw.ahead(wp + 64);
          pw.ahead(wp + 128);
          pw.ahead(wp + 192);
        }
#pragma GCC unroll 2
        for (int u = 0; u < 4; u += 2) {
          step_i8<NV>(wp + 64 * u, 4, sx, idx[u], xs, go + u * kI8Record, lut, a0);
          step_i8<NV>(wp + 64 * (u + 1), 4, sx, idx[u + 1], xs, go + (u + 1) * kI8Record, lut, two ? a1 : a0);
        }
      } else {
        using Last = fp4::LastGroupStep<&step_i8<NV>, kI8Record, const void* const*, Prefetch>;
        fp4::last_group_steps<0>(nb - b, Last{w + 16 * b, sx, idx, xs, go, lut, a0, pw});
      }
    }
    if constexpr (two) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) a0[j] = _mm512_add_ps(a0[j], a1[j]);
    }
    reduce_store_n<NV>(a0, out + r, os);
  }
}

struct Int8Step {};  // dot_rows_with's tag for rows_i8

// The streams of a call and its vector count as a template argument: rows<Step, NV> (bf16, int16),
// rows_i8<NV, Normal> for Int8Step.
template <class Step>
void dot_rows_with(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, float* out,
                   int os, int prefetch) {
  if (nrows <= 0 || n <= 0) return;
  n = std::min(n, fp4::kMaxVectors);
  const Prefetch pw(W, static_cast<size_t>(nrows) * (K / 2), prefetch);
  const Prefetch ps(S, static_cast<size_t>(nrows) * (K / 32), prefetch / 16);
  // rows_bf16_pairs where rows are long enough: twice multirow's bytes. On the 2-core Zen 5 (2 threads,
  // batch 8 shared, us a step) the pairs lost from DRAM on rows of 1024 bytes (qwen3-30b-a3b's gate/up
  // rows: 2160 against 1789 one row at a time) and of 1440 (gpt-oss-120b: 6878 against 5958), and
  // tied from cache (248 against 248, one core, one expert); fp8_block's pairs, which share the same
  // step, gained on its rows of 2048 (docs/benchmarks.md, twenty-fourth session).
  const bool pairs = multirow(static_cast<size_t>(K) / 4, n);
  dispatch_n(n, [&](auto nv) {
    if constexpr (std::is_same_v<Step, Int8Step>) {
      if (fp4::e8m0_all_normal(S, static_cast<size_t>(nrows) * (K / 32))) {
        rows_i8<decltype(nv)::value, true>(W, S, nrows, xs, K, out, os, pw, ps);
      } else {
        rows_i8<decltype(nv)::value, false>(W, S, nrows, xs, K, out, os, pw, ps);
      }
    } else if constexpr (std::is_same_v<Step, Bf16Step> && decltype(nv)::value >= 3) {
      if (pairs) {
        rows_bf16_pairs<decltype(nv)::value>(W, S, nrows, xs, K, out, os, pw, ps);
      } else {
        rows<Step, decltype(nv)::value>(W, S, nrows, xs, K, out, os, pw, ps);
      }
    } else {
      rows<Step, decltype(nv)::value>(W, S, nrows, xs, K, out, os, pw, ps);
    }
  });
}

#endif  // FT_X86

}  // namespace

void fp8_round_trip(Isa isa, const float* v, int n, int block, float* q) {
#if FT_X86
  if (isa >= Isa::avx512 && block % 16 == 0 && 128 % block == 0) {
    round_trip_avx512(v, n, block, q);
    return;
  }
  if (isa == Isa::avx2 && avx2_round_trip(v, n, block, q)) return;
#else
  (void)isa;
#endif
  fp4::fp8_round_trip(v, n, block, q);
}

size_t vec_bytes(int K) { return (static_cast<size_t>(K) + 127) / 128 * 128 * sizeof(uint16_t); }
size_t int16_vec_bytes(int K) { return (static_cast<size_t>(K) + 127) / 128 * kRecord; }
size_t int8_vec_bytes(int K) { return (static_cast<size_t>(K) + 511) / 512 * kI8Group; }

void bf16_layout(const float* q, int i0, int i1, void* out) {
#if FT_X86
  bf16_layout_avx512(q, i0, i1, static_cast<uint16_t*>(out));
#else
  (void)q, (void)i0, (void)i1, (void)out;
  throw Error("ds_fp4 AMX kernels need x86");
#endif
}

void fp8_prep(const float* v, int i0, int i1, int block, void* int16_out, void* bf16_out) {
#if FT_X86
  prep_avx512(v, i0, i1, block, int16_out, bf16_out);
#else
  (void)v, (void)i0, (void)i1, (void)block, (void)int16_out, (void)bf16_out;
  throw Error("ds_fp4 bf16 and int16 kernels need x86");
#endif
}

void int8_prep(const float* v, int i0, int i1, int K, int block, void* int8_out, void* bf16_out) {
#if FT_X86
  prep_int8_avx512(v, i0, i1, K, block, int8_out, bf16_out);
#else
  (void)v, (void)i0, (void)i1, (void)K, (void)block, (void)int8_out, (void)bf16_out;
  throw Error("ds_fp4 int8 kernels need x86");
#endif
}

void int8_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                         float* out, int os, int prefetch) {
#if FT_X86
  dot_rows_with<Int8Step>(W, S, nrows, xs, n, K, out, os, prefetch);
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("ds_fp4 int8 kernels need x86");
#endif
}

Kernels choose_kernels(Isa isa) {
  const std::string v = amx::kernel_choice(
      "FT_CPU_MOE_DSFP4_KERNELS", isa,
      {{"fp32", Isa::scalar},
       {"bf16", Isa::avx512_bf16},
       {"int16", Isa::avx2},
       {"int8", Isa::avx512_bf16},
       {"amx", Isa::avx512_bf16},
       {"q8", Isa::avx2}},
      "auto, fp32, bf16, int16, int8, amx or q8");
  if (v == "auto") return isa >= Isa::avx2 ? Kernels::q8 : Kernels::fp32;
  for (Kernels k : {Kernels::bf16, Kernels::int16, Kernels::int8, Kernels::amx, Kernels::q8}) {
    if (v == kernels_name(k)) return k;
  }
  return Kernels::fp32;
}

const char* kernels_name(Kernels k) {
  switch (k) {
    case Kernels::bf16: return "bf16";
    case Kernels::int16: return "int16";
    case Kernels::int8: return "int8";
    case Kernels::amx: return "amx";
    case Kernels::q8: return "q8";
    case Kernels::fp32: break;
  }
  return "fp32";
}

void dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, float* out,
                    int os, int prefetch) {
#if FT_X86
  dot_rows_with<Bf16Step>(W, S, nrows, xs, n, K, out, os, prefetch);
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("ds_fp4 bf16 kernels need x86");
#endif
}

void int16_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                          float* out, int os, int prefetch) {
#if FT_X86
  dot_rows_with<Int16Step>(W, S, nrows, xs, n, K, out, os, prefetch);
#else
  (void)W, (void)S, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)os, (void)prefetch;
  throw Error("ds_fp4 int16 kernels need x86");
#endif
}

}  // namespace dsfp4
}  // namespace ft
