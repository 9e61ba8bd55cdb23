// The ggml block types of ggml_blocks.h: scalar kernels, the SIMD tiers (ggml_tier_kernels.h compiled
// for AVX2 and AVX-512), the type table and the format class shared by `q4_0` and `gguf`.
#include "ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bf16_dot.h"

namespace ft {
namespace ggml {

namespace {

// IEEE half to float, exactly (normals, subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ggml's e8m0 "half" scale of MXFP4 (the e2m1 table is doubled): 2^(e - 128).
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The 8 6-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes).
inline void kquant_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Software prefetch of one call's rows (contiguous when ld == row bytes): lines are requested
// `dist` bytes ahead of the read position, never past the end of the stream; the first call asks for
// the stream's first `dist` bytes at once (the hardware prefetchers have nothing to follow yet).
struct StreamPrefetch {
  const char* next;
  const char* end;
  int dist;
  StreamPrefetch(const uint8_t* W, size_t ld, int nrows, size_t row_bytes, int d)
      : next(reinterpret_cast<const char*>(W)),
        end(reinterpret_cast<const char*>(W) + (nrows > 0 ? (nrows - 1) * ld + row_bytes : 0)),
        dist(d) {}
  void advance(const uint8_t* p) {
    const char* lim = std::min(end, reinterpret_cast<const char*>(p) + dist);
    for (; next < lim; next += 64) {
#if FT_X86
      _mm_prefetch(next, _MM_HINT_T0);
#else
      __builtin_prefetch(next);
#endif
    }
  }
};

// ---- scalar tier: dequantize a block to fp32, then dot ----

void deq_q8_0(const uint8_t* p, float* v) {
  const float d = f16_to_f32(load_u16(p));
  for (int j = 0; j < 32; ++j) v[j] = d * static_cast<int8_t>(p[2 + j]);
}

void deq_q4_0(const uint8_t* p, float* v) {
  const float d = f16_to_f32(load_u16(p));
  for (int j = 0; j < 16; ++j) {
    v[j] = d * ((p[2 + j] & 15) - 8);
    v[j + 16] = d * ((p[2 + j] >> 4) - 8);
  }
}

constexpr int8_t kE2m1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void deq_mxfp4(const uint8_t* p, float* v) {
  const float d = e8m0_half(p[0]);
  for (int j = 0; j < 16; ++j) {
    v[j] = d * kE2m1Doubled[p[1 + j] & 15];
    v[j + 16] = d * kE2m1Doubled[p[1 + j] >> 4];
  }
}

void deq_q4_k(const uint8_t* p, float* v) {
  const float d = f16_to_f32(load_u16(p)), dmin = f16_to_f32(load_u16(p + 2));
  uint8_t sc[8], mn[8];
  kquant_scale_min(p + 4, sc, mn);
  const uint8_t* qs = p + 16;
  for (int s = 0; s < 8; ++s) {
    const float ds = d * sc[s], dm = dmin * mn[s];
    for (int l = 0; l < 32; ++l) {
      const uint8_t b = qs[32 * (s / 2) + l];
      v[32 * s + l] = ds * ((s & 1) ? b >> 4 : b & 15) - dm;
    }
  }
}

void deq_q5_k(const uint8_t* p, float* v) {
  const float d = f16_to_f32(load_u16(p)), dmin = f16_to_f32(load_u16(p + 2));
  uint8_t sc[8], mn[8];
  kquant_scale_min(p + 4, sc, mn);
  const uint8_t* qh = p + 16;
  const uint8_t* qs = p + 48;
  for (int s = 0; s < 8; ++s) {
    const float ds = d * sc[s], dm = dmin * mn[s];
    for (int l = 0; l < 32; ++l) {
      const uint8_t b = qs[32 * (s / 2) + l];
      const int q = ((s & 1) ? b >> 4 : b & 15) | (((qh[l] >> s) & 1) << 4);
      v[32 * s + l] = ds * q - dm;
    }
  }
}

void deq_q6_k(const uint8_t* p, float* v) {
  const float d = f16_to_f32(load_u16(p + 208));
  const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = p + 64 * h;
    const uint8_t* qh = p + 128 + 32 * h;
    float* y = v + 128 * h;
    const int8_t* s = sc + 8 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      y[l] = d * s[is] * (((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
      y[l + 32] = d * s[is + 2] * (((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
      y[l + 64] = d * s[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      y[l + 96] = d * s[is + 6] * (((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) - 32);
    }
  }
}

template <int Elems, int Bytes, void (*Deq)(const uint8_t*, float*)>
void rows_scalar(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int /*prefetch*/) {
  float v[Elems];
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    float acc = 0.f;
    for (int b = 0; b < K / Elems; ++b) {
      Deq(w + b * Bytes, v);
      float s = 0.f;
      for (int j = 0; j < Elems; ++j) s += v[j] * x[b * Elems + j];
      acc += s;
    }
    out[r] = acc;
  }
}

void rows_f16_scalar(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int) {
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += f16_to_f32(load_u16(w + 2 * k)) * x[k];
    out[r] = acc;
  }
}

template <Isa kIsa>
void rows_bf16(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int prefetch) {
  bf16_dot_rows_f32(kIsa, reinterpret_cast<const uint16_t*>(W), ld / 2, nrows, x, K, out, prefetch);
}

}  // namespace

// ---- SIMD tiers ----
#if FT_X86

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
namespace {
struct V {
  static constexpr int N = 8;
  using F = __m256;
  using I = __m256i;
  static F zero() { return _mm256_setzero_ps(); }
  static F lx(const float* p) { return _mm256_loadu_ps(p); }
  static I u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static I s8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static I andi(I a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
  template <int n>
  static I srl(I a) { return _mm256_srli_epi32(a, n); }
  template <int n>
  static I sll(I a) { return _mm256_slli_epi32(a, n); }
  static I srlv(I a, int n) { return _mm256_srl_epi32(a, _mm_cvtsi32_si128(n)); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I subi(I a, int c) { return _mm256_sub_epi32(a, _mm256_set1_epi32(c)); }
  static F set(float f) { return _mm256_set1_ps(f); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fms(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F f16x(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float f16s(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
  static I s8x(__m128i v, int part) { return _mm256_cvtepi8_epi32(part ? _mm_srli_si128(v, 8) : v); }
};
#include "ggml_tier_kernels.h"
}  // namespace
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#endif
namespace avx512 {
namespace {
struct V {
  static constexpr int N = 16;
  using F = __m512;
  using I = __m512i;
  static F zero() { return _mm512_setzero_ps(); }
  static F lx(const float* p) { return _mm512_loadu_ps(p); }
  static I u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I s8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static I andi(I a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
  template <int n>
  static I srl(I a) { return _mm512_srli_epi32(a, n); }
  template <int n>
  static I sll(I a) { return _mm512_slli_epi32(a, n); }
  static I srlv(I a, int n) { return _mm512_srl_epi32(a, _mm_cvtsi32_si128(n)); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I subi(I a, int c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
  static F set(float f) { return _mm512_set1_ps(f); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fms(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  static F f16x(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static float f16s(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
  static I s8x(__m128i v, int /*part*/) { return _mm512_cvtepi8_epi32(v); }
};
#include "ggml_tier_kernels.h"
}  // namespace
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#define FT_GGML_TIERS(scalar_fn, T) \
  { scalar_fn, avx2::rows<avx2::T>, avx512::rows<avx512::T>, avx512::rows<avx512::T> }
#define FT_GGML_F16_TIERS { rows_f16_scalar, avx2::rows_f16, avx512::rows_f16, avx512::rows_f16 }
#else
#define FT_GGML_TIERS(scalar_fn, T) { scalar_fn, scalar_fn, scalar_fn, scalar_fn }
#define FT_GGML_F16_TIERS { rows_f16_scalar, rows_f16_scalar, rows_f16_scalar, rows_f16_scalar }
#endif  // FT_X86

namespace {

// The supported types, in the order they are listed in errors. The avx512_bf16 tier runs the
// AVX-512 kernels: the weights are dequantized to fp32 in registers either way, and a bf16 dot
// product would only add a conversion.
const TypeInfo kTypes[] = {
    {8, "Q8_0", 32, 34, FT_GGML_TIERS((rows_scalar<32, 34, deq_q8_0>), Q8_0)},
    {2, "Q4_0", 32, 18, FT_GGML_TIERS((rows_scalar<32, 18, deq_q4_0>), Q4_0)},
    {30, "BF16", 1, 2, {rows_bf16<Isa::scalar>, rows_bf16<Isa::avx2>, rows_bf16<Isa::avx512>, rows_bf16<Isa::avx512>}},
    {1, "F16", 1, 2, FT_GGML_F16_TIERS},
    {39, "MXFP4", 32, 17, FT_GGML_TIERS((rows_scalar<32, 17, deq_mxfp4>), MXFP4)},
    {12, "Q4_K", 256, 144, FT_GGML_TIERS((rows_scalar<256, 144, deq_q4_k>), Q4_K)},
    {14, "Q6_K", 256, 210, FT_GGML_TIERS((rows_scalar<256, 210, deq_q6_k>), Q6_K)},
    {13, "Q5_K", 256, 176, FT_GGML_TIERS((rows_scalar<256, 176, deq_q5_k>), Q5_K)},
};

}  // namespace

const TypeInfo* find_type(int id) {
  for (const TypeInfo& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::string supported_types() {
  std::string s;
  for (const TypeInfo& t : kTypes) s += (s.empty() ? "" : ", ") + std::string(t.name) + " (" + std::to_string(t.id) + ")";
  return s;
}

const TypeInfo& type_from_option(const std::string& context, const std::string& option, double value) {
  const TypeInfo* t = nullptr;
  if (value == std::floor(value) && std::fabs(value) < 1e9) t = find_type(static_cast<int>(value));
  if (t == nullptr) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", value);
    throw Error(context + ": option " + option + "=" + buf +
                " is not a supported ggml type id; supported: " + supported_types());
  }
  return *t;
}

size_t row_bytes(const std::string& context, const TypeInfo& t, long long K, const std::string& what) {
  if (K % t.block_elems != 0) {
    throw Error(context + ": " + what + " is not a multiple of " + std::to_string(t.block_elems) +
                ", the block size of " + t.name);
  }
  return static_cast<size_t>(K / t.block_elems) * t.block_bytes;
}

GgmlMoeFormat::GgmlMoeFormat(const MoeParams& p, const Matrix& gate, const Matrix& up, const Matrix& down)
    : p_(p), gate_(gate), up_(up), down_(down), gate_fn_(gate.type->rows[static_cast<int>(p.isa)]),
      up_fn_(up.type->rows[static_cast<int>(p.isa)]), down_fn_(down.type->rows[static_cast<int>(p.isa)]) {}

void GgmlMoeFormat::gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
                            float* up) const {
  const int H = p_.hidden, n = i1 - i0;
  const float* x = in.x_f32 + static_cast<size_t>(t) * H;
  gate_fn_(gate_.data + e * gate_.expert_stride + i0 * gate_.row_bytes, gate_.row_bytes, n, x, H, gate,
           p_.prefetch);
  up_fn_(up_.data + e * up_.expert_stride + i0 * up_.row_bytes, up_.row_bytes, n, x, H, up, p_.prefetch);
  const float* bg = gate_.bias ? gate_.bias + e * gate_.bias_stride + i0 : nullptr;
  const float* bu = up_.bias ? up_.bias + e * up_.bias_stride + i0 : nullptr;
  for (int i = 0; i < n; ++i) {
    gate[i] = in_scale * gate[i] + (bg ? bg[i] : 0.f);
    up[i] = in_scale * up[i] + (bu ? bu[i] : 0.f);
  }
}

void GgmlMoeFormat::down(int h0, int h1, const RouteRef* routes, int n, float* out) const {
  const int I = p_.intermediate, rows = h1 - h0;
  float tmp[kPass2Rows];
  std::fill(out, out + rows, 0.f);
  for (int r = 0; r < n; ++r) {
    const RouteRef& rt = routes[r];
    const uint8_t* w = down_.data + rt.expert * down_.expert_stride + h0 * down_.row_bytes;
    down_fn_(w, down_.row_bytes, rows, rt.h, I, tmp, p_.prefetch);
    const float* b = down_.bias ? down_.bias + rt.expert * down_.bias_stride + h0 : nullptr;
    for (int j = 0; j < rows; ++j) out[j] += rt.weight * (tmp[j] + (b ? b[j] : 0.f));
  }
}

}  // namespace ggml
}  // namespace ft
