// Horizontal sums of 16-lane fp32 accumulators with one fixed addition tree, for kernels that finish
// several rows at once (multi-row kernels) and one row at a time (their remainder, and the batched
// kernels): every row's sum is the same tree whichever way it is computed, so a row's result never
// depends on the rows it was grouped with (bit-exactness across thread splits).
//
// The tree (the one GCC's _mm512_reduce_add_ps uses): s8[i] = a[i] + a[i + 8] (i < 8),
// s4[i] = s8[i] + s8[i + 4] (i < 4), s2[i] = s4[i] + s4[i + 2] (i < 2), sum = s2[0] + s2[1].
// hsum_x4 does it for 4 rows with 9 shuffles and 5 adds instead of 4 separate reductions.
#pragma once

#include "common.h"

namespace ft {
namespace rowred {

#if FT_X86


// The sums of a, b, c, d (lanes 0..3 of the result).
FT_TARGET_AVX512 inline __m128 hsum_x4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 128-bit lanes: (a0 + a2, a1 + a3, b0 + b2, b1 + b3): s8 of a and b
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // (s4 of a, s4 of b, s4 of c, s4 of d)
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));  // s2 in lanes 0, 1 of each 128
  const __m512 s = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));  // the sum in lane 0 of each 128
  const __m512i lane0s = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0s, s));
}

// The sum of a, by the same tree.
FT_TARGET_AVX512 inline float hsum(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// out[j * os] = scale * (sum of acc[j]) for j < n: 4 vectors at a time by hsum_x4, the rest one by one
// (the same tree either way).
FT_TARGET_AVX512 inline void store_sums(const __m512* acc, int n, float* out, int os, float scale = 1.f) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    alignas(16) float s[4];
    _mm_store_ps(s, _mm_mul_ps(hsum_x4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]), _mm_set1_ps(scale)));
    for (int i = 0; i < 4; ++i) out[(j + i) * os] = s[i];
  }
  for (; j < n; ++j) out[j * os] = hsum(acc[j]) * scale;
}

#endif  // FT_X86

}  // namespace rowred
}  // namespace ft
