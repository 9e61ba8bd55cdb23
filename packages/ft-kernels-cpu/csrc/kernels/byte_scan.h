// One pass over a call's scale bytes before its kernels run, for the formats whose kernels have a
// cheaper conversion where no byte takes a special case (mxfp4 and ds_fp4's e8m0 0 and 255,
// nvfp4's e4m3 NaN codes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {

#if FT_X86
// Whether `hits` (a functor: 64 bytes -> the mask of those that take the special case) finds none
// among the n bytes at s. The bytes of the last 64 past n read as `fill`, which must not be one.
template <class Hits>
FT_TARGET_AVX512 __attribute__((always_inline)) inline bool no_byte_hits(const uint8_t* s, size_t n, char fill,
                                                                        const Hits& hits) {
  __mmask64 any = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) any |= hits(_mm512_loadu_si512(s + i));
  if (i < n) any |= hits(_mm512_mask_loadu_epi8(_mm512_set1_epi8(fill), ~0ull >> (64 - (n - i)), s + i));
  return any == 0;
}
#endif

}  // namespace ft
