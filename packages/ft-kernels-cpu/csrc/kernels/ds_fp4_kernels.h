// ds_fp4's own row kernels for the avx512_bf16 tier (ds_fp4_kernels.cpp, ds_fp4_amx.cpp) and their
// prepared vectors. The activations of ds_fp4 are fp8 e4m3 values times a power of two (4
// significant bits), exact in bf16 and, in units of 2^-9 of their block's scale, integers of 18 bits;
// e2m1 weights have 2 significant bits.
//
// Prepared vectors, in steps of 128 elements (zero-padded to a multiple of 128):
//   bf16   4 vectors of 32 bf16 words, x[g + 32j + k] = element g + 4k + j (every VDPBF16PS product
//          is exact, the sums are fp32); the layout of the bf16 and the AMX kernels.
//   int16  a record of 640 bytes a step (ds_fp4_kernels.cpp): the same word order holding the
//          integers x >> 3, a scale per 8 elements, and x & 7 where a step needs it. Every product
//          and the sum of a step are exact integers.
//   int8   records of 512 bytes a step in groups of 4 (ds_fp4_kernels.cpp): the integers x (or x / 8
//          where a step allows it) as 3 (or 2) planes of signed base-256 digits in the even / odd
//          order of the nibbles, the lanes' offset sums, and a unit per block. Exact as int16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {
namespace dsfp4 {

// The row kernels of a ds_fp4 layer.
//   fp32   fp4_kernels.cpp's kernels (fp4_common.h's prepared vectors): every tier.
//   bf16   dot_rows_multi below (VDPBF16PS): avx512_bf16.
//   int16  int16_dot_rows_multi below (VPDPWSSD; avx2_int16_dot_rows_multi with VPMADDWD in the avx2
//          and avx512 tiers) against x, fp32 against h: avx2 and above.
//   int8   int8_dot_rows_multi below (VPDPBUSD over digit planes) against x and h: avx512_bf16.
//   amx    amx_dot_rows_multi below (AMX-BF16 tiles) for calls of at least amx::min_vectors() vectors,
//          int8 for the others (prepared vectors in two layouts): avx512_bf16 on a CPU with AMX-BF16.
//   q8     mxfp4's int8-activation kernels against x and h rounded once more after their round trip
//          (W4A8: not exact): in avx512_bf16 fp4_common.h's q8_* (one vector) and q8g_* (several),
//          int8 codes per step of 128, a VPDPBUSD pair per 64 bytes of weights; in avx2 and avx512
//          its q8a_* (VPMADDUBSW, avx2_pairs.h), int8 codes per block of 32.
enum class Kernels { fp32, bf16, int16, int8, amx, q8 };
// $FT_CPU_MOE_DSFP4_KERNELS (auto, fp32, bf16, int16, int8, amx or q8), read when a layer is made; auto
// or unset is q8 from the avx2 tier up and fp32 in scalar. q8 ran batch 1 and 8 faster than the exact
// kernels everywhere measured: the GPU machine's Xeon (16 threads: 174 against 194 us a step at batch
// 1, 344 against 399 at batch 8 sharing its experts, against amx), a Zen 5 core from L3 in avx512_bf16
// (45.6 against 38 GB/s of weights, batch 8 13.0 against 9.7, against bf16), in avx2 (27.0 against
// 16.4, batch 8 6.2 against 3.4, against int16) and in avx512 (27.1 against 25.6, batch 8 6.3 against
// 4.3, against fp32; docs/benchmarks.md, twenty-sixth session). The exact kernels stay by name: int8
// (Intel's default before, where VDPBF16PS costs ~2.5 cycles), bf16 (AMD's), amx (with AMX-BF16),
// int16 (avx2's), fp32. Asking for kernels the tier or the CPU cannot run raises.
Kernels choose_kernels(Isa isa);
// The variable's name of k.
const char* kernels_name(Kernels k);

size_t vec_bytes(int K);        // bf16 layout
size_t int16_vec_bytes(int K);  // int16 records
size_t int8_vec_bytes(int K);   // int8 records
// fp4_common.h's fp8_round_trip, bit for bit, in AVX-512 code for the avx512 tiers (blocks of
// `block` from v[0]; 128 must be a multiple of block). The scalar round trip of x and h cost ~15 us
// of a decode step on the GPU machine's Xeon.
void fp8_round_trip(Isa isa, const float* v, int n, int block, float* q);
// The fp8 e4m3 round trip of fp4_common.h's fp8_round_trip (same arithmetic, bit for bit: blocks of
// `block` (32 or 128) from v[0], power-of-two scales, round to nearest even, saturation) fused with
// the layouts above, into the int16 records and / or the bf16 layout (either may be null): elements
// [i0, i1) given as v[i - i0], i0 a multiple of 128, i1 a multiple of 128 or the end. AVX-512 (the
// tier of these kernels); the scalar round trip spent more than the down rows' kernel.
void fp8_prep(const float* v, int i0, int i1, int block, void* int16_out, void* bf16_out);
// The same round trip into the int8 records of a vector of K elements (and, if bf16_out, the bf16
// layout): elements [i0, i1) as fp8_prep takes them. The call holding the vector's end also defines
// the record's unused tail.
void int8_prep(const float* v, int i0, int i1, int K, int block, void* int8_out, void* bf16_out);
// Round-tripped values q[0, i1 - i0) of elements [i0, i1) (i0 a multiple of 128, i1 a multiple of 128
// or the end) into the bf16 layout: their top 16 bits, exact. AVX-512.
void bf16_layout(const float* q, int i0, int i1, void* out);

// out[j * os + r] = W[r] . xs[j] for n <= 8 prepared vectors (bf16 layout), W/S as in fp4_common.h
// (e2m1 nibbles, e8m0 per 32), each weight step decoded once for all n vectors. `prefetch`: bytes
// ahead (0: off).
void dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, float* out,
                    int os, int prefetch);
// The same against int16 records.
void int16_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                          float* out, int os, int prefetch);
// The same against int8 records.
void int8_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                         float* out, int os, int prefetch);
// The avx2 tier's int16 records (records of 64 elements, int16_vec_bytes(K) bytes in all) and kernels
// (VPMADDWD; ds_fp4_avx2.cpp). avx2_int16_prep: elements [i0, i1) given as v[i - i0] (i0 a multiple
// of 128, i1 a multiple of 32) through the fp8 round trip (fp4_common.h's, bit for bit, in AVX2 code)
// into the records `out` and, if fp32_out, into fp4_common.h's prepared vector of `isa` as well.
void avx2_int16_prep(Isa isa, const float* v, int i0, int i1, int block, void* out, void* fp32_out);
// fp4_common.h's fp8_round_trip in AVX2 code (bit for bit) when n and block are multiples of 8 and
// block divides 128; false (nothing written) otherwise.
bool avx2_round_trip(const float* v, int n, int block, float* q);
void avx2_int16_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                               float* out, int os, int prefetch);
// The same on AMX tiles (ds_fp4_amx.cpp), same prepared vectors: groups of 16 rows, the rows past the
// last whole group (and a group holding a scale byte outside [2, 252]) by dot_rows_multi.
void amx_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch);

}  // namespace dsfp4
}  // namespace ft
