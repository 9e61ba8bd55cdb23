// int8_codes (int8_codes.h): scalar and AVX2.
#include "int8_codes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "avx2_pairs.h"

namespace ft {

namespace {

// The int8 code of one element: v * inv rounded half to even, clamped to +-127 (|v * inv| <= 127 up
// to rounding; a NaN becomes 127).
inline int8_t q8_code(float v, float inv) {
  return static_cast<int8_t>(std::max(-127.f, std::min(127.f, round_even_small(v * inv))));
}

// int8_codes in scalar code.
float q8_codes_scalar(const float* v, int n, int8_t* c) {
  float amax = 0.f;
  for (int e = 0; e < n; ++e) amax = std::max(amax, std::fabs(v[e]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int e = 0; e < n; ++e) c[e] = q8_code(v[e], inv);
  return amax;
}

#if FT_X86
// The same, 8 lanes at a time, bit for bit: VMAXPS returns its second operand when the first is NaN
// (std::max(amax, NaN) keeps amax), VROUNDPS rounds the product half to even as round_even_small
// does, and VMINPS(r, 127) makes a NaN 127 as std::min(127, r) does. (mxfp4's prep of x was ~6 us
// of a decode step on the GPU machine's Xeon in scalar code.)
FT_TARGET_AVX2 float q8_codes_avx2(const float* v, int n, int8_t* c) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  int e = 0;
  for (; e + 8 <= n; e += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + e), absmask), mx);
  float amax = hmax8(mx);
  for (; e < n; ++e) amax = std::max(amax, std::fabs(v[e]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const __m256 iv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  alignas(32) int32_t ci[8];
  for (e = 0; e + 8 <= n; e += 8) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + e), iv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ci),
                       _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo)));
    for (int j = 0; j < 8; ++j) c[e + j] = static_cast<int8_t>(ci[j]);
  }
  for (; e < n; ++e) c[e] = q8_code(v[e], inv);
  return amax;
}
#endif

}  // namespace

float int8_codes(const float* v, int n, int8_t* c, bool simd) {
#if FT_X86
  if (simd) return q8_codes_avx2(v, n, c);
#else
  (void)simd;
#endif
  return q8_codes_scalar(v, n, c);
}

#if FT_X86
namespace pairs {

FT_TARGET_AVX2 void quantize(const float* x, int k0, int k1, PairOrder order, int c, int group, void* base) {
  const __m256i off = _mm256_set1_epi8(static_cast<char>(c));
  for (int k = k0; k < k1; k += 64) {
    uint8_t* rec = static_cast<uint8_t*>(base) + static_cast<size_t>(k / 64) * kPairBytes;
    alignas(32) int8_t codes[2][32] = {};
    float dx[2][2] = {};  // [block][group of 16] (both groups the same for group = 32)
    for (int h = 0; h < 2 && k + 32 * h < k1; ++h) {
      for (int q = 0; q < 32; q += group) {
        dx[h][q / 16] = int8_codes(x + (k - k0) + 32 * h + q, group, codes[h] + q, true) / 127.f;
        if (group == 32) dx[h][1] = dx[h][0];
      }
    }
    // The two blocks' codes into XL / XH (avx2_pairs.h): halves as they are, even/odd split per
    // 128-bit lane by VPSHUFB (evens, then odds of each 16) and gathered by VPERMQ.
    __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes[0]));
    __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes[1]));
    if (order == PairOrder::kEvenOdd) {
      const __m256i eo =
          _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
      a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a, eo), 0xd8);
      b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, eo), 0xd8);
    }
    const __m256i xl = _mm256_permute2x128_si256(a, b, 0x20), xh = _mm256_permute2x128_si256(a, b, 0x31);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rec), xl);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rec + 32), xh);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rec + 64),
                        _mm256_add_epi16(_mm256_maddubs_epi16(off, xl), _mm256_maddubs_epi16(off, xh)));
    const float lanes[8] = {dx[0][0], dx[0][0], dx[0][1], dx[0][1], dx[1][0], dx[1][0], dx[1][1], dx[1][1]};
    std::memcpy(rec + 96, lanes, sizeof lanes);
  }
}

}  // namespace pairs
#endif

}  // namespace ft
