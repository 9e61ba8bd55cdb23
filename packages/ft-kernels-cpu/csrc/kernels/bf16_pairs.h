// Two weight rows against N bf16 vectors, 128 elements at a time, shared by the VDPBF16PS kernels
// that decode their weights to bf16 words (ds_fp4_kernels.cpp, fp8_block.cpp). Each vector's 4
// lines are loaded once for both rows (Zen 4 loads one 512-bit line a cycle and runs VDPBF16PS at
// about one a cycle; docs/benchmarks.md, fourteenth session).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {

#if FT_X86
// For each vector j < N: the 4 word vectors a (row 0) and b (row 1) against the 128 words at
// xs[j] + xo, each row's products summed in one chain from zero, then t0[j] += sum0 * s0 and
// t1[j] += sum1 * s1 (one FMA each). XS: const void* or const uint16_t* vector pointers.
template <int N, class XS>
FT_TARGET_AVX512_BF16 inline void dot128_pair_bf16(const __m512i* a, const __m512i* b, __m512 s0, __m512 s1,
                                                   const XS* xs, size_t xo, __m512* t0, __m512* t1) {
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) {
    const uint16_t* x = static_cast<const uint16_t*>(xs[j]) + xo;
    __m512bh xv = (__m512bh)_mm512_loadu_si512(x);
    __m512 p0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)a[0], xv);
    __m512 p1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)b[0], xv);
#pragma GCC unroll 3
    for (int q = 1; q < 4; ++q) {
      xv = (__m512bh)_mm512_loadu_si512(x + 32 * q);
      p0 = _mm512_dpbf16_ps(p0, (__m512bh)a[q], xv);
      p1 = _mm512_dpbf16_ps(p1, (__m512bh)b[q], xv);
    }
    t0[j] = _mm512_fmadd_ps(p0, s0, t0[j]);
    t1[j] = _mm512_fmadd_ps(p1, s1, t1[j]);
  }
}
#endif

}  // namespace ft
