// Shared pieces of the FP4 formats (mxfp4, ds_fp4): e2m1 values in blocks of 32 with one e8m0 scale
// per block, two values per byte (low nibble = element 2j, high nibble = element 2j+1).
//
// A row of K elements is K/2 bytes of nibbles plus K/32 scale bytes; the rows of a matrix are
// contiguous in both arrays. The row kernels take the vector they multiply in a per-tier "prepared"
// layout (prep_vec), made once per token or route, so that no lane shuffle of the vector is left in
// the weight stream:
//   scalar       fp32, natural order
//   avx2         fp32, each block of 32 split into its 16 even then its 16 odd elements (the low
//                and high nibbles of the 16 bytes of a block)
//   avx512       fp32, steps of 128 elements as 8 vectors of 16: x[16k + m] = element 8m + k
//   avx512_bf16  bf16, steps of 128 elements as 4 vectors of 32: x[32j + k] = element 4k + j
// (the avx512 layouts are zero-padded to a multiple of 128; see fp4_kernels.cpp for why). On Intel
// CPUs the avx512_bf16 tier uses the avx512 kernels and layout (kernel_isa in fp4_kernels.cpp).
// mxfp4 runs int8 activations (q8_*, below) in the avx512_bf16 tier instead, on every vendor, and in
// the avx2 tier (q8a_*, per block of 32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {
namespace fp4 {

// e2m1 (OCP MX FP4): sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
extern const float kE2m1[16];
// e8m0: 2^(s - 127); 255 is NaN. 0 is 2^-127 (an fp32 denormal). Filled while the module loads.
struct E8m0Table {
  float v[256];
  E8m0Table();
};
extern const E8m0Table kE8m0;

// 0.5 * kE8m0 four times per code: one 16-byte row per block, lanes of the avx2 pairs kernels.
struct E8m0Half4Table {
  alignas(16) float v[256][4];
  E8m0Half4Table();
};
extern const E8m0Half4Table kE8m0Half4;

#if FT_X86
// The e8m0 scales s[0..3] as kE8m0 gives them, without a table (a VPGATHERDPS per 4 blocks held a
// Zen 3 core to 7.7 GB/s in cache, against 13-14 without it): e << 23 is 2^(e - 127) for e in
// 1..254; e = 0 (2^-127 = 0x00400000) is the unsigned maximum with that; e = 255 (inf so far) takes
// a quiet-NaN bit.
FT_TARGET_AVX2 inline __m128 e8m0x4(const uint8_t* s) {
  uint32_t e;
  __builtin_memcpy(&e, s, sizeof e);
  const __m128i ev = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(e)));
  const __m128i nan = _mm_and_si128(_mm_cmpeq_epi32(ev, _mm_set1_epi32(255)), _mm_set1_epi32(0x00400000));
  return _mm_castsi128_ps(_mm_or_si128(_mm_max_epu32(_mm_slli_epi32(ev, 23), _mm_set1_epi32(0x00400000)), nan));
}
#endif

// Bytes of a prepared vector of K elements for the kernels of `isa`.
size_t vec_bytes(Isa isa, int K);

// Prepares elements [i0, i1) of a vector, given as v[i - i0], into `out`, the prepared vector of the
// whole length. i0 must be a multiple of 128 and i1 a multiple of 128 or the end of the vector.
void prep_vec(Isa isa, const float* v, int i0, int i1, void* out);

// out[r] = sum_k W[r, k] * x[k] for r in [0, nrows) with W[r, k] = e2m1(nibble) * e8m0(S[r, k / 32]);
// W holds nrows contiguous rows of K/2 bytes, S nrows contiguous rows of K/32 bytes; K % 32 == 0;
// x is prepared (prep_vec) for `isa`. fp32 accumulation. `prefetch`: software prefetch distance
// within the weight stream in bytes (0: off).
void dot_rows(Isa isa, const uint8_t* W, const uint8_t* S, int nrows, const void* x, int K, float* out,
              int prefetch);

// The same for n <= kMaxVectors vectors xs[j] (each prepared for `isa`): out[j * os + r] = W[r] . xs[j].
// Each block of the rows is decoded once for all n vectors (n == 1: dot_rows).
constexpr int kMaxVectors = 8;
void dot_rows_multi(Isa isa, const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                    float* out, int os, int prefetch);

// Int8 activations (mxfp4 in the avx512_bf16 tier, AVX512-VNNI): a vector of K elements as steps of
// 128 elements, in groups of 4 steps (512 elements, the last group zero-padded) of kQ8GroupBytes:
// step s's record of kQ8StepBytes at q8_step_offset(s),
//   bytes 0..63     int8 codes of the step's even elements 0, 2, .., 126 (the low nibbles' elements)
//   bytes 64..127   int8 codes of its odd elements 1, 3, .., 127
//   bytes 128..191  int32 lanes m = 0..15: -12 * (sum of the codes at bytes 4m..4m+3 and 64+4m..+3)
// and after the group's 4 records 16 fp32 lanes, lane b = dx / 2 of step 4g + b / 4 (the step of
// block 16g + b), so that the e8m0 scales of 16 blocks take their steps' dx in one multiply.
// codes as int8_codes (int8_codes.h): round-half-even(v * 127 / amax), clamped, amax over the step,
// the value code * dx, dx = amax / 127. q8_prep_vec takes elements [i0, i1) of a vector of K as
// v[i - i0], i0 a multiple of 128 and i1 a multiple of 128 or K.
constexpr size_t kQ8StepBytes = 192;
constexpr size_t kQ8GroupBytes = 4 * kQ8StepBytes + 64;
constexpr size_t q8_step_offset(size_t s) { return s / 4 * kQ8GroupBytes + s % 4 * kQ8StepBytes; }
size_t q8_vec_bytes(int K);
void q8_prep_vec(const float* v, int i0, int i1, int K, void* out);
// out[j * os + r] = W[r] . dequant(xs[j]) for n <= kMaxVectors int8 vectors (each block decoded once).
// by_multirow: one vector reads 4 rows side by side (dot_rows_q8_x4, the same bits) where
// stream_prefetch.h's multirow() says so at the call; else, the default, one row at a time. The
// formats pass MoeParams::multirow_explicit ($FT_CPU_MOE_MULTIROW_BYTES set). The thirty-second
// session took rows of K < 1024 with a partial last group 4 at a time on AMD by default (Qwen3-30B-A3B's
// down rows, K = 768: pass 2 362 -> 324 us a step at one thread on the 2-core Zen 4). What made them
// slow one at a time was that group's loop; with it unrolled (last_group_steps) one row at a time ran as
// fast (thirty-third session, alternating runs: pass 2 over pass 1 0.623 against 0.625 at one thread,
// 0.726 against 0.664 at two from a 20 MiB pool), so that special case went (docs/benchmarks.md).
void q8_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                       float* out, int os, int prefetch, bool by_multirow = false);
// One vector's rows (q8_dot_rows_multi's n == 1) by a chosen kernel, all with the same bits a row:
//   fastest         rows of K <= 768 with x's codes in registers (dot_rows_q8_xreg); rows of K < 4608 with
//                   their whole groups unrolled, the first 8 steps' x codes in registers
//                   (dot_rows_q8_groups); longer rows from x's records in memory (dot_rows_q8);
//                   q8_dot_rows_multi's default
//   from_records    every row by dot_rows_q8
//   four_at_a_time  4 rows side by side (dot_rows_q8_x4), the rows left over as `fastest`
// (the tests compare the three bit for bit: _mxfp4_q8_rows).
enum class Q8Rows { fastest, from_records, four_at_a_time };
void q8_dot_rows_one_vector(const uint8_t* W, const uint8_t* S, int nrows, const void* x, int K, float* out,
                            int prefetch, Q8Rows how);

// The same int8 activations in group records (q8g_*: mxfp4's calls of several vectors, and of one
// with FT_CPU_MOE_MXFP4_KERNELS=groups): a vector of K elements as groups of 512 (16 blocks of 32 in
// 4 steps of 128; the last group zero-padded), kQ8gGroupBytes each. The kernels hold the group's 16
// blocks in the 16 dword lanes of a register, block q8g_block_of_lane(p) in lane p (the weights' 4
// steps transposed dword by dword within 128-bit lanes), so that each lane sums one block over the
// whole group:
//   bytes 128u .. 128u + 63     lane p, byte i: the code of element 8u + 2i of block q8g_block_of_lane(p)
//                               (u = 0..3: the even elements whose low nibbles are the block's bytes
//                               4u .. 4u + 3)
//   bytes 128u + 64 .. + 127    the odd elements 8u + 2i + 1
//   bytes 512 .. 575            int32 lane p: -12 * (sum of the 32 codes of that block)
//   bytes 576 .. 639            fp32 lane p: dx / 2 of that block's step
// codes as int8_codes (int8_codes.h): round-half-even(v * 127 / amax), clamped, amax over the step of
// 128, the value code * dx, dx = amax / 127. q8g_prep_vec takes elements [i0, i1) of a vector of K as
// v[i - i0], i0 a multiple of 128 and i1 a multiple of 128 or K; each step writes only its own lanes
// (4 of every 16), so steps of one group may be prepared by different threads.
constexpr size_t kQ8gGroupBytes = 640;
constexpr size_t kQ8gCorrOffset = 512, kQ8gDxOffset = 576;
// Lane p holds block 4 (p % 4) + p / 4 of the group: step p % 4, block p / 4 of that step.
constexpr int q8g_block_of_lane(int p) { return 4 * (p % 4) + p / 4; }
size_t q8g_vec_bytes(int K);
void q8g_prep_vec(const float* v, int i0, int i1, int K, void* out);
void q8g_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch);

// Int8 activations of the avx2 tier (mxfp4; VPMADDUBSW): avx2_pairs.h's records (pairs of blocks of
// 32, codes in even/odd order, offset 12; codes as int8_codes (int8_codes.h), amax over the block of
// 32, the value code * dx, dx = amax / 127). q8a_prep_vec takes elements [i0, i1) as v[i - i0], i0 a
// multiple of 64.
size_t q8a_vec_bytes(int K);
void q8a_prep_vec(const float* v, int i0, int i1, void* out);
void q8a_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch);

// Whether all n e8m0 scale bytes at s lie in [1, 254], the normal powers of two (neither 0, the
// denormal 2^-127, nor 255, NaN): then the int8 row kernels of the avx512_bf16 tier (q8_dot_rows_multi,
// ds_fp4's) convert them with e8m0x16_normal. Needs AVX-512 (BW); one pass of 64 bytes at a time.
bool e8m0_all_normal(const uint8_t* s, size_t n);

// Round trip through fp8 e4m3fn with one power-of-two (ue8m0) scale per block of `block` elements:
// amax = max |v|, s = 2^ceil(log2(max(amax, 1e-4) / 448)), out = e4m3fn_rne_sat(v / s) * s. The last
// block may be short. Exact fp32 arithmetic (the scale is a power of two), no ISA dependence.
void fp8_round_trip(const float* v, int n, int block, float* out);
// That scale from the block's amax: 2^ceil(log2(max(amax, 1e-4) / 448)). max(amax, 1e-4) / 448 is a
// normal float, so rounding up to a power of two is clearing the mantissa and bumping the exponent
// when any mantissa bit is set. (The scalar, AVX2 and AVX-512 round trips all take it from here.)
inline float fp8_scale_of_amax(float amax) {
  float s = (amax < 1e-4f ? 1e-4f : amax) / 448.f;  // std::max(amax, 1e-4f), NaN kept
  uint32_t bits;
  __builtin_memcpy(&bits, &s, sizeof bits);
  if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
  __builtin_memcpy(&s, &bits, sizeof s);
  return s;
}

}  // namespace fp4
}  // namespace ft
