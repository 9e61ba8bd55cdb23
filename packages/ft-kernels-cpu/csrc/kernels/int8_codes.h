// Int8 activations shared by the int8 tiers of several formats: the codes of a block of a vector
// (mxfp4's and ggml's records are built from them) and the AVX2 dot product of 32 signed bytes.
#pragma once

#include <cstdint>

#include "common.h"

namespace ft {

// amax = max |v| over v[0, n) (NaNs skipped, 0 for an all-zero block), returned, and the codes
// c[e] = round-half-even(v[e] * (127 / amax)) in fp32, clamped to +-127 (a NaN becomes 127; 0 when
// amax is 0); the value is c[e] * amax / 127. simd: the AVX2 code (the same bits; the caller's CPU
// must have AVX2), else scalar. The tests compare both with numpy (_ft_kernels_cpu._q8_codes).
float int8_codes(const float* v, int n, int8_t* c, bool simd);

#if FT_X86
// 8 int32 lanes, lane l = sum over bytes 4l..4l+3 of w * x for signed bytes w, x (|w| given as aw;
// x != -128): VPMADDUBSW multiplies |w| (unsigned) by sign(w) * x into int16 pairs, VPMADDWD by ones
// adds the pairs. Exact while 2 |w| |x| <= 32767 (|w| <= 128 for |x| <= 127).
FT_TARGET_AVX2 inline __m256i dot_i8x32(__m256i aw, __m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}
#endif

}  // namespace ft
