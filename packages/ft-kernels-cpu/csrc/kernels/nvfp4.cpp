// nvfp4: NVIDIA ModelOpt NVFP4 expert weights. e2m1 values packed two per byte (low nibble = element
// 2j, high nibble = element 2j+1), one e4m3fn scale per 16 consecutive elements of a row, and an f32
// global scale per row (ModelOpt's per-tensor `weight_scale_2`, repeated over the rows; per row lets
// gate and up keep their own in one bank): w = e2m1 * e4m3_scale * global.
//
// Banks (E experts, H hidden, I intermediate; H and I multiples of 16):
//   w13          [E, 2I, H/2]   u8   e2m1 pairs; gate rows 0..I-1, then up rows I..2I-1
//   w13_scale    [E, 2I, H/16]  u8   e4m3fn bits
//   w13_scale_2  [E, 2I]        f32
//   w2           [E, H, I/2]    u8
//   w2_scale     [E, H, I/16]   u8
//   w2_scale_2   [E, H]         f32
//   w13_bias     [E, 2I]        f32  optional
//   w2_bias      [E, H]         f32  optional
//
// Kernels: the low and high nibbles of a run of bytes are looked up separately (16-entry table in a
// register), giving the even and the odd elements of a chunk; the vector tiers therefore take x (and
// the intermediate) with every chunk of 32 elements (16 for a last one) rearranged as its evens then
// its odds, prepared once per task (prep_input) and once per route (prep_inter).
#include <algorithm>
#include <string>

#include "format.h"
#include "kernels/fp8nv_common.h"

namespace ft {

namespace {

using fp8nv::Prefetch;

constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// dst = src with each chunk [c, c + 32) (or a last [c, c + 16)) of [k0, k1) as evens then odds;
// k0 is a multiple of 32, k1 - k0 a multiple of 16.
void to_even_odd(const float* src, float* dst, int k0, int k1) {
  for (int c = k0; c < k1; c += 32) {
    const int half = std::min(32, k1 - c) / 2;
    for (int j = 0; j < half; ++j) {
      dst[c + j] = src[c + 2 * j];
      dst[c + half + j] = src[c + 2 * j + 1];
    }
  }
}

// The bf16 tier's order: each chunk [c, c + L) of `len` elements (L = 128, or what is left) as 4
// runs of L/4: run q holds elements c + 4k + q. src and dst start at a multiple of 128 of the row;
// len is a multiple of 16.
void to_word_nibble_bf16(const uint16_t* src, uint16_t* dst, int len) {
  for (int c = 0; c < len; c += 128) {
    const int n = std::min(128, len - c) / 4;
    for (int q = 0; q < 4; ++q) {
      for (int k = 0; k < n; ++k) dst[c + q * n + k] = src[c + 4 * k + q];
    }
  }
}

// One row in natural element order: sum_g e4m3(sc[g]) * sum_{k in group g} e2m1(k) * x[k].
float nvfp4_row_scalar(const uint8_t* w, const uint8_t* sc, const float* x, int K) {
  const float* lut = fp8nv::e4m3_table().v;
  float tot = 0.f;
  for (int g = 0; g < K / 16; ++g) {
    float acc = 0.f;
    for (int j = 0; j < 8; ++j) {
      const uint8_t b = w[8 * g + j];
      acc += kE2m1[b & 15] * x[16 * g + 2 * j] + kE2m1[b >> 4] * x[16 * g + 2 * j + 1];
    }
    tot += lut[sc[g]] * acc;
  }
  return tot;
}

#if FT_X86

// Twice the e2m1 values as int8 (all integers), for VPSHUFB.
FT_TARGET_AVX2 inline __m128i e2m1x2_lut_i8() {
  return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// One row, x in even/odd chunk order. Per 32 elements: the 16 bytes' nibbles -> int8 (2 * e2m1) by
// VPSHUFB, widened to fp32 8 at a time; the group scale (halved for the factor 2) is a broadcast.
FT_TARGET_AVX2 float nvfp4_row_avx2(const uint8_t* w, const uint8_t* sc, const float* xp, int K,
                                    const Prefetch& pf) {
  const float* lut = fp8nv::e4m3_table().v;
  const __m128i tab = e2m1x2_lut_i8(), low4 = _mm_set1_epi8(0x0f);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    if ((k & 127) == 0) pf.ahead(w + k / 2);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    const __m256 lo0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 lo1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    const __m256 hi0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 hi1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    const __m256 p0 = _mm256_fmadd_ps(hi0, _mm256_loadu_ps(xp + k + 16), _mm256_mul_ps(lo0, _mm256_loadu_ps(xp + k)));
    const __m256 p1 =
        _mm256_fmadd_ps(hi1, _mm256_loadu_ps(xp + k + 24), _mm256_mul_ps(lo1, _mm256_loadu_ps(xp + k + 8)));
    acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(lut[sc[k / 16]]), acc0);
    acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(lut[sc[k / 16 + 1]]), acc1);
  }
  if (k < K) {  // a last group of 16: evens in xp[k, k + 8), odds in xp[k + 8, k + 16)
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    const __m256 p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(xp + k + 8),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(xp + k)));
    acc0 = _mm256_fmadd_ps(p, _mm256_set1_ps(lut[sc[k / 16]]), acc0);
  }
  return fp8nv::hsum8(_mm256_add_ps(acc0, acc1)) * 0.5f;
}

// One row, x in even/odd chunk order. Per 32 elements (16 bytes, two groups): the bytes widened to
// 16 lanes, VPERMPS with the 16 e2m1 values looks up the low nibbles (it reads index bits 3..0)
// and, after a shift, the high ones; lanes 0..7 are group 2j, lanes 8..15 group 2j+1, scaled by a
// permutation of 16 scales decoded together per 256 elements.
FT_TARGET_AVX512 float nvfp4_row_avx512(const uint8_t* w, const uint8_t* sc, const float* xp, int K,
                                       const Prefetch& pf) {
  const __m512 tab = _mm512_loadu_ps(kE2m1);
  const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i two = _mm512_set1_epi32(2);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int k = 0;
  for (; k + 256 <= K; k += 256) {
    const uint8_t* wb = w + k / 2;
    const float* xb = xp + k;
    if (pf.dist) {
      pf.ahead(wb);
      pf.ahead(wb + 64);
    }
    // 16 group scales (times 2^-8, see fp8nv_common.h).
    const __m512 S = fp8nv::e4m3x16_avx512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + k / 16)));
    __m512i idx = pair0;
    for (int j = 0; j < 8; j += 2) {
      const __m512i d0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 16 * j)));
      const __m512i d1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 16 * j + 16)));
      __m512 p0 = _mm512_mul_ps(_mm512_permutexvar_ps(d0, tab), _mm512_loadu_ps(xb + 32 * j));
      __m512 p1 = _mm512_mul_ps(_mm512_permutexvar_ps(d1, tab), _mm512_loadu_ps(xb + 32 * j + 32));
      p0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d0, 4), tab), _mm512_loadu_ps(xb + 32 * j + 16), p0);
      p1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d1, 4), tab), _mm512_loadu_ps(xb + 32 * j + 48), p1);
      acc0 = _mm512_fmadd_ps(p0, _mm512_permutexvar_ps(idx, S), acc0);
      idx = _mm512_add_epi32(idx, two);
      acc1 = _mm512_fmadd_ps(p1, _mm512_permutexvar_ps(idx, S), acc1);
      idx = _mm512_add_epi32(idx, two);
    }
  }
  const float* lut = fp8nv::e4m3_table().v;
  constexpr float kDown = 1.f / fp8nv::kE4m3Fp16Unscale;  // table scales to the 2^-8 of the vector ones
  for (; k + 32 <= K; k += 32) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2)));
    __m512 p = _mm512_mul_ps(_mm512_permutexvar_ps(d, tab), _mm512_loadu_ps(xp + k));
    p = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab), _mm512_loadu_ps(xp + k + 16), p);
    const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(lut[sc[k / 16]] * kDown),
                                         _mm256_set1_ps(lut[sc[k / 16 + 1]] * kDown), 1);
    acc0 = _mm512_fmadd_ps(p, sv, acc0);
  }
  if (k < K) {  // a last group of 16: lanes 0..7 only
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k / 2)));
    __m512 p = _mm512_mul_ps(_mm512_permutexvar_ps(d, tab), _mm512_maskz_loadu_ps(0xff, xp + k));
    p = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab), _mm512_maskz_loadu_ps(0xff, xp + k + 8),
                        p);
    acc0 = _mm512_fmadd_ps(p, _mm512_set1_ps(lut[sc[k / 16]] * kDown), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) * fp8nv::kE4m3Fp16Unscale;
}

// bf16 of the 16 e2m1 values (exact), for VPERMW.
FT_TARGET_AVX512_BF16 inline __m512i e2m1_bf16_lut() {
  return _mm512_setr_epi32(0x3F000000, 0x3FC03F80, 0x40404000, 0x40C04080, 0xBF008000, 0xBFC0BF80, 0xC040C000,
                           0xC0C0C080, 0x3F000000, 0x3FC03F80, 0x40404000, 0x40C04080, 0xBF008000, 0xBFC0BF80,
                           0xC040C000, 0xC0C0C080);
}

// One row with VDPBF16PS, x as bf16 in word-nibble chunk order (to_word_nibble_bf16). Per chunk of
// 128 elements (64 bytes, or a last shorter one under masks): as 32 words, word k holds elements
// 4k..4k+3 in its four nibbles; nibble q of every word, looked up by VPERMW, is the bf16 vector of
// elements 4k+q, and x's chunk holds the matching 4 vectors. Dword lane i of the dot products sums
// elements 8i+q and 8i+4+q: group i/2 of the chunk, whose scale a duplicated decode supplies.
FT_TARGET_AVX512_BF16 float nvfp4_row_bf16x(const uint8_t* w, const uint8_t* sc, const uint16_t* xb, int K,
                                           const Prefetch& pf) {
  const __m512i lut = e2m1_bf16_lut(), nib = _mm512_set1_epi16(0x000f);
  __m512 acc = _mm512_setzero_ps();
  for (int c = 0; c < K; c += 128) {
    const int L = std::min(128, K - c), n = L / 4;  // words per nibble vector
    const __mmask32 m = n == 32 ? 0xffffffffu : static_cast<__mmask32>((1u << n) - 1u);
    const uint8_t* wb = w + c / 2;
    const uint16_t* x = xb + c;
    if (pf.dist) pf.ahead(wb);
    const __m512i b = _mm512_maskz_loadu_epi16(m, wb);
    const __m512i w0 = _mm512_permutexvar_epi16(_mm512_and_si512(b, nib), lut);
    const __m512i w1 = _mm512_permutexvar_epi16(_mm512_and_si512(_mm512_srli_epi16(b, 4), nib), lut);
    const __m512i w2 = _mm512_permutexvar_epi16(_mm512_and_si512(_mm512_srli_epi16(b, 8), nib), lut);
    const __m512i w3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(b, 12), lut);
    __m512 t0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w0, (__m512bh)_mm512_maskz_loadu_epi16(m, x));
    __m512 t1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w2, (__m512bh)_mm512_maskz_loadu_epi16(m, x + 2 * n));
    t0 = _mm512_dpbf16_ps(t0, (__m512bh)w1, (__m512bh)_mm512_maskz_loadu_epi16(m, x + n));
    t1 = _mm512_dpbf16_ps(t1, (__m512bh)w3, (__m512bh)_mm512_maskz_loadu_epi16(m, x + 3 * n));
    // Scales of the chunk's L/16 groups, each twice: lanes 2g and 2g+1 (times 2^-8).
    const __m128i s8 = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << (L / 16)) - 1u), sc + c / 16);
    const __m512 sv = fp8nv::e4m3x16_avx512(_mm_unpacklo_epi8(s8, s8));
    acc = _mm512_fmadd_ps(_mm512_add_ps(t0, t1), sv, acc);
  }
  return _mm512_reduce_add_ps(acc) * fp8nv::kE4m3Fp16Unscale;
}

#endif  // FT_X86

// Rows of one matrix: W (K/2 bytes a row), SC (K/16 scale bytes a row) and G (global scale per row)
// all point at the first row. x: fp32 in natural order (scalar), fp32 in even/odd chunk order (avx2,
// avx512), bf16 in word-nibble chunk order (avx512_bf16).
void nvfp4_rows(Isa isa, const uint8_t* W, const uint8_t* SC, const float* G, int nrows, const void* x, int K,
                float* out, int prefetch) {
  const size_t ldw = static_cast<size_t>(K) / 2, lds = static_cast<size_t>(K) / 16;
#if FT_X86
  if (isa == Isa::avx512_bf16) {
    const Prefetch pf(W, W + nrows * ldw, prefetch);
    const uint16_t* xb = static_cast<const uint16_t*>(x);
    for (int r = 0; r < nrows; ++r) out[r] = nvfp4_row_bf16x(W + r * ldw, SC + r * lds, xb, K, pf) * G[r];
    return;
  }
  if (isa != Isa::scalar) {
    const Prefetch pf(W, W + nrows * ldw, prefetch);
    for (int r = 0; r < nrows; ++r) {
      const float* xf = static_cast<const float*>(x);
      const float d = isa >= Isa::avx512 ? nvfp4_row_avx512(W + r * ldw, SC + r * lds, xf, K, pf)
                                         : nvfp4_row_avx2(W + r * ldw, SC + r * lds, xf, K, pf);
      out[r] = d * G[r];
    }
    return;
  }
#endif
  (void)prefetch;
  const float* xf = static_cast<const float*>(x);
  for (int r = 0; r < nrows; ++r) out[r] = nvfp4_row_scalar(W + r * ldw, SC + r * lds, xf, K) * G[r];
}

class Nvfp4Format final : public MoeFormat {
 public:
  Nvfp4Format(const MoeParams& p, FormatArgs& args) : p_(p) {
    if (p.hidden % 16 != 0 || p.intermediate % 16 != 0) {
      throw Error(args.context() + ": nvfp4 needs hidden and intermediate to be multiples of 16 (one e4m3 " +
                  "scale per 16 elements), got hidden=" + std::to_string(p.hidden) +
                  ", intermediate=" + std::to_string(p.intermediate));
    }
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H / 2}, DType::u8));
    s13_ = static_cast<const uint8_t*>(args.require_bank("w13_scale", {E, 2 * I, H / 16}, DType::u8));
    g13_ = static_cast<const float*>(args.require_bank("w13_scale_2", {E, 2 * I}, DType::f32));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I / 2}, DType::u8));
    s2_ = static_cast<const uint8_t*>(args.require_bank("w2_scale", {E, H, I / 16}, DType::u8));
    g2_ = static_cast<const float*>(args.require_bank("w2_scale_2", {E, H}, DType::f32));
    b13_ = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
    b2_ = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  }

  // Each pass-1 unit's intermediate rows are whole chunks of the tier's order (32 or 128).
  int pass1_rows() const override { return bf16x() ? 128 : 32; }
  int pass2_rows() const override { return kPass2Rows; }

  void prep_input(const TaskInput& in) override {
    const size_t H = p_.hidden;
    if (bf16x()) {
      xb_.resize(static_cast<size_t>(in.num_tokens) * H);
      for (int t = 0; t < in.num_tokens; ++t) to_word_nibble_bf16(in.x_bf16 + t * H, xb_.data() + t * H, p_.hidden);
      return;
    }
    if (!permuted()) return;
    xp_.resize(static_cast<size_t>(in.num_tokens) * H);
    for (int t = 0; t < in.num_tokens; ++t) to_even_odd(in.x_f32 + t * H, xp_.data() + t * H, 0, p_.hidden);
  }

  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const size_t row_g = static_cast<size_t>(e) * 2 * I + i0, row_u = row_g + I;
    const void* x = bf16x() ? static_cast<const void*>(xb_.data() + t * H)
                            : static_cast<const void*>((permuted() ? xp_.data() : in.x_f32) + t * H);
    const int n = i1 - i0, K = p_.hidden;
    nvfp4_rows(p_.isa, w13_ + row_g * (H / 2), s13_ + row_g * (H / 16), g13_ + row_g, n, x, K, gate, p_.prefetch);
    nvfp4_rows(p_.isa, w13_ + row_u * (H / 2), s13_ + row_u * (H / 16), g13_ + row_u, n, x, K, up, p_.prefetch);
    const float* bg = b13_ ? b13_ + row_g : nullptr;
    for (int i = 0; i < n; ++i) {
      gate[i] = in_scale * gate[i] + (bg ? bg[i] : 0.f);
      up[i] = in_scale * up[i] + (bg ? bg[I + i] : 0.f);
    }
  }

  size_t inter_prep_bytes() const override {
    return bf16x() ? p_.intermediate * sizeof(uint16_t) : permuted() ? p_.intermediate * sizeof(float) : 0;
  }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
    if (bf16x()) {
      uint16_t hb[128];
      for (int i = i0; i < i1; ++i) hb[i - i0] = f32_to_bf16(h[i]);
      to_word_nibble_bf16(hb, static_cast<uint16_t*>(prepped) + i0, i1 - i0);
    } else {
      to_even_odd(h, static_cast<float*>(prepped), i0, i1);
    }
  }

  void down(int h0, int h1, const RouteRef* routes, int n, float* out) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    float tmp[kPass2Rows];
    std::fill(out, out + rows, 0.f);
    for (int r = 0; r < n; ++r) {
      const RouteRef& rt = routes[r];
      const size_t row = static_cast<size_t>(rt.expert) * H + h0;
      const void* h = permuted() ? rt.h_prepped : static_cast<const void*>(rt.h);
      nvfp4_rows(p_.isa, w2_ + row * (I / 2), s2_ + row * (I / 16), g2_ + row, rows, h, p_.intermediate, tmp,
                 p_.prefetch);
      const float* b = b2_ ? b2_ + row : nullptr;
      for (int j = 0; j < rows; ++j) out[j] += rt.weight * (tmp[j] + (b ? b[j] : 0.f));
    }
  }

 private:
  static constexpr int kPass2Rows = 16;
  bool permuted() const { return p_.isa != Isa::scalar; }
  bool bf16x() const { return p_.isa == Isa::avx512_bf16; }

  MoeParams p_;
  const uint8_t* w13_;
  const uint8_t* s13_;
  const float* g13_;
  const uint8_t* w2_;
  const uint8_t* s2_;
  const float* g2_;
  const float* b13_;
  const float* b2_;
  AlignedBuffer<float> xp_;     // x in even/odd chunk order, [T, H] (avx2, avx512)
  AlignedBuffer<uint16_t> xb_;  // x as bf16 in word-nibble chunk order, [T, H] (avx512_bf16)
};

std::unique_ptr<MoeFormat> make_nvfp4_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Nvfp4Format>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("nvfp4", &make_nvfp4_format);

}  // namespace ft
