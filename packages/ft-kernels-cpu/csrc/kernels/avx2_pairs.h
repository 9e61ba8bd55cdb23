// AVX2 row kernels with int8 activations that decode two 32-element blocks per 256-bit register,
// for weight types whose blocks hold 16 bytes of nibbles that decode (with one VPSHUFB at most) to
// unsigned byte codes u <= 24 with a constant offset c (the weight is (u - c) * scale): q4_0 and
// gguf's Q4_0 (nibble - 8), mxfp4, nvfp4 and gguf's MXFP4 (2 e2m1 + 12).
//
// Why pairs: one block's 16 bytes in one register need a 128-bit shift, an insert and an AND to make
// 32 codes (the low nibbles, then the high ones), and its int32 lanes one conversion, one scale
// multiply and one FMA each. Two blocks' 32 bytes in one register split with one shift and two ANDs
// into L (the low nibbles of both blocks) and H (the high nibbles), and one VPMADDWD, conversion,
// scale multiply and FMA serve both: on a Zen 3 core the q4_0 row loop went from ~14 to ~8 vector
// operations per block (docs/benchmarks.md, ninth session).
//
// x's record per pair of blocks (b, b + 1), kPairBytes, built by pairs::quantize:
//   bytes  0..31  XL: the codes that meet L: block b's 16, then block b + 1's
//   bytes 32..63  XH: the codes that meet H, the same way
//   bytes 64..95  XO: 16 int16, VPMADDUBSW(c, XL) + VPMADDUBSW(c, XH) (the offset's pair sums, so no
//                 row recomputes them)
//   bytes 96..127 DX: fp32 step of x for each int32 lane (lanes 0-3: block b, 4-7: block b + 1;
//                 with steps per 16 elements (nvfp4, kEvenOdd), lanes 0-1 hold block b's first step
//                 and 2-3 its second: lane m sums elements 8m..8m+7 in that order)
// A vector with an odd block count ends with a half pair: block b + 1's codes, offsets and steps
// are zero. Which elements meet L and H is the weight type's nibble order (PairOrder); int32 lane m
// of block b sums its int16 lanes 2m, 2m + 1, i.e. the bytes 4m..4m+3 of both halves.
//
// Per pair and vector: VPMADDUBSW of L by XL and of H by XH (u <= 24, |x| <= 127: pair sums <=
// 6096, their sum minus XO stays within int16), VPADDW, VPSUBW of XO, VPMADDWD by ones (exact int32),
// conversion, the weight scales times DX, one FMA. Every row takes the same operations in the same
// order for a given vector count, so results do not depend on how rows are split among threads.
//
// The block policy B provides (FT_TARGET_AVX2, inlined):
//   static constexpr int kOffset;                                  c
//   void pair(int row, int p, __m256i& L, __m256i& H) const;        the codes of blocks 2p, 2p + 1
//   void half(int row, int p, __m256i& L, __m256i& H) const;        block 2p alone (upper halves zero)
//   void scales4(int row, int g, __m256& s0, __m256& s1) const;     lane scales of pairs 2g, 2g + 1
//   __m256 scales2(int row, int p, bool half) const;                 lane scales of pair p (block
//                                                                    2p + 1's zero when half)
//   void ahead(int row, int g) const;                               prefetch hook, once per 4 blocks
//   static constexpr bool kScalePerBlock;                           all 4 int32 lanes of a block take
//                                                                    one weight scale and one x step
//                                                                    (false: two steps, lanes 0-1 / 2-3)
//
// Four vectors at a time (NV a multiple of 4): the per-vector chain above is 8
// operations (5 on the multiply pipes) per pair. rows_by4 instead sums each vector's VPMADDUBSW
// pair sums across lanes, four vectors into one register, before converting: per vector 2 VPMADDUBSW
// and a VPADDW; per two vectors VPUNPCKL/HWD and a VPADDW (lane i + lane i + 4: 8 products); per four
// VPUNPCKL/HDQ and a VPADDW (16 products), one VPSUBW of the offsets (XO summed the same way), one
// VPSHUFB that puts each vector's two halves side by side, one VPMADDWD by ones (int32: a block's 32
// products, lanes [a b c d] of block b, then of block b + 1), one conversion, one multiply of the
// weight scales by the four vectors' steps and one FMA: 56 operations (22 on the multiply pipes) for
// 8 vectors against 70 (40). The int16 adds wrap modulo 2^16, so only the value where VPMADDWD widens
// must fit: 16 products |(u - c) x| <= 12 * 127, 24384 < 32768. The steps and summed offsets of
// four vectors are built once per call (derive_by4) from their records, next to a copy of their codes
// in the order the loop reads them (one sequential run a row). Lane sums are exact integers,
// so a row's result differs from the one-vector chain only by fp32 rounding, and each row still
// takes the same operations in the same order for a given vector count. With two steps per block
// (nvfp4) the words are first interleaved (interleave_words) so that the sums keep the steps apart,
// and the four vectors' sums widen by two VPMADDWD (even and odd words) into two registers, each
// with its conversion, scale multiply and FMA: 62 operations a pair for 8 vectors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {

#if FT_X86
namespace pairs {

constexpr size_t kPairBytes = 128;
inline size_t record_bytes(int K) { return static_cast<size_t>((K / 32 + 1) / 2) * kPairBytes; }

// 32 bytes of packed e2m1 (two blocks) as the unsigned codes 2 e2m1 + 12 (0..24, offset 12): L from
// the low nibbles, H from the high ones (the even and odd elements in mxfp4 and nvfp4, elements
// 0..15 and 16..31 in ggml's MXFP4).
FT_TARGET_AVX2 inline void e2m1_split(__m256i raw, __m256i& L, __m256i& H) {
  const __m256i tab =
      _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m256i m4 = _mm256_set1_epi8(15);
  L = _mm256_shuffle_epi8(tab, _mm256_and_si256(raw, m4));
  H = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
}

// Which elements of a block meet the low nibbles: q4_0 (and ggml's other 32-element types) store
// element j in the low nibble of byte j and j + 16 in its high nibble; the e2m1 formats store
// elements 2j and 2j + 1 in byte j.
enum class PairOrder { kHalves, kEvenOdd };

// Quantizes elements [k0, k1) of a vector (k0 a multiple of 64, k1 of 32), given as x[k - k0], into
// its records at `base` (indexed from element 0 of the vector): codes and steps of int8_codes
// (int8_codes.h) per group of `group` elements (32, or 16 with kEvenOdd), the offset c.
void quantize(const float* x, int k0, int k1, PairOrder order, int c, int group, void* base);

// Row r's pairs of blocks in order, f(L, H, lane scales, pair, second): groups of 4 blocks (scales
// of two pairs at once, one prefetch call; second = the group's second pair), then 1-3 blocks left:
// a whole pair (second = false), then a half one (block 2p + 1's codes and scale zero; second = true).
template <class B, class F>
FT_TARGET_AVX2 inline void for_each_pair(const B& blk, int r, int nb, F&& f) {
  int g = 0;
  for (; 4 * g + 4 <= nb; ++g) {
    blk.ahead(r, g);
    __m256 s0, s1;
    blk.scales4(r, g, s0, s1);
    __m256i L, H;
    blk.pair(r, 2 * g, L, H);
    f(L, H, s0, 2 * g, false);
    blk.pair(r, 2 * g + 1, L, H);
    f(L, H, s1, 2 * g + 1, true);
  }
  int p = 2 * g;
  if (4 * g < nb) blk.ahead(r, g);
  if (2 * p + 2 <= nb) {
    __m256i L, H;
    blk.pair(r, p, L, H);
    f(L, H, blk.scales2(r, p, false), p, false);
    ++p;
  }
  if (2 * p < nb) {
    __m256i L, H;
    blk.half(r, p, L, H);
    f(L, H, blk.scales2(r, p, true), p, true);
  }
}

FT_TARGET_AVX2 inline __m256i load256(const uint8_t* a) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
}

// Within each 128-bit lane, words [0 1 2 3 4 5 6 7] -> [0 4 1 5 2 6 3 7]: rows_by4's sums end with
// each vector's two halves apart ([a0 b0 c0 d0 a1 b1 c1 d1]), which this puts side by side. With two
// steps per block (S16, 16 elements each: words 0-3 and 4-7 of each lane) it is applied first, to
// the codes L, H and to x's XL, XH, XO alike, so that the sums keep the steps apart: a0 is then
// vector a's first step and a1 its second.
FT_TARGET_AVX2 inline __m256i interleave_words() {
  return _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
}

// What rows_by4 reads of NV records, built once per call into `dst`, kBy4Regs<S16> registers per
// pair p and group q of four vectors (a, b, c, d) at (p * (NV / 4) + q) * kBy4Regs<S16>, in the
// order it reads them:
//   XO4: the records' XO summed as the products are (unpack pairs, then quads)
//   one scale per block: DXT  fp32 [dx_a dx_b dx_c dx_d] of block 2p, then of block 2p + 1
//   S16:                 DXE  fp32 [a c a c] of block 2p's steps 0 0 1 1, then of block 2p + 1's
//                        DXO  the same for b and d
//   XL, XH of a, b, c, d: the records' codes, copied (S16: words interleaved)
// The copy keeps what a row reads in one sequential run (20 KiB for 8 vectors of K = 2048), where
// the records interleave each pair's codes with its XO and DX lines, which the loop does not read.
template <bool S16>
constexpr int kBy4Regs = S16 ? 11 : 10;

template <bool S16>
FT_TARGET_AVX2 inline __m256i by4_order(__m256i v, __m256i il) {
  return S16 ? _mm256_shuffle_epi8(v, il) : v;
}

template <int NV, bool S16>
FT_TARGET_AVX2 inline void derive_by4(const uint8_t* const* xs, int np, __m256i* dst) {
  const __m256i il = interleave_words();
  for (int p = 0; p < np; ++p) {
    for (int q = 0; q < NV / 4; ++q) {
      const uint8_t* x[4];
      for (int j = 0; j < 4; ++j) x[j] = xs[4 * q + j] + static_cast<size_t>(p) * kPairBytes;
      __m256i o[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i oa = by4_order<S16>(load256(x[2 * h] + 64), il);
        const __m256i ob = by4_order<S16>(load256(x[2 * h + 1] + 64), il);
        o[h] = _mm256_add_epi16(_mm256_unpacklo_epi16(oa, ob), _mm256_unpackhi_epi16(oa, ob));
      }
      __m256i* d = dst + kBy4Regs<S16> * (static_cast<size_t>(p) * (NV / 4) + q);
      _mm256_store_si256(d, _mm256_add_epi16(_mm256_unpacklo_epi32(o[0], o[1]), _mm256_unpackhi_epi32(o[0], o[1])));
      __m256 dx[4];
      for (int j = 0; j < 4; ++j) dx[j] = _mm256_loadu_ps(reinterpret_cast<const float*>(x[j] + 96));
      if constexpr (S16) {
        // a record's lanes 0 and 2 of each half hold its block's two steps
        for (int h = 0; h < 2; ++h) {
          const __m256 lo = _mm256_unpacklo_ps(dx[h], dx[h + 2]), hi = _mm256_unpackhi_ps(dx[h], dx[h + 2]);
          _mm256_store_si256(d + 1 + h,
                             _mm256_castpd_si256(_mm256_unpacklo_pd(_mm256_castps_pd(lo), _mm256_castps_pd(hi))));
        }
      } else {
        const __m256 ab = _mm256_unpacklo_ps(dx[0], dx[1]), cd = _mm256_unpacklo_ps(dx[2], dx[3]);
        _mm256_store_si256(d + 1, _mm256_castpd_si256(_mm256_unpacklo_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))));
      }
      __m256i* codes = d + (S16 ? 3 : 2);
      for (int j = 0; j < 4; ++j) {
        _mm256_store_si256(codes + 2 * j, by4_order<S16>(load256(x[j]), il));
        _mm256_store_si256(codes + 2 * j + 1, by4_order<S16>(load256(x[j] + 32), il));
      }
    }
  }
}

// rows() for NV a multiple of 4 (the header's "Four vectors at a time").
template <int NV, class B>
FT_TARGET_AVX2 inline void rows_by4(const B& blk, const uint8_t* const* xs, int nrows, int nb, float* out, int os) {
  constexpr bool S16 = !B::kScalePerBlock;
  constexpr int G = NV / 4, A = S16 ? 2 : 1;  // accumulators per group (S16: vectors a, c and b, d)
  const int np = (nb + 1) / 2;
  AlignedBuffer<uint8_t>& scratch = thread_scratch();
  scratch.resize(static_cast<size_t>(np) * G * kBy4Regs<S16> * sizeof(__m256i));
  auto* derived = reinterpret_cast<__m256i*>(scratch.data());
  derive_by4<NV, S16>(xs, np, derived);
  const __m256i ones = _mm256_set1_epi16(1), il = interleave_words();
  const __m256i even = _mm256_set1_epi32(1), odd = _mm256_set1_epi32(1 << 16);
  auto pair = [&](__m256i L, __m256i H, __m256 s, int p, __m256(&acc)[G][A]) FT_TARGET_AVX2 {
    if constexpr (S16) {
      L = _mm256_shuffle_epi8(L, il);
      H = _mm256_shuffle_epi8(H, il);
    }
    for (int q = 0; q < G; ++q) {
      const __m256i* d = derived + kBy4Regs<S16> * (static_cast<size_t>(p) * G + q);
      const __m256i* codes = d + (S16 ? 3 : 2);
      __m256i two[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i* xa = codes + 4 * h;  // XL, XH of vector 2h, then of 2h + 1
        const __m256i va = _mm256_add_epi16(_mm256_maddubs_epi16(L, xa[0]), _mm256_maddubs_epi16(H, xa[1]));
        const __m256i vb = _mm256_add_epi16(_mm256_maddubs_epi16(L, xa[2]), _mm256_maddubs_epi16(H, xa[3]));
        two[h] = _mm256_add_epi16(_mm256_unpacklo_epi16(va, vb), _mm256_unpackhi_epi16(va, vb));
      }
      const __m256i four = _mm256_sub_epi16(
          _mm256_add_epi16(_mm256_unpacklo_epi32(two[0], two[1]), _mm256_unpackhi_epi32(two[0], two[1])), d[0]);
      if constexpr (S16) {
        // words [a0 b0 c0 d0 a1 b1 c1 d1] of each block: a, c from the even words, b, d from the odd
        const __m256i e = _mm256_madd_epi16(four, even), o = _mm256_madd_epi16(four, odd);
        acc[q][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_mul_ps(s, _mm256_castsi256_ps(d[1])), acc[q][0]);
        acc[q][A - 1] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(o), _mm256_mul_ps(s, _mm256_castsi256_ps(d[2])), acc[q][A - 1]);
      } else {
        const __m256i w = _mm256_madd_epi16(_mm256_shuffle_epi8(four, il), ones);  // [a b c d] of each block
        acc[q][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(w), _mm256_mul_ps(s, _mm256_castsi256_ps(d[1])), acc[q][0]);
      }
    }
  };
  for (int r = 0; r < nrows; ++r) {
    __m256 acc[G][A];
    for (int q = 0; q < G; ++q)
      #pragma GCC unroll 8
      for (int a = 0; a < A; ++a) acc[q][a] = _mm256_setzero_ps();
    for_each_pair(blk, r, nb, [&](__m256i L, __m256i H, __m256 s, int p, bool) FT_TARGET_AVX2 {
      pair(L, H, s, p, acc);
    });
    for (int q = 0; q < G; ++q) {
      alignas(16) float f[A][4];
      for (int a = 0; a < A; ++a) {
        // block 2p's lanes + block 2p + 1's; with S16 then step 0's + step 1's: [a c] and [b d]
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc[q][a]), _mm256_extractf128_ps(acc[q][a], 1));
        if constexpr (S16) t = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_store_ps(f[a], t);
      }
      for (int j = 0; j < 4; ++j) {
        if constexpr (S16) {
          out[(4 * q + j) * os + r] = f[j % 2][j / 2];
        } else {
          out[(4 * q + j) * os + r] = f[0][j];
        }
      }
    }
  }
}

// rows() with one chain per vector (the header's per-vector operations), for any NV.
template <int NV, class B>
FT_TARGET_AVX2 inline void rows_chains(const B& blk, const uint8_t* const* xs, int nrows, int nb, float* out,
                                       int os) {
  const __m256i ones = _mm256_set1_epi16(1);
  // One pair of row `r` against every vector: XL, XH, XO and DX are memory operands (L1).
  auto pair = [&](__m256i L, __m256i H, __m256 s, int p, __m256(&acc)[NV]) FT_TARGET_AVX2 {
    for (int j = 0; j < NV; ++j) {
      const uint8_t* x = xs[j] + static_cast<size_t>(p) * kPairBytes;
      const __m256i d = _mm256_sub_epi16(
          _mm256_add_epi16(_mm256_maddubs_epi16(L, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))),
                           _mm256_maddubs_epi16(H, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64)));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d, ones)),
                               _mm256_mul_ps(s, _mm256_loadu_ps(reinterpret_cast<const float*>(x + 96))), acc[j]);
    }
  };
  // Two sets of accumulators (even and odd pairs: two FMA chains per vector) for up to 2 vectors; one
  // set for more, which keeps 8 vectors' accumulators in registers (16 spilled to the stack, and the
  // loads and stores of the spills cost more than the longer chains).
  constexpr int A = NV <= 2 ? 2 : 1;
  for (int r = 0; r < nrows; ++r) {
    __m256 a0[NV], a1[NV];
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
    __m256(&odd)[NV] = A == 2 ? a1 : a0;
    for_each_pair(blk, r, nb, [&](__m256i L, __m256i H, __m256 s, int p, bool second) FT_TARGET_AVX2 {
      pair(L, H, s, p, second ? odd : a0);
    });
    for (int j = 0; j < NV; ++j) out[j * os + r] = hsum8(A == 2 ? _mm256_add_ps(a0[j], a1[j]) : a0[j]);
  }
}

// out[j * os + r] = row r . x_j for rows [0, nrows) of nb blocks and NV vectors (records xs[j]).
template <int NV, class B>
FT_TARGET_AVX2 inline void rows(const B& blk, const uint8_t* const* xs, int nrows, int nb, float* out, int os) {
  if constexpr (NV % 4 == 0) {
    rows_by4<NV>(blk, xs, nrows, nb, out, os);
  } else {
    rows_chains<NV>(blk, xs, nrows, nb, out, os);
  }
}

}  // namespace pairs
#endif

}  // namespace ft
