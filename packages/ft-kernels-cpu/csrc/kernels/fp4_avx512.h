// AVX-512 pieces shared by the e2m1 + e8m0 row kernels (fp4_kernels.cpp: mxfp4 and ds_fp4's fp32
// kernels; ds_fp4_kernels.cpp: ds_fp4's bf16 kernels). Rows are read 64 bytes (4 blocks of 32) at a time.
#pragma once

#include <cstddef>
#include <type_traits>

#include "common.h"

namespace ft {
namespace fp4 {

#if FT_X86
// e8m0 scale bytes (one per dword lane) as fp32: s << 23 is 2^(s - 127) for s in [1, 254]; s = 0 is
// the denormal 2^-127 (0x00400000), s = 255 NaN.
FT_TARGET_AVX512 inline __m512 e8m0_lanes(__m512i b) {
  __m512i bits = _mm512_max_epu32(_mm512_slli_epi32(b, 23), _mm512_set1_epi32(0x00400000));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255)),
                               _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(bits);
}

// e8m0 scales of up to 16 blocks as fp32 lanes (e8m0_lanes). Lanes past `n` are +0, not scale 0's
// denormal: they meet the zero-padded end of x, and products with a denormal operand or result took
// a microcode assist each on Zen 5 (without FTZ / DAZ, which the kernels leave off): a row of K = 768
// (a partial group of 8 blocks) took 13.0 ns against 6.9 with the padding lanes zero
// (docs/benchmarks.md, twenty-second session). A zero lane gives the same bits (0 * anything finite).
FT_TARGET_AVX512 inline __m512 e8m0x16(const uint8_t* s, int n) {
  if (n >= 16) return e8m0_lanes(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  return _mm512_maskz_mov_ps(m, e8m0_lanes(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s))));
}

// e8m0x16 for scales known to lie in [1, 254] (e8m0_all_normal): s << 23 is the float, and the
// zero bytes past `n` give +0 lanes, so neither the denormal, the NaN nor the padding takes an
// operation. In the int8 row kernels the general conversion cost more than its 5 operations suggest
// (it heads each group's chain of permutes and FMAs): mxfp4's rows of K = 768 one at a time ran on
// one Zen 4 core from L1 at 28.7 GB/s with it and 32.0 with this one, from L2 at 25.9 and 28.2
// (tools/row_stream_probe.cpp; docs/benchmarks.md, thirty-fourth session).
FT_TARGET_AVX512 inline __m512 e8m0x16_normal(const uint8_t* s, int n) {
  const __m128i b = n >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(s))
                            : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1u), s);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 23));
}
// e8m0x16_normal where the caller knows every scale normal, else e8m0x16.
template <bool Normal>
FT_TARGET_AVX512 inline __m512 e8m0x16_as(const uint8_t* s, int n) {
  if constexpr (Normal) {
    return e8m0x16_normal(s, n);
  } else {
    return e8m0x16(s, n);
  }
}

// Scale of block 4u + m / 4 in lane m, from the 16 scales of e8m0x16.
FT_TARGET_AVX512 inline __m512i scale_index(int u) {
  return _mm512_add_epi32(_mm512_set1_epi32(4 * u),
                          _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
}

// The byte table 12 + 2 * e2m1 (0..24: unsigned for VPDPBUSD, offset 12), repeated every 16 bytes so
// that VPERMB, which reads the low 6 bits of each index byte, needs no mask on a nibble.
FT_TARGET_AVX512 inline __m512i e2m1_u8_table() {
  return _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// The steps U .. 3 of a row's last group, which holds `left` (1 .. 15) of its blocks, in order and
// unrolled: step(u, blocks) for each step u (a std::integral_constant, so that the step's scale index
// is a constant) that holds `blocks` of them (a literal 4 for a whole step). As a loop (a runtime
// index into the scale indices, a runtime count for every step's load) mxfp4's rows of K = 768 (a
// group and a half) took as long as rows of K = 1024 from L2 on one Zen 4 core: 23.6 GB/s against 26.0
// unrolled (tools/row_stream_probe.cpp; docs/benchmarks.md, thirty-third session). Always inlined,
// as `step` must be: left out of line, with its scales and indices passed through memory, rows of
// K = 768 ran ~25% slower from L1 (thirty-fourth session).
template <int U, class Step>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void last_group_steps(int left, const Step& step) {
  if constexpr (U < 4) {
    if (left <= 4 * U) return;
    if (left >= 4 * U + 4) {
      step(std::integral_constant<int, U>{}, 4);
    } else {
      step(std::integral_constant<int, U>{}, left - 4 * U);
    }
    last_group_steps<U + 1>(left, step);
  }
}

// last_group_steps' step of the int8 row kernels: Step (step_q8<NV>, ds_fp4's step_i8<NV>) on step u of
// the last group, weights at w + 64 u, x's records at xo + u kStride, into acc; pf requests the
// weights ahead (pf.dist: 0 for none).
template <auto Step, size_t kStride, class Xs, class Pf>
struct LastGroupStep {
  const uint8_t* w;
  const __m512* sx;
  const __m512i* idx;
  Xs xs;
  size_t xo;
  __m512i lut;
  __m512* acc;
  const Pf& pf;
  template <int U>
  FT_TARGET_AVX512_BF16 __attribute__((always_inline)) void operator()(std::integral_constant<int, U>,
                                                                       int blocks) const {
    const uint8_t* wp = w + 64 * U;
    if (pf.dist) pf.ahead(wp);
    Step(wp, blocks, sx, idx[U], xs, xo + U * kStride, lut, acc);
  }
};

// Tail loads: the bytes of the blocks left in the row, zeros after (value 0 against a zero-padded x).
FT_TARGET_AVX512 inline __m512i load_blocks(const uint8_t* w, int blocks) {
  if (blocks >= 4) return _mm512_loadu_si512(w);
  return _mm512_maskz_loadu_epi8((1ull << (16 * blocks)) - 1ull, w);
}
#endif

}  // namespace fp4
}  // namespace ft
