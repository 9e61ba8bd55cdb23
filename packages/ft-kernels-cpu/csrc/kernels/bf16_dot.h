// Row dot products over bf16 weights, one implementation per ISA tier.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace ft {

// out[r] = sum_k bf16(W[r * ld + k]) * x[k] for r in [0, nrows), fp32 accumulation; the weights are
// software-prefetched `prefetch` bytes ahead (0: off).
void bf16_dot_rows_f32(Isa isa, const uint16_t* W, size_t ld, int nrows, const float* x, int K, float* out,
                       int prefetch);

// Same with a bf16 vector, using the AVX512-BF16 dot-product instruction (tier avx512_bf16 only).
void bf16_dot_rows_bf16(const uint16_t* W, size_t ld, int nrows, const uint16_t* x, int K, float* out,
                        int prefetch);

// out[j * out_stride + r] = sum_k bf16(W[r * ld + k]) * xs[j][k] for n <= 8 vectors: each weight
// line is read and widened once for all of them.
void bf16_dot_rows_multi_f32(Isa isa, const uint16_t* W, size_t ld, int nrows, const float* const* xs, int n, int K,
                             float* out, int out_stride, int prefetch);
// Same with bf16 vectors and VDPBF16PS (tier avx512_bf16 only).
void bf16_dot_rows_multi_bf16(const uint16_t* W, size_t ld, int nrows, const uint16_t* const* xs, int n, int K,
                              float* out, int out_stride, int prefetch);

}  // namespace ft
