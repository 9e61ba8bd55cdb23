// Horizontal sums of up to 8 AVX-512 accumulators, one per vector of a multi-vector row kernel.
#pragma once

#include "common.h"

namespace ft {

#if FT_X86
// out[j * os] = sum of the lanes of acc[j], j < N. From 4 vectors on, the sums are formed together
// (a transpose by halves: 3 + 3 + 5 shuffles and adds per pair, quad and octet of vectors instead of
// about 8 per vector); rows of a few blocks (pass 2 over a short intermediate) spend much of their
// time here otherwise. The order of additions is fixed: a row's sum does not depend on the thread split.
template <int N>
FT_TARGET_AVX512 inline void reduce_store_n(const __m512* acc, float* out, int os) {
  if constexpr (N < 4) {
    for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(acc[j]);
  } else {
    const __m512 z = _mm512_setzero_ps();
    __m512 a[8];
    for (int j = 0; j < 8; ++j) a[j] = j < N ? acc[j] : z;
    // Pairs: lanes 0-7 hold a[2p]'s two halves summed, lanes 8-15 a[2p + 1]'s.
    __m512 c[4];
    for (int p = 0; p < 4; ++p) {
      c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
    }
    // Quads: 128-bit lane q of d[h] holds 4 partial sums of vector 4h + q.
    __m512 d[2];
    for (int h = 0; h < 2; ++h) {
      d[h] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * h], c[2 * h + 1], 0x88),
                           _mm512_shuffle_f32x4(c[2 * h], c[2 * h + 1], 0xdd));
    }
    // Octets: in 128-bit lane q, element 0 the sum of vector q, element 1 that of vector 4 + q.
    const __m512 f = _mm512_add_ps(_mm512_unpacklo_ps(d[0], d[1]), _mm512_unpackhi_ps(d[0], d[1]));
    const __m512 g = _mm512_add_ps(f, _mm512_shuffle_ps(f, f, 0x4e));
    alignas(64) float v[16];
    _mm512_store_ps(v, g);
    for (int j = 0; j < N; ++j) out[j * os] = v[4 * (j & 3) + (j >> 2)];
  }
}
#endif

}  // namespace ft
