// bf16 expert weights: its row-dot kernels for every ISA tier and the format class.
//
// Banks (E experts, H hidden, I intermediate):
//   w13       [E, 2I, H] bf16   gate rows 0..I-1, then up rows I..2I-1
//   w2        [E, H, I]  bf16
//   w13_bias  [E, 2I]    f32    optional
//   w2_bias   [E, H]     f32    optional
#include <algorithm>

#include "bf16_dot.h"
#include "dispatch_n.h"
#include "format.h"
#include "stream_prefetch.h"

namespace ft {

namespace {

// Software prefetch `prefetch` bytes ahead of the weight stream (stream_prefetch.h), into L1. Rows
// of a block are contiguous, so the address ahead is the next row (or the next block) of the same
// matrix.
using Prefetch = StreamPrefetch<>;

void dot_rows_scalar(const uint16_t* W, size_t ld, int nrows, const float* x, int K, float* out) {
  for (int r = 0; r < nrows; ++r) {
    const uint16_t* w = W + r * ld;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += bf16_to_f32(w[k]) * x[k];
    out[r] = acc;
  }
}

#if FT_X86

FT_TARGET_AVX2 inline __m256 load8_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}


// One row at a time: the weights stream through memory strictly in address order, which is what the
// hardware prefetchers follow best (interleaving 4 rows ran at half the DRAM bandwidth on Zen 5).
// Independent accumulators hide the FMA latency.
FT_TARGET_AVX2 float dot_row_avx2(const uint16_t* w, const float* x, int K, const Prefetch& pf) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    if (pf.dist) pf.ahead(w + k);
    a0 = _mm256_fmadd_ps(load8_bf16(w + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(load8_bf16(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(load8_bf16(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(load8_bf16(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(load8_bf16(w + k), _mm256_loadu_ps(x + k), a0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; k < K; ++k) s += bf16_to_f32(w[k]) * x[k];
  return s;
}

FT_TARGET_AVX2 void dot_rows_avx2(const uint16_t* W, size_t ld, int nrows, const float* x, int K, float* out,
                                  const Prefetch& pf) {
  for (int r = 0; r < nrows; ++r) out[r] = dot_row_avx2(W + r * ld, x, K, pf);
}

FT_TARGET_AVX512 inline __m512 load16_bf16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

FT_TARGET_AVX512 float dot_row_avx512(const uint16_t* w, const float* x, int K, const Prefetch& pf) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int k = 0;
  for (; k + 64 <= K; k += 64) {
    if (pf.dist) {
      pf.ahead(w + k);
      pf.ahead(w + k + 32);
    }
    a0 = _mm512_fmadd_ps(load16_bf16(w + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(load16_bf16(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(load16_bf16(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(load16_bf16(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k < K; k += 16) {
    const int n = std::min(16, K - k);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
    const __m256i raw = _mm256_maskz_loadu_epi16(m, w + k);
    const __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    a0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + k), a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

FT_TARGET_AVX512 void dot_rows_avx512(const uint16_t* W, size_t ld, int nrows, const float* x, int K, float* out,
                                     const Prefetch& pf) {
  for (int r = 0; r < nrows; ++r) out[r] = dot_row_avx512(W + r * ld, x, K, pf);
}

// VDPBF16PS multiplies bf16 pairs and accumulates in fp32: no widening of the weights at all.
FT_TARGET_AVX512_BF16 float dot_row_bf16x(const uint16_t* w, const uint16_t* x, int K, const Prefetch& pf) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int k = 0;
  for (; k + 64 <= K; k += 64) {
    if (pf.dist) {
      pf.ahead(w + k);
      pf.ahead(w + k + 32);
    }
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
    a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32), (__m512bh)_mm512_loadu_si512(x + k + 32));
  }
  for (; k < K; k += 32) {
    const int n = std::min(32, K - k);
    const __mmask32 m = n == 32 ? 0xffffffffu : static_cast<__mmask32>((1u << n) - 1u);
    a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, w + k), (__m512bh)_mm512_maskz_loadu_epi16(m, x + k));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}


// N vectors at once: each weight line is loaded (and widened) once and multiplied into N
// accumulators, so a batch costs little more than one token while the weights stream from DRAM.
template <int N>
FT_TARGET_AVX2 void dot_row_multi_avx2(const uint16_t* w, const float* const* xs, int K, float* out, int os,
                                       const Prefetch& pf) {
  __m256 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    if (pf.dist && (k & 31) == 0) pf.ahead(w + k);
    const __m256 wv = load8_bf16(w + k);
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j] + k), acc[j]);
  }
  for (int j = 0; j < N; ++j) {
    float s = hsum8(acc[j]);
    for (int kk = k; kk < K; ++kk) s += bf16_to_f32(w[kk]) * xs[j][kk];
    out[j * os] = s;
  }
}

// R rows and N vectors at once in the avx2 tier: each vector's 8 floats are loaded once for the R
// rows. One row against 8 vectors of H = 2048 reads 64 KiB of x per row, twice Zen 3's L1d, so the
// vectors stream from L2 at 8 loads per 8 weights; two rows halve that. Every (row, vector) sum
// takes the same products in the same order as dot_row_multi_avx2 (the prefetch aside), so results
// do not depend on how rows are grouped. R * N <= 12 accumulators stay in the 16 ymm registers.
template <int N, int R>
FT_TARGET_AVX2 void dot_rows_block_avx2(const uint16_t* W, size_t ld, const float* const* xs, int K, float* out,
                                        int os, const Prefetch& pf) {
  static_assert(R * N <= 12, "accumulators in registers");
  __m256 acc[R][N];
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[i][j] = _mm256_setzero_ps();
  const size_t lead = std::max(static_cast<size_t>(pf.dist), R * ld * sizeof(uint16_t));
  int k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[R];
    for (int i = 0; i < R; ++i) {
      if (pf.dist && (k & 31) == 0) pf.ahead_by(W + i * ld + k, lead);
      wv[i] = load8_bf16(W + i * ld + k);
    }
    for (int j = 0; j < N; ++j) {
      const __m256 xv = _mm256_loadu_ps(xs[j] + k);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < N; ++j) {
      float s = hsum8(acc[i][j]);
      for (int kk = k; kk < K; ++kk) s += bf16_to_f32(W[i * ld + kk]) * xs[j][kk];
      out[j * os + i] = s;
    }
  }
}

// Loads of the multi-vector kernels below: plain 64-byte loads for whole chunks, masked ones only for
// a row's last partial chunk. On a 2-core Zen 5 masked loads in the loop held 8 vectors against 3
// rows of K = 2048 from DRAM to ~9 GB/s a core against ~15 with plain loads of the same lines (the
// weight loads' share ~7 GB/s of it, the vectors' ~3; docs/benchmarks.md, twenty-eighth session).
template <bool Masked>
FT_TARGET_AVX512 inline __m512 load16_bf16_as_f32(const uint16_t* p, __mmask16 m) {
  if (!Masked) return load16_bf16(p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
template <bool Masked>
FT_TARGET_AVX512 inline __m512 load16_f32(const float* p, __mmask16 m) {
  return Masked ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
}
template <bool Masked>
FT_TARGET_AVX512_BF16 inline __m512bh load32_bf16(const uint16_t* p, __mmask32 m) {
  return (__m512bh)(Masked ? _mm512_maskz_loadu_epi16(m, p) : _mm512_loadu_si512(p));
}

// One chunk of 16 columns at k of dot_row_multi_avx512 (m: its lanes, all of them unless Masked).
template <int N, bool Masked>
FT_TARGET_AVX512 __attribute__((always_inline)) inline void multi_avx512_chunk(const uint16_t* w,
                                                                               const float* const* xs, int k,
                                                                               __mmask16 m, const Prefetch& pf,
                                                                               __m512* acc) {
  if (pf.dist && (k & 31) == 0) pf.ahead(w + k);
  const __m512 wv = load16_bf16_as_f32<Masked>(w + k, m);
  for (int j = 0; j < N; ++j) acc[j] = _mm512_fmadd_ps(wv, load16_f32<Masked>(xs[j] + k, m), acc[j]);
}

template <int N>
FT_TARGET_AVX512 void dot_row_multi_avx512(const uint16_t* w, const float* const* xs, int K, float* out, int os,
                                           const Prefetch& pf) {
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) multi_avx512_chunk<N, false>(w, xs, k, 0xffff, pf, acc);
  if (k < K) multi_avx512_chunk<N, true>(w, xs, k, static_cast<__mmask16>((1u << (K - k)) - 1u), pf, acc);
  for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(acc[j]);
}

template <int N, bool Masked>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void multi_bf16x_chunk(const uint16_t* w,
                                                                                   const uint16_t* const* xs, int k,
                                                                                   __mmask32 m, const Prefetch& pf,
                                                                                   __m512* acc) {
  if (pf.dist) pf.ahead(w + k);
  const __m512bh wv = load32_bf16<Masked>(w + k, m);
  for (int j = 0; j < N; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], wv, load32_bf16<Masked>(xs[j] + k, m));
}

template <int N>
FT_TARGET_AVX512_BF16 void dot_row_multi_bf16x(const uint16_t* w, const uint16_t* const* xs, int K, float* out,
                                               int os, const Prefetch& pf) {
  __m512 acc[N];
  #pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 32 <= K; k += 32) multi_bf16x_chunk<N, false>(w, xs, k, ~0u, pf, acc);
  if (k < K) multi_bf16x_chunk<N, true>(w, xs, k, static_cast<__mmask32>((1u << (K - k)) - 1u), pf, acc);
  for (int j = 0; j < N; ++j) out[j * os] = _mm512_reduce_add_ps(acc[j]);
}

// The accumulators of the row-block kernels below (R rows x N vectors): zeroed, and summed into
// out[j * os + i]. Every loop unrolled, so that GCC keeps them in registers (without the pragmas
// it kept the arrays in memory, a store per accumulator and step).
template <int R, int N>
FT_TARGET_AVX512 inline void block_zero(__m512 (&acc)[R][N]) {
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
  }
}
template <int R, int N>
FT_TARGET_AVX512 inline void block_store(const __m512 (&acc)[R][N], float* out, int os) {
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j * os + i] = _mm512_reduce_add_ps(acc[i][j]);
  }
}

// R rows and N vectors at once: each vector's line is loaded once for the R rows. Zen 4 loads one
// 512-bit line a cycle and runs VDPBF16PS at about one a cycle, and one row with 8 vectors spends 9
// loads on 8 products: from L3 it ran at ~21 cycles per 64 bytes of weights, R = 3 at ~12-15
// (docs/benchmarks.md, fourteenth session). Every (row, vector) sum takes the same products in the
// same order as dot_row_multi_bf16x, so results do not depend on how rows are grouped. Each row
// prefetches the same line of the next block's row at least (the block's R rows span R * ld bytes,
// more than a distance of 8192 with rows of 2048 elements).
template <int N, int R, bool Masked>
FT_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void block_bf16x_chunk(
    const uint16_t* W, size_t ld, const uint16_t* const* xs, int k, __mmask32 m, const Prefetch& pf, size_t lead,
    __m512 (&acc)[R][N]) {
  __m512bh wv[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if (pf.dist) pf.ahead_by(W + i * ld + k, lead);
    wv[i] = load32_bf16<Masked>(W + i * ld + k, m);
  }
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) {
    const __m512bh xv = load32_bf16<Masked>(xs[j] + k, m);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[i], xv);
  }
}

template <int N, int R>
FT_TARGET_AVX512_BF16 void dot_rows_block_bf16x(const uint16_t* W, size_t ld, const uint16_t* const* xs, int K,
                                                float* out, int os, const Prefetch& pf) {
  __m512 acc[R][N];
  block_zero(acc);
  const size_t lead = std::max(static_cast<size_t>(pf.dist), R * ld * sizeof(uint16_t));
  int k = 0;
  for (; k + 32 <= K; k += 32) block_bf16x_chunk<N, R, false>(W, ld, xs, k, ~0u, pf, lead, acc);
  if (k < K) {
    block_bf16x_chunk<N, R, true>(W, ld, xs, k, static_cast<__mmask32>((1u << (K - k)) - 1u), pf, lead, acc);
  }
  block_store(acc, out, os);
}

// Rows per block for N vectors: as many as the 32 zmm registers hold (R * N accumulators, R weight
// lines and a vector line).
constexpr int bf16x_block_rows(int n) { return n <= 6 ? 4 : 3; }

// The avx512 tier's twin of dot_rows_block_bf16x: R rows widened to fp32 once per 16 columns, each
// vector's 16 floats loaded once for the R rows; every (row, vector) sum is dot_row_multi_avx512's
// (one row from L3 on Zen 4: 47 GB/s of weights with one vector, 4.4 with 8 before the blocks).
template <int N, int R, bool Masked>
FT_TARGET_AVX512 __attribute__((always_inline)) inline void block_avx512_chunk(
    const uint16_t* W, size_t ld, const float* const* xs, int k, __mmask16 m, const Prefetch& pf, size_t lead,
    __m512 (&acc)[R][N]) {
  __m512 wv[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if (pf.dist && (k & 31) == 0) pf.ahead_by(W + i * ld + k, lead);
    wv[i] = load16_bf16_as_f32<Masked>(W + i * ld + k, m);
  }
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) {
    const __m512 xv = load16_f32<Masked>(xs[j] + k, m);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
  }
}

template <int N, int R>
FT_TARGET_AVX512 void dot_rows_block_avx512(const uint16_t* W, size_t ld, const float* const* xs, int K, float* out,
                                            int os, const Prefetch& pf) {
  __m512 acc[R][N];
  block_zero(acc);
  const size_t lead = std::max(static_cast<size_t>(pf.dist), R * ld * sizeof(uint16_t));
  int k = 0;
  for (; k + 16 <= K; k += 16) block_avx512_chunk<N, R, false>(W, ld, xs, k, 0xffff, pf, lead, acc);
  if (k < K) {
    block_avx512_chunk<N, R, true>(W, ld, xs, k, static_cast<__mmask16>((1u << (K - k)) - 1u), pf, lead, acc);
  }
  block_store(acc, out, os);
}

#endif  // FT_X86

class Bf16Format final : public MoeFormat {
 public:
  Bf16Format(const MoeParams& p, FormatArgs& args) : p_(p) {
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    w13_ = static_cast<const uint16_t*>(args.require_bank("w13", {E, 2 * I, H}, DType::bf16));
    w2_ = static_cast<const uint16_t*>(args.require_bank("w2", {E, H, I}, DType::bf16));
    b13_ = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
    b2_ = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  }

  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const uint16_t* base = w13_ + static_cast<size_t>(e) * 2 * I * H;
    const int n = i1 - i0;
    gate_up_slices(n, H * 2, 1, [&](int r, int c, bool is_up) {  // gate and up in turns (stream_prefetch.h)
      const uint16_t* w = base + ((is_up ? I : 0) + i0 + r) * H;
      float* out = (is_up ? up : gate) + r;
      if (use_bf16_dot()) {
        bf16_dot_rows_bf16(w, H, c, in.x_bf16 + t * H, H, out, pf_);
      } else {
        bf16_dot_rows_f32(p_.isa, w, H, c, in.x_f32 + t * H, H, out, pf_);
      }
    });
    const float* bg = b13_ ? b13_ + static_cast<size_t>(e) * 2 * I + i0 : nullptr;
    for (int i = 0; i < n; ++i) {
      gate[i] = in_scale * gate[i] + (bg ? bg[i] : 0.f);
      up[i] = in_scale * up[i] + (bg ? bg[I + i] : 0.f);
    }
  }

  void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0, int i1,
                      float* gate, float* up, int stride) const override {
    if (n == 1) {
      gate_up(in, e, tokens[0], i0, i1, in_scales[0], gate, up);
      return;
    }
    const size_t H = p_.hidden, I = p_.intermediate;
    const uint16_t* base = w13_ + static_cast<size_t>(e) * 2 * I * H;
    const int rows = i1 - i0;
    if (use_bf16_dot()) {
      const uint16_t* xs[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) xs[j] = in.x_bf16 + tokens[j] * H;
      bf16_dot_rows_multi_bf16(base + i0 * H, H, rows, xs, n, H, gate, stride, pf_multi_);
      bf16_dot_rows_multi_bf16(base + (I + i0) * H, H, rows, xs, n, H, up, stride, pf_multi_);
    } else {
      const float* xs[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) xs[j] = in.x_f32 + tokens[j] * H;
      bf16_dot_rows_multi_f32(p_.isa, base + i0 * H, H, rows, xs, n, H, gate, stride, pf_multi_);
      bf16_dot_rows_multi_f32(p_.isa, base + (I + i0) * H, H, rows, xs, n, H, up, stride, pf_multi_);
    }
    const float* bg = b13_ ? b13_ + static_cast<size_t>(e) * 2 * I + i0 : nullptr;
    for (int j = 0; j < n; ++j) {
      float* g = gate + j * stride;
      float* u = up + j * stride;
      for (int i = 0; i < rows; ++i) {
        g[i] = in_scales[j] * g[i] + (bg ? bg[i] : 0.f);
        u[i] = in_scales[j] * u[i] + (bg ? bg[I + i] : 0.f);
      }
    }
  }

  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    const uint16_t* w = w2_ + static_cast<size_t>(e) * H * I + static_cast<size_t>(h0) * I;
    if (n == 1) {
      if (use_bf16_dot()) {
        bf16_dot_rows_bf16(w, I, rows, static_cast<const uint16_t*>(routes[0].h_prepped), I, out, pf_);
      } else {
        bf16_dot_rows_f32(p_.isa, w, I, rows, routes[0].h, I, out, pf_);
      }
    } else if (use_bf16_dot()) {
      const uint16_t* hs[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) hs[j] = static_cast<const uint16_t*>(routes[j].h_prepped);
      bf16_dot_rows_multi_bf16(w, I, rows, hs, n, I, out, stride, pf_multi_);
    } else {
      const float* hs[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) hs[j] = routes[j].h;
      bf16_dot_rows_multi_f32(p_.isa, w, I, rows, hs, n, I, out, stride, pf_multi_);
    }
    if (b2_) {
      const float* b = b2_ + static_cast<size_t>(e) * H + h0;
      for (int j = 0; j < n; ++j) {
        for (int r = 0; r < rows; ++r) out[j * stride + r] += b[r];
      }
    }
  }

  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    return gate_up_down_streams(pass2, w13_, p_.hidden * sizeof(uint16_t), w2_, p_.intermediate * sizeof(uint16_t),
                                p_.intermediate, p_.hidden, e, r0, r1, out);
  }

  size_t inter_prep_bytes() const override { return use_bf16_dot() ? p_.intermediate * sizeof(uint16_t) : 0; }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
    uint16_t* hb = static_cast<uint16_t*>(prepped);
    for (int i = i0; i < i1; ++i) hb[i] = f32_to_bf16(h[i]);
  }

  // prep_inter converts each element on its own, so any block works: 256 rows lets pass-1 units grow
  // where a run has few experts per thread (executor.cpp's pass1_rows_for), as fp8_block's do.
  int prep_rows() const override { return 256; }
  int pass2_rows() const override { return kMaxPass2Rows; }
  // Measured on the GPU machine's 16-core Xeon, batch 1, one level -> two: 0.79 -> 0.89 of the read
  // bandwidth at 8 threads (2 rounds), 0.87 -> 0.93 at 15 and 0.89 -> 0.91 at 16 (medians of 3;
  // docs/benchmarks.md, tenth session).
  bool two_level_prefetch_any_pool(int /*vectors*/) const override { return true; }
  // No software prefetch in one-vector calls on AMD unless the caller sets a distance: there a single
  // row stream reaches the read bandwidth on its own, and prefetching cost 5-10% (Zen 5, one level)
  // and 7% (Zen 4, 2 threads, 8192 with the L1 level). Calls over several vectors read their rows
  // slower and do gain from it: Zen 4, 2 threads, batch 8 sharing its experts, 4843 -> 3667 us a
  // step (docs/benchmarks.md, fourteenth session).
  int prefetch_bytes(const MoeParams& p, int vectors) const override {
    return p.prefetch_explicit || cpu_is_intel() || vectors > 1 ? p.prefetch : 0;
  }

 private:
  static constexpr int kMaxPass2Rows = 16;
  bool use_bf16_dot() const { return p_.isa == Isa::avx512_bf16; }

  MoeParams p_;
  // after p_ (declaration order): one-vector calls, and calls over several vectors
  int pf_ = Bf16Format::prefetch_bytes(p_, 1), pf_multi_ = Bf16Format::prefetch_bytes(p_, kMaxTokensPerCall);
  const uint16_t* w13_;
  const uint16_t* w2_;
  const float* b13_;
  const float* b2_;
};

// The rows of one call are one stream (contiguous when ld == K).
Prefetch stream_prefetch(const uint16_t* W, size_t ld, int nrows, int K, int dist) {
  return Prefetch(W, rows_stream_bytes(2 * ld, nrows, 2 * static_cast<size_t>(K)), dist);
}

}  // namespace

void bf16_dot_rows_f32(Isa isa, const uint16_t* W, size_t ld, int nrows, const float* x, int K, float* out,
                       int prefetch) {
#if FT_X86
  const Prefetch pf = stream_prefetch(W, ld, nrows, K, prefetch);
  switch (isa) {
    case Isa::avx512_bf16:
    case Isa::avx512:
      dot_rows_avx512(W, ld, nrows, x, K, out, pf);
      return;
    case Isa::avx2:
      dot_rows_avx2(W, ld, nrows, x, K, out, pf);
      return;
    case Isa::scalar:
      break;
  }
#else
  (void)isa;
#endif
  (void)prefetch;
  dot_rows_scalar(W, ld, nrows, x, K, out);
}

void bf16_dot_rows_bf16(const uint16_t* W, size_t ld, int nrows, const uint16_t* x, int K, float* out,
                        int prefetch) {
#if FT_X86
  const Prefetch pf = stream_prefetch(W, ld, nrows, K, prefetch);
  for (int r = 0; r < nrows; ++r) out[r] = dot_row_bf16x(W + r * ld, x, K, pf);
#else
  (void)W, (void)ld, (void)nrows, (void)x, (void)K, (void)out, (void)prefetch;
  throw Error("bf16_dot_rows_bf16 needs x86 AVX512-BF16");
#endif
}

void bf16_dot_rows_multi_f32(Isa isa, const uint16_t* W, size_t ld, int nrows, const float* const* xs, int n, int K,
                             float* out, int out_stride, int prefetch) {
  const Prefetch pf = stream_prefetch(W, ld, nrows, K, prefetch);
#if FT_X86
  if (isa == Isa::avx512 || isa == Isa::avx512_bf16) {
    dispatch_n(n, [&](auto nv) {
      constexpr int N = decltype(nv)::value;
      constexpr int R = bf16x_block_rows(N);
      int r = 0;
      if constexpr (N >= 2) {
        for (; r + R <= nrows; r += R) dot_rows_block_avx512<N, R>(W + r * ld, ld, xs, K, out + r, out_stride, pf);
      }
      for (; r < nrows; ++r) dot_row_multi_avx512<N>(W + r * ld, xs, K, out + r, out_stride, pf);
    });
    return;
  }
#endif
#if FT_X86
  if (isa == Isa::avx2) {
    // Where the vectors are more than a 32 KiB L1d holds: rows two at a time against up to 6
    // vectors; 7 or 8 as two sets (4 and the rest), each set's vectors loaded once per row pair; a
    // last odd row alone. Vectors that fit L1 take one row at a time (Zen 3, 8 vectors of 768: the
    // blocks were 5-15% slower there, and 1.3x faster for 8 of 2048; docs/benchmarks.md).
    int r = 0;
    if (n >= 2 && static_cast<size_t>(n) * K * sizeof(float) > 32768) {
      for (; r + 2 <= nrows; r += 2) {
        const uint16_t* w = W + r * ld;
        for (int j0 = 0; j0 < n; j0 += n <= 6 ? n : 4) {
          const int m = std::min(n - j0, n <= 6 ? n : 4);
          dispatch_n(m, [&](auto nv) {
            constexpr int N = decltype(nv)::value;
            // m <= 6 by construction (n <= 6 in one set, else sets of 4 and n - 4 <= 4)
            if constexpr (N <= 6) dot_rows_block_avx2<N, 2>(w, ld, xs + j0, K, out + r + j0 * out_stride, out_stride, pf);
          });
        }
      }
    }
    for (; r < nrows; ++r) {
      dispatch_n(n, [&](auto nv) {
        dot_row_multi_avx2<decltype(nv)::value>(W + r * ld, xs, K, out + r, out_stride, pf);
      });
    }
    return;
  }
#endif
  for (int r = 0; r < nrows; ++r) {
    const uint16_t* w = W + r * ld;
    for (int j = 0; j < n; ++j) dot_rows_scalar(w, ld, 1, xs[j], K, out + r + j * out_stride);
  }
}

void bf16_dot_rows_multi_bf16(const uint16_t* W, size_t ld, int nrows, const uint16_t* const* xs, int n, int K,
                              float* out, int out_stride, int prefetch) {
#if FT_X86
  const Prefetch pf = stream_prefetch(W, ld, nrows, K, prefetch);
  dispatch_n(n, [&](auto nv) {
    constexpr int N = decltype(nv)::value;
    constexpr int R = bf16x_block_rows(N);
    int r = 0;
    for (; r + R <= nrows; r += R) dot_rows_block_bf16x<N, R>(W + r * ld, ld, xs, K, out + r, out_stride, pf);
    for (; r < nrows; ++r) dot_row_multi_bf16x<N>(W + r * ld, xs, K, out + r, out_stride, pf);
  });
#else
  (void)W, (void)ld, (void)nrows, (void)xs, (void)n, (void)K, (void)out, (void)out_stride, (void)prefetch;
  throw Error("bf16_dot_rows_multi_bf16 needs x86 AVX512-BF16");
#endif
}

static std::unique_ptr<MoeFormat> make_bf16_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Bf16Format>(params, args);
}

FT_REGISTER_FORMAT("bf16", &make_bf16_format);

}  // namespace ft
