// AVX2 row kernels with int8 activations for weight types whose 32-element blocks decode, with one
// VPSHUFB at most, to unsigned byte codes u <= 24 with a constant offset c: the weight is
// (u - c) * scale of the block (q4_0: nibble - 8; mxfp4: 2 e2m1 + 12 with scale e8m0 / 2; nvfp4: 2
// e2m1 + 12 with an e4m3 scale per 16 elements).
//
// Per block and vector: VPMADDUBSW multiplies u (unsigned) by x's int8 codes (|x| <= 127) into 16
// int16 pair sums (<= 2 * 24 * 127 = 6096, never saturating); VPMADDUBSW of c by x, once per block
// and vector for all rows, gives the offset's pair sums (<= 2 * 24 * 127); their difference, exact in
// int16, VPMADDWD by ones gives 8 int32 lanes of sum (u - c) x, exactly (lane l: codes 4l..4l+3).
// The lanes are converted and added into fp32 by one FMA with the weight scales times x's scales,
// per lane (one value for the block, or two for types with a scale per 16 elements: nvfp4). No sign
// shuffles per row (VPSIGNB), and x's loads, offsets and scales are shared by the R rows of a step.
//
// R rows at a time (4 for one vector, 2 for two, else 1; or always 1 for a type with B::kRows = 1,
// which then keeps two accumulators per vector for one or two vectors): independent FMA chains in
// registers (an accumulator array indexed by the block number lives in memory: GCC kept it on the
// stack, and the chain through a store and a load cost 6 cycles a block). Every (row, vector) takes the same operations in the same order for
// any R, so results do not depend on how rows are grouped into calls.
//
// The block policy B provides (all FT_TARGET_AVX2, inlined):
//   static constexpr int kOffset;                    c
//   static constexpr int kRows;                      4: read rows side by side; 1: one row at a time
//   __m256i codes(int row, int b) const;             u of block b of `row`, in x's element order
//   __m256 scale(int row, int b) const;              the weight scale of each int32 lane
//   void ahead(int row, int b) const;                software prefetch hook, called every 4th block
// The activation policy X provides:
//   const uint8_t* codes(int j, int b) const;        32 int8 codes of vector j's block b
//   __m256 dx(int j, int b) const;                   its scale of each int32 lane
#pragma once

#include <cstdint>

#include "common.h"

namespace ft {

#if FT_X86
namespace u8rows {

// Rows per step for NV vectors when a type reads rows side by side (B::kRows = 4); also the K-quant
// kernels' choice (ggml_blocks.cpp).
constexpr int rows_per_step(int nv) { return nv == 1 ? 4 : nv == 2 ? 2 : 1; }

// 16 packed bytes as 32 nibble bytes: the low nibbles (bytes 0..15), then the high ones (16..31).
FT_TARGET_AVX2 inline __m256i nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

// 16 bytes of packed e2m1 codes as unsigned codes 2 e2m1 + 12 (0..24; offset 12), in nibbles' order
// (mxfp4, nvfp4).
FT_TARGET_AVX2 inline __m256i e2m1_codes(const uint8_t* p) {
  const __m256i tab =
      _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  return _mm256_shuffle_epi8(tab, nibbles(p));
}

// Block b of rows [r, r + R) into ac (always inlined, so that ac stays in registers).
template <int R, int NV, class B, class X>
FT_TARGET_AVX2 __attribute__((always_inline)) inline void block(const B& blk, const X& x, int r, int b, __m256i off,
                                                                __m256i ones, __m256 (&ac)[R][NV]) {
  if ((b & 3) == 0)
    for (int i = 0; i < R; ++i) blk.ahead(r + i, b);
  if constexpr (R == 1) {
    // One row: each vector's loads, offset and scale where they are used (arrays of them for 8
    // vectors spilled to the stack: 3 registers per vector next to 8 accumulators).
    const __m256i u = blk.codes(r, b);
    const __m256 ws = blk.scale(r, b);
    for (int j = 0; j < NV; ++j) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes(j, b)));
      const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, xq), _mm256_maddubs_epi16(off, xq));
      ac[0][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_mul_ps(ws, x.dx(j, b)), ac[0][j]);
    }
    return;
  }
  __m256i xq[NV], xo[NV];
  __m256 dx[NV];
  for (int j = 0; j < NV; ++j) {
    xq[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes(j, b)));
    xo[j] = _mm256_maddubs_epi16(off, xq[j]);
    dx[j] = x.dx(j, b);
  }
  for (int i = 0; i < R; ++i) {
    const __m256i u = blk.codes(r + i, b);
    const __m256 ws = blk.scale(r + i, b);
    for (int j = 0; j < NV; ++j) {
      const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, xq[j]), xo[j]);
      ac[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_mul_ps(ws, dx[j]), ac[i][j]);
    }
  }
}

// Rows [r, r + R); with A = 2 even blocks go into one set of accumulators and odd ones into another
// (a last odd-count block into the first), summed at the end.
template <int R, int A, int NV, class B, class X>
FT_TARGET_AVX2 inline void step_rows(const B& blk, const X& x, int r, int nb, float* out, int os) {
  static_assert(A == 1 || A == 2, "one or two accumulator sets");
  const __m256i off = _mm256_set1_epi8(static_cast<char>(B::kOffset)), ones = _mm256_set1_epi16(1);
  __m256 a0[R][NV], a1[R][NV];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NV; ++j) a0[i][j] = a1[i][j] = _mm256_setzero_ps();
  int b = 0;
  for (; b + A <= nb; b += A) {
    block<R, NV>(blk, x, r, b, off, ones, a0);
    if constexpr (A == 2) block<R, NV>(blk, x, r, b + 1, off, ones, a1);
  }
  if (b < nb) block<R, NV>(blk, x, r, b, off, ones, a0);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NV; ++j) out[j * os + r + i] = hsum8(A == 2 ? _mm256_add_ps(a0[i][j], a1[i][j]) : a0[i][j]);
}

// out[j * os + r] = row r . x_j for rows [0, nrows) and NV vectors. B::kRows is the rows per step
// of one vector (4, or 1 where reading rows side by side cost more than it saved: mxfp4, nvfp4);
// fewer with more vectors. A step of one row keeps two accumulators per vector while NV <= 2 (the FMA
// latency); the leftover rows of a call take the same accumulators as its steps.
template <int NV, class B, class X>
FT_TARGET_AVX2 inline void rows(const B& blk, const X& x, int nrows, int nb, float* out, int os) {
  constexpr int R = B::kRows == 1 ? 1 : rows_per_step(NV);
  constexpr int A = R == 1 && NV <= 2 ? 2 : 1;
  int r = 0;
  for (; r + R <= nrows; r += R) step_rows<R, A, NV>(blk, x, r, nb, out, os);
  for (; r < nrows; ++r) step_rows<1, A, NV>(blk, x, r, nb, out, os);
}

}  // namespace u8rows
#endif

}  // namespace ft
