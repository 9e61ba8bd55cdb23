// fp8_block: e4m3fn expert weights with 2-D block scales, as DeepSeek-V3 and Qwen3-FP8 checkpoints
// ship them (`weight` e4m3fn + `weight_scale_inv` f32); w = fp8 * scale[row_block, col_block].
//
// Banks (E experts, H hidden, I intermediate, B = option block_size (default 128), nb(n) = ceil(n/B)):
//   w13        [E, 2I, H]                u8   e4m3fn bits; gate rows 0..I-1, then up rows I..2I-1
//   w13_scale  [E, 2*nb(I), nb(H)]       f32  gate row-blocks, then up row-blocks (a checkpoint's
//                                             gate and up scales concatenated, even when I % B != 0)
//   w2         [E, H, I]                 u8   e4m3fn bits
//   w2_scale   [E, nb(H), nb(I)]         f32
//   w13_bias   [E, 2I]                   f32  optional
//   w2_bias    [E, H]                    f32  optional
//
// Kernels: one row at a time in address order (see bf16.cpp). Per column block the fp8 x fp32
// products are summed in fp32 vectors, then scaled by the block's scale into a running total.
// Decoding is in registers (fp8nv_common.h: byte -> fp16 fields -> VCVTPH2PS).
#include <algorithm>
#include <cmath>

#include "format.h"
#include "kernels/fp8nv_common.h"

namespace ft {

namespace {

using fp8nv::Prefetch;

// One row: sum over column blocks c of S[c] * sum_{k in c} e4m3(w[k]) * x[k].
float fp8_row_scalar(const uint8_t* w, const float* S, int B, const float* x, int K) {
  const float* lut = fp8nv::e4m3_table().v;
  float tot = 0.f;
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    float acc = 0.f;
    for (int k = 0; k < n; ++k) acc += lut[w[c0 + k]] * x[c0 + k];
    tot += S[c] * acc;
  }
  return tot;
}

#if FT_X86

FT_TARGET_AVX2 float fp8_row_avx2(const uint8_t* w, const float* S, int B, const float* x, int K,
                                  const Prefetch& pf) {
  __m256 tot = _mm256_setzero_ps();
  const float* lut = fp8nv::e4m3_table().v;
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    const uint8_t* wb = w + c0;
    const float* xb = x + c0;
    pf.ahead_range(wb, n);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 32 <= n; k += 32) {
      __m256 w0, w1, w2, w3;
      fp8nv::e4m3x16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + k)), w0, w1);
      fp8nv::e4m3x16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + k + 16)), w2, w3);
      a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb + k), a0);
      a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + k + 8), a1);
      a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + k + 16), a2);
      a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + k + 24), a3);
    }
    for (; k + 16 <= n; k += 16) {
      __m256 w0, w1;
      fp8nv::e4m3x16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + k)), w0, w1);
      a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb + k), a0);
      a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + k + 8), a1);
    }
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    if (k < n) {
      float r = 0.f;
      for (; k < n; ++k) r += lut[wb[k]] * xb[k];
      // The vector part carries the 2^-8 of the fp16 decode; bring the remainder to the same scale.
      a = _mm256_add_ps(a, _mm256_setr_ps(r / fp8nv::kE4m3Fp16Unscale, 0, 0, 0, 0, 0, 0, 0));
    }
    tot = _mm256_fmadd_ps(a, _mm256_set1_ps(S[c]), tot);
  }
  return fp8nv::hsum8(tot) * fp8nv::kE4m3Fp16Unscale;
}

FT_TARGET_AVX512 float fp8_row_avx512(const uint8_t* w, const float* S, int B, const float* x, int K,
                                     const Prefetch& pf) {
  __m512 tot = _mm512_setzero_ps();
  for (int c0 = 0, c = 0; c0 < K; c0 += B, ++c) {
    const int n = std::min(B, K - c0);
    const uint8_t* wb = w + c0;
    const float* xb = x + c0;
    pf.ahead_range(wb, n);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 64 <= n; k += 64) {
      __m512 w0, w1, w2, w3;
      fp8nv::e4m3x32_avx512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k)), w0, w1);
      fp8nv::e4m3x32_avx512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k + 32)), w2, w3);
      a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb + k), a0);
      a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + k + 16), a1);
      a2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xb + k + 32), a2);
      a3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xb + k + 48), a3);
    }
    for (; k < n; k += 16) {
      const int r = std::min(16, n - k);
      const __mmask16 m = static_cast<__mmask16>((1u << r) - 1u);
      const __m512 wv = fp8nv::e4m3x16_avx512(_mm_maskz_loadu_epi8(m, wb + k));
      a0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xb + k), a0);
    }
    const __m512 a = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    tot = _mm512_fmadd_ps(a, _mm512_set1_ps(S[c]), tot);
  }
  return _mm512_reduce_add_ps(tot) * fp8nv::kE4m3Fp16Unscale;
}

#endif  // FT_X86

// Rows r0..r0+nrows-1 of one matrix: W points at row r0 (row stride K bytes); S is the matrix's
// scale grid [nb(rows), nb(K)] whose row-block (r0 + r) / B scales row r.
void fp8_rows(Isa isa, const uint8_t* W, int r0, int nrows, const float* S, int B, const float* x, int K,
              float* out, int prefetch) {
  const int nbK = (K + B - 1) / B;
  const size_t ld = static_cast<size_t>(K);
#if FT_X86
  if (isa != Isa::scalar) {
    const Prefetch pf(W, W + nrows * ld, prefetch);
    for (int r = 0; r < nrows; ++r) {
      const float* s = S + static_cast<size_t>((r0 + r) / B) * nbK;
      out[r] = isa >= Isa::avx512 ? fp8_row_avx512(W + r * ld, s, B, x, K, pf)
                                  : fp8_row_avx2(W + r * ld, s, B, x, K, pf);
    }
    return;
  }
#endif
  (void)prefetch;
  for (int r = 0; r < nrows; ++r) {
    out[r] = fp8_row_scalar(W + r * ld, S + static_cast<size_t>((r0 + r) / B) * nbK, B, x, K);
  }
}

int checked_block_size(FormatArgs& args) {
  const double b = args.option_or("block_size", 128);
  if (!(b >= 1 && b <= 65536) || b != std::floor(b)) {
    throw Error(args.context() + ": option 'block_size' must be an integer in [1, 65536] (rows and columns " +
                "per scale block), got " + std::to_string(b));
  }
  return static_cast<int>(b);
}

class Fp8BlockFormat final : public MoeFormat {
 public:
  Fp8BlockFormat(const MoeParams& p, FormatArgs& args) : p_(p), B_(checked_block_size(args)) {
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    nbH_ = (p.hidden + B_ - 1) / B_;
    nbI_ = (p.intermediate + B_ - 1) / B_;
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H}, DType::u8));
    s13_ = static_cast<const float*>(args.require_bank("w13_scale", {E, 2LL * nbI_, nbH_}, DType::f32));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I}, DType::u8));
    s2_ = static_cast<const float*>(args.require_bank("w2_scale", {E, nbH_, nbI_}, DType::f32));
    b13_ = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
    b2_ = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  }

  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const uint8_t* base = w13_ + static_cast<size_t>(e) * 2 * I * H;
    const float* sg = s13_ + static_cast<size_t>(e) * 2 * nbI_ * nbH_;
    const float* su = sg + static_cast<size_t>(nbI_) * nbH_;
    const float* x = in.x_f32 + t * H;
    const int n = i1 - i0;
    fp8_rows(p_.isa, base + i0 * H, i0, n, sg, B_, x, static_cast<int>(H), gate, p_.prefetch);
    fp8_rows(p_.isa, base + (I + i0) * H, i0, n, su, B_, x, static_cast<int>(H), up, p_.prefetch);
    const float* bg = b13_ ? b13_ + static_cast<size_t>(e) * 2 * I + i0 : nullptr;
    for (int i = 0; i < n; ++i) {
      gate[i] = in_scale * gate[i] + (bg ? bg[i] : 0.f);
      up[i] = in_scale * up[i] + (bg ? bg[I + i] : 0.f);
    }
  }

  void down(int h0, int h1, const RouteRef* routes, int n, float* out) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    float tmp[kPass2Rows];
    std::fill(out, out + rows, 0.f);
    for (int r = 0; r < n; ++r) {
      const RouteRef& rt = routes[r];
      const uint8_t* w = w2_ + static_cast<size_t>(rt.expert) * H * I + static_cast<size_t>(h0) * I;
      const float* s = s2_ + static_cast<size_t>(rt.expert) * nbH_ * nbI_;
      fp8_rows(p_.isa, w, h0, rows, s, B_, rt.h, static_cast<int>(I), tmp, p_.prefetch);
      const float* b = b2_ ? b2_ + static_cast<size_t>(rt.expert) * H + h0 : nullptr;
      for (int j = 0; j < rows; ++j) out[j] += rt.weight * (tmp[j] + (b ? b[j] : 0.f));
    }
  }

  int pass2_rows() const override { return kPass2Rows; }

 private:
  static constexpr int kPass2Rows = 16;

  MoeParams p_;
  int B_;
  int nbH_ = 0, nbI_ = 0;
  const uint8_t* w13_;
  const float* s13_;
  const uint8_t* w2_;
  const float* s2_;
  const float* b13_;
  const float* b2_;
};

std::unique_ptr<MoeFormat> make_fp8_block_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Fp8BlockFormat>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("fp8_block", &make_fp8_block_format);

}  // namespace ft
