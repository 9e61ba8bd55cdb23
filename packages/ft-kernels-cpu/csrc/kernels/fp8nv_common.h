// Pieces shared by the fp8_block and nvfp4 formats: e4m3fn decoding (scalar and in registers), the
// software prefetch distance and stream type of their weight streams, and bank-row helpers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "common.h"
#include "dispatch_n.h"
#include "stream_prefetch.h"

namespace ft {
namespace fp8nv {

// e4m3fn: s eeee mmm, exponent bias 7, no infinities; 0x7f / 0xff are NaN (valid checkpoints never
// hold them; they decode as NaN here too).
inline float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if ((b & 0x7f) == 0x7f) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
  } else {
    v = std::ldexp(1.f + static_cast<float>(m) / 8.f, e - 7);
  }
  return (b & 0x80) ? -v : v;
}

// All 256 codes, decoded once.
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3_to_f32(static_cast<uint8_t>(i));
  }
};
inline const E4m3Table& e4m3_table() {
  static const E4m3Table t;
  return t;
}

// In registers, an e4m3fn byte becomes an fp16 bit pattern with the same sign, exponent and mantissa
// fields: sign to bit 15, eeeemmm to bits 13..7. As fp16 (bias 15, subnormals included) that is the
// e4m3 value times 2^-8, exactly; the hardware fp16 -> fp32 conversion finishes the job and the
// kernels multiply the factor 2^8 back once per dot product (a power of two: exact).
// From the sign-extended byte as int16 (bits 15..8 = s): (w << 7) puts s in bits 15 and 14 and the
// fields in 13..7; clearing bit 14 leaves the fp16 pattern.
constexpr float kE4m3Fp16Unscale = 256.f;
constexpr uint16_t kE4m3Fp16Mask = 0xBFFF;

// Software prefetch `dist` bytes ahead of a weight stream into L1 (stream_prefetch.h). Call ahead()
// once per 64-byte line read.
using Prefetch = StreamPrefetch<>;

constexpr int kMaxVectors = 8;  // MoeFormat::kMaxTokensPerCall

#if FT_X86


// 16 e4m3 bytes -> two vectors of 8 floats, each value times 2^-8.
FT_TARGET_AVX2 inline void e4m3x16_avx2(__m128i bytes, __m256& lo, __m256& hi) {
  __m256i w = _mm256_cvtepi8_epi16(bytes);
  w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(kE4m3Fp16Mask)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

// 16 e4m3 bytes -> 16 floats, each value times 2^-8.
FT_TARGET_AVX512 inline __m512 e4m3x16_avx512(__m128i bytes) {
  __m256i w = _mm256_cvtepi8_epi16(bytes);
  w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(kE4m3Fp16Mask)));
  return _mm512_cvtph_ps(w);
}

// The same with the NaN codes 0x7f / 0xff as NaN (the shift above makes them +-480 * 2^-8): for
// scales, where the two extra operations per 16 values do not matter.
FT_TARGET_AVX512 inline __m512 e4m3x16_nan_avx512(__m128i bytes) {
  const __m128i m = _mm_set1_epi8(0x7f);
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(bytes, m), m);
  return _mm512_mask_mov_ps(e4m3x16_avx512(bytes), nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}

// 32 e4m3 bytes -> two vectors of 16 floats, each value times 2^-8.
FT_TARGET_AVX512 inline void e4m3x32_avx512(__m256i bytes, __m512& lo, __m512& hi) {
  __m512i w = _mm512_cvtepi8_epi16(bytes);
  w = _mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16(static_cast<short>(kE4m3Fp16Mask)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(w));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1));
}

#endif  // FT_X86

}  // namespace fp8nv
}  // namespace ft
