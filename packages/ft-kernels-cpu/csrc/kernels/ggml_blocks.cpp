// The ggml block types of ggml_blocks.h: scalar kernels, the fp32 SIMD tiers (ggml_tier_kernels.h
// compiled for AVX2 and AVX-512), the int8-activation kernels of the avx2 tier (VPMADDUBSW: Q4_0,
// MXFP4, Q4_K, Q5_K, Q6_K) and of the avx512_bf16 tier (VNNI), the type table and the format class shared by
// `q4_0` and `gguf`.
#include "ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "avx2_pairs.h"
#include "bf16_dot.h"
#include "dispatch_n.h"
#include "int8_codes.h"
#include "row_reduce.h"
#include "stream_prefetch.h"

namespace ft {
namespace ggml {

namespace {

// ggml's e8m0_half (GGML_E8M0_TO_FP32_HALF) four times per code: 2^(e - 128) for every e, so 0 and 1
// are fp32 subnormals and 255 is the finite 2^127 (not NaN as in the MX format's e8m0). One 16-byte
// row per block, the lanes of the avx2 MXFP4 pairs kernel.
struct E8m0GgmlHalf4 {
  alignas(16) float v[256][4];
  E8m0GgmlHalf4() {
    for (int e = 0; e < 256; ++e) {
      for (float& f : v[e]) f = std::ldexp(1.f, e - 128);
    }
  }
};
const E8m0GgmlHalf4 kE8m0GgmlHalf4;

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

// The scalar tier has no batched kernel: each vector in turn.
template <RowsFn Rows>
void multi_scalar(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int n, int K, float* out, int os,
                  int prefetch) {
  for (int j = 0; j < n; ++j) Rows(W, ld, nrows, xs[j], K, out + j * os, prefetch);
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
void multi_bf16(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int n, int K, float* out, int os,
                int prefetch) {
  bf16_dot_rows_multi_f32(kIsa, reinterpret_cast<const uint16_t*>(W), ld / 2, nrows, xs, n, K, out, os, prefetch);
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

// ---- avx2 tier: int8 activations for Q4_0, MXFP4, Q4_K, Q5_K, Q6_K (VPMADDUBSW) ----
//
// x and the intermediate quantized per super-block: kQ8Avx2K (ggml_blocks.h) for the K-quants,
// avx2_pairs.h's records for Q4_0 and MXFP4, whose nibbles (elements 0..15 the low ones, 16..31 the
// high ones) are unsigned codes with an offset: Q4_0's nibbles with 8, MXFP4's looked up as 2 e2m1 +
// 12 with 12; the lanes are multiplied into fp32 accumulators by the weight scale times dx. On CPUs
// without AVX-512 (most desktop parts) this replaces the fp32 kernels (ggml_tier_kernels.h), which
// widen every code to a float (docs/benchmarks.md).
namespace avx2q8 {
namespace {

// Q4_0 as avx2_pairs.h's block policy: blocks 2p and 2p + 1 (36 bytes) give their 16 code bytes
// each to one register; the fp16 scales of 4 blocks (bytes 0, 18, 36, 54) are gathered by three
// word blends of 16-byte loads (inside the 72 bytes of the 4 blocks) and one conversion.
struct Q4_0Pairs {
  static constexpr int kOffset = 8;
  static constexpr bool kScalePerBlock = true;
  const uint8_t* W;
  size_t ld;
  const StreamPrefetch<>* pf;  // nullptr: no software prefetch
  const uint8_t* at(int row, int b) const { return W + row * ld + 18 * b; }
  static __m256i split(__m256i raw, __m256i& H) {
    const __m256i m4 = _mm256_set1_epi8(15);
    H = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    return _mm256_and_si256(raw, m4);
  }
  void pair(int row, int p, __m256i& L, __m256i& H) const {
    const uint8_t* q = at(row, 2 * p);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 20));
    L = split(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), H);
  }
  void half(int row, int p, __m256i& L, __m256i& H) const {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at(row, 2 * p) + 2));
    L = split(_mm256_set_m128i(_mm_setzero_si128(), a), H);
  }
  // The fp16 scales d0..d3 of blocks 4g..4g+3 gathered by word blends as the halves
  // [d0 d2 - - d1 d3 - -] (the unused words convert to values no lane takes), converted together;
  // in-lane VPERMILPS then give [d0 x4, d1 x4] and [d2 x4, d3 x4]. Two VPERMPS of [d0 d1 d2 d3] did
  // it before; on Zen 3 a VPERMPS is two uops, one of them on a multiply pipe, where the VPMADDUBSWs
  // run.
  void scales4(int row, int g, __m256& s0, __m256& s1) const {
    const uint8_t* q = at(row, 4 * g);
    auto ld16 = [](const uint8_t* a) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)); };
    __m128i t = _mm_blend_epi16(ld16(q), ld16(q + 34), 0x02);            // word 1: d2 (byte 36)
    t = _mm_blend_epi16(_mm_blend_epi16(t, ld16(q + 10), 0x10), ld16(q + 44), 0x20);  // words 4, 5: d1, d3
    const __m256 f = _mm256_cvtph_ps(t);
    s0 = _mm256_permute_ps(f, 0x00);
    s1 = _mm256_permute_ps(f, 0x55);
  }
  __m256 scales2(int row, int p, bool half) const {
    const uint8_t* q = at(row, 2 * p);
    const __m128i t = _mm_setr_epi32(load_u16(q), 0, half ? 0 : load_u16(q + 18), 0);  // words 0 and 4
    return _mm256_permute_ps(_mm256_cvtph_ps(t), 0x00);
  }
  void ahead(int row, int g) const {
    if (pf) pf->ahead_block<72>(at(row, 4 * g));
  }
};

// ggml's MXFP4 (17-byte blocks: e8m0 e, then 16 bytes of e2m1 nibbles in Q4_0's element order) as
// avx2_pairs.h's block policy: the codes 2 e2m1 + 12 (pairs::e2m1_split, offset 12) of blocks 2p and
// 2p + 1, and e8m0_half per block, 4 at a time in vector code with e8m0_half's values (2^(e - 128);
// e = 0 and 1 the fp32 subnormals 2^-128 and 2^-127, 255 the finite 2^127 as ggml has it).
struct Mxfp4Pairs {
  static constexpr int kOffset = 12;
  static constexpr bool kScalePerBlock = true;
  const uint8_t* W;
  size_t ld;
  const StreamPrefetch<>* pf;
  const uint8_t* at(int row, int b) const { return W + row * ld + 17 * b; }
  void pair(int row, int p, __m256i& L, __m256i& H) const {
    const uint8_t* q = at(row, 2 * p);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 1));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 18));
    pairs::e2m1_split(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), L, H);
  }
  void half(int row, int p, __m256i& L, __m256i& H) const {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at(row, 2 * p) + 1));
    pairs::e2m1_split(_mm256_set_m128i(_mm_setzero_si128(), a), L, H);
  }
  // e8m0_half of blocks 4g..4g+3, each block's value in the 4 lanes of its half of s0 or s1: two
  // 16-byte rows of kE8m0GgmlHalf4 per register, as the mxfp4 format's avx2 kernel (the decode by
  // shifts and two VPERMPS cost a multiply pipe that the VPMADDUBSWs need).
  static __m256 lanes(uint8_t a, uint8_t b) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(kE8m0GgmlHalf4.v[a])),
                                _mm_load_ps(kE8m0GgmlHalf4.v[b]), 1);
  }
  void scales4(int row, int g, __m256& s0, __m256& s1) const {
    const uint8_t* q = at(row, 4 * g);
    s0 = lanes(q[0], q[17]);
    s1 = lanes(q[34], q[51]);
  }
  __m256 scales2(int row, int p, bool half) const {
    const uint8_t* q = at(row, 2 * p);
    return half ? _mm256_set_m128(_mm_setzero_ps(), _mm_load_ps(kE8m0GgmlHalf4.v[q[0]])) : lanes(q[0], q[17]);
  }
  void ahead(int row, int g) const {
    if (pf) pf->ahead_block<68>(at(row, 4 * g));
  }
};

// Rows of a 32-element ggml type of `bytes` bytes a block with pair policy P (Q4_0Pairs, Mxfp4Pairs).
template <class P, int bytes, int NV>
void rows_pairs(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 32;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * bytes), prefetch);
  const uint8_t* x[NV];
  for (int j = 0; j < NV; ++j) x[j] = xs[j].q;
  pairs::rows<NV>(P{W, ld, prefetch ? &pf : nullptr}, x, nrows, nb, out, os);
}


// The 8 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K super-block's 12 scale
// bytes at s, as kquant_scale_min (16 bytes are read: the 4 after the scales are the block's next
// field, unused):
//   sc0..3 = s0..3 & 63, sc4..7 = (s8..11 & 15) | (s0..3 >> 6) << 4,
//   mn0..3 = s4..7 & 63, mn4..7 = (s8..11 >> 4) | (s4..7 >> 6) << 4
inline __m128i kquant_scale_min_x(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i top = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i low = _mm_and_si128(_mm_blend_epi16(a, _mm_srli_epi16(a, 4), 0xC0),
                                    _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30)));
}

// Word w of both 128-bit lanes of v (word w of the low lane in `lo`, of the high lane in `hi` when
// the two lanes hold different words): VPSHUFB masks.
inline __m256i words_mask(int lo, int hi) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(0x0100 + 0x0202 * lo)),
                           _mm_set1_epi16(static_cast<short>(0x0100 + 0x0202 * hi)));
}

// The K-quants against kQ8Avx2K x (one dx per super-block, as ggml's Q8_K): each sub-block's
// VPMADDUBSW pair sums (int16) are multiplied by its integer scale and summed by one VPMADDWD, so a
// super-block stays in int32 lanes and is converted and scaled by d dx once per vector. Where the
// accumulators of many vectors would not fit in registers, the fp32 ones are kept in memory (one
// load and store per super-block).
template <int NV>
struct KAcc {
  static constexpr bool kMem = NV > 2;
  alignas(32) float m[kMem ? NV : 1][8];
  __m256 r[kMem ? 1 : NV];
  FT_TARGET_AVX2 KAcc() {
    for (int j = 0; j < (kMem ? NV : 1); ++j) _mm256_store_ps(m[j], _mm256_setzero_ps());
    #pragma GCC unroll 8
    for (int j = 0; j < (kMem ? 1 : NV); ++j) r[j] = _mm256_setzero_ps();
  }
  FT_TARGET_AVX2 __m256 get(int j) const { return kMem ? _mm256_load_ps(m[j]) : r[j]; }
  FT_TARGET_AVX2 void set(int j, __m256 v) {
    if constexpr (kMem) _mm256_store_ps(m[j], v);
    else r[j] = v;
  }
};

inline const float* kx_dx(const Q8Ref& x, int K) { return reinterpret_cast<const float*>(x.q + K); }
inline const float* kx_xsum(const Q8Ref& x, int K) { return reinterpret_cast<const float*>(x.q + K + K / 64); }
inline const int16_t* kx_csum(const Q8Ref& x, int K) {
  return reinterpret_cast<const int16_t*>(x.q + K + K / 64 + K / 8);
}

// Q4_K (Q5_K): per super-block of 256, sub-block s (32 elements) = d sc[s] q - dmin m[s], q = the
// low (s even) or high (s odd) nibbles of qs[32 (s / 2) .. +32] (Q5_K: plus 16 where bit s of qh[l]
// is set, l the element within the sub-block). q (unsigned, <= 31) times x (signed) by VPMADDUBSW
// (pair sums <= 7874), by sc[s] (<= 63) and summed by VPMADDWD: |lane| <= 8 * 2 * 7874 * 63 over a
// super-block. The min terms dmin m[s] times x's fp32 sums per sub-block, 8 at a time (one FNMADD per
// super-block into the same accumulator). Row r against NV vectors, one row at a time: on the 2-core
// Zen 3, 4 rows side by side (4 interleaved streams) took twice as long from DRAM as from L3, one row
// 1.4x, and 2 threads decoded gguf's batch 1 at 16-19 GB/s against 12-13 (batch 2: 12-13 against
// 9-11 with 2 rows), while from L3 one row was as fast (docs/benchmarks.md, twentieth session).
template <bool kQ5, int NV>
void qk45_row(const uint8_t* W, size_t ld, int r, int nb, const Q8Ref* xs, int K, float* out, int os,
              const StreamPrefetch<>& pf) {
  constexpr int kBytes = kQ5 ? 176 : 144, kQs = kQ5 ? 48 : 16;
  const __m256i m4 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
  KAcc<NV> acc;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* p = W + r * ld + kBytes * b;
    if (pf.dist) pf.ahead_block<kBytes>(p);
    const __m128i sm = kquant_scale_min_x(p + 4);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // words sc[0..7], both lanes
    const float d = _cvtsh_ss(load_u16(p));
    const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(p + 2))),
                                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kQ5) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    __m256i isum[NV];
    for (int h = 0; h < 4; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQs + 32 * h));
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kQ5) {
        // bits 2h and 2h + 1 of qh to bit 4 (word shifts: the bits they carry across bytes are
        // outside bit 4)
        auto bit4 = [&](int s) FT_TARGET_AVX2 {
          const __m256i v = s <= 4 ? _mm256_slli_epi16(qh, 4 - s) : _mm256_srli_epi16(qh, s - 4);
          return _mm256_and_si256(v, m16);
        };
        lo = _mm256_or_si256(lo, bit4(2 * h));
        hi = _mm256_or_si256(hi, bit4(2 * h + 1));
      }
      const __m256i slo = _mm256_shuffle_epi8(sc, words_mask(2 * h, 2 * h));
      const __m256i shi = _mm256_shuffle_epi8(sc, words_mask(2 * h + 1, 2 * h + 1));
      for (int j = 0; j < NV; ++j) {
        const uint8_t* xq = xs[j].q + 256 * b + 64 * h;
        const __m256i t = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))), slo),
            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32))),
                              shi));
        isum[j] = h == 0 ? t : _mm256_add_epi32(isum[j], t);
      }
    }
    for (int j = 0; j < NV; ++j) {
      const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(d * kx_dx(xs[j], K)[b]),
                                       acc.get(j));
      acc.set(j, _mm256_fnmadd_ps(dm, _mm256_loadu_ps(kx_xsum(xs[j], K) + 8 * b), a));
    }
  }
  for (int j = 0; j < NV; ++j) out[j * os + r] = hsum8(acc.get(j));
}

template <bool kQ5, int NV>
void rows_qk45(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 256;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * (kQ5 ? 176 : 144)), prefetch);
  for (int r = 0; r < nrows; ++r) qk45_row<kQ5, NV>(W, ld, r, nb, xs, K, out, os, pf);
}

// Q6_K: per 128-element half h and l < 32, q[l] = ql[l] & 15 | (qh[l] & 3) << 4, q[l + 32] = ql[l +
// 32] & 15 | (qh[l] >> 2 & 3) << 4, q[l + 64] = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4, q[l + 96] =
// ql[l + 32] >> 4 | (qh[l] >> 6) << 4, each run of 32 one of x's 32-blocks; w = q - 32, one int8
// scale per 16 elements. The unsigned q (<= 63) meet x by VPMADDUBSW (pair sums <= 16002), the
// scales by VPMADDWD (the low 128-bit lane of a run takes the scale of its first 16 elements, the
// high one the next); the offset is one more VPMADDWD per super-block and vector: x's code sums per
// 16 (csum) times -32 times the scales. |lane| <= 16 * 16002 * 128 + 32 * 128 * 2 * 2032.
template <int NV>
void rows_q6_k(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 256;
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * 210), prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    KAcc<NV> acc;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = w + 210 * b;
      if (prefetch) pf.ahead_block<210>(p);
      const float d = _cvtsh_ss(load_u16(p + 208));
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
      const __m256i s16 = _mm256_cvtepi8_epi16(s8);
      const __m256i scm = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5));  // -32 sc
      __m256i isum[NV];
      for (int j = 0; j < NV; ++j) {
        isum[j] = _mm256_madd_epi16(scm, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kx_csum(xs[j], K) + 16 * b)));
      }
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = p + 64 * h;
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
        // scales 8h .. 8h + 7 as words in both lanes
        const __m256i sc = _mm256_broadcastsi128_si256(h == 0 ? _mm256_castsi256_si128(s16) : _mm256_extracti128_si256(s16, 1));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(qh, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        for (int i = 0; i < 4; ++i) {
          const __m256i sv = _mm256_shuffle_epi8(sc, words_mask(2 * i, 2 * i + 1));
          const int blk = 8 * b + 4 * h + i;  // x's 32-block
          for (int j = 0; j < NV; ++j) {
            const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[j].q + 32 * blk));
            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(q[i], xq), sv));
          }
        }
      }
      for (int j = 0; j < NV; ++j) {
        acc.set(j, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(d * kx_dx(xs[j], K)[b]), acc.get(j)));
      }
    }
    for (int j = 0; j < NV; ++j) out[j * os + r] = hsum8(acc.get(j));
  }
}

void q8_q4_0(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_pairs<Q4_0Pairs, 18, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
void q8_mxfp4(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_pairs<Mxfp4Pairs, 17, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
void q8_q4_k(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_qk45<false, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
void q8_q5_k(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_qk45<true, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
void q8_q6_k(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_q6_k<decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}

}  // namespace

void quantize_kquant(const float* x, int k0, int k1, int K, void* base) {
  auto* q = static_cast<uint8_t*>(base);
  auto* dx = reinterpret_cast<float*>(q + K);
  float* xsum = dx + K / 256;
  auto* csum = reinterpret_cast<int16_t*>(xsum + K / 32);
  for (int g = k0; g < k1; g += 256) {
    auto* c = reinterpret_cast<int8_t*>(q + g);
    dx[g / 256] = int8_codes(x + g, 256, c, true) / 127.f;
    for (int k = g; k < g + 256; k += 32) {
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(x + k + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(x + k + 16), _mm256_loadu_ps(x + k + 24)));
      xsum[k / 32] = hsum8(s);
    }
    for (int k = g; k < g + 256; k += 16) {
      int sum = 0;
      for (int e = 0; e < 16; ++e) sum += static_cast<int8_t>(q[k + e]);
      csum[k / 16] = static_cast<int16_t>(sum);
    }
  }
}

}  // namespace avx2q8
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

// ---- avx512_bf16 tier: int8 activations (Q8Ref) and VPDPBUSD ----
//
// Each VPDPBUSD lane sums 4 products of unsigned and signed bytes into int32, exactly. Q8_0 makes its
// weight codes signed and takes x as unsigned (x code + 128): the lane starts from -128 * (sum of its
// 4 weights), computed once per weight block for all vectors, so each vector costs one load and one
// VPDPBUSD per 64 elements. Q4_0, Q4_K, Q5_K and Q6_K codes stay unsigned and take x signed (the
// offsets of Q4_0 and Q6_K come from x's precomputed code sums, the K-quants' mins from x's fp32
// sums). Q8_0 lanes are scaled in fp32 by (weight scale of their block) * dx of their block (x in
// groups of 32), Q4_0 lanes by their block's scale and the group's sum by dx (groups of 256).
#if defined(__clang__)
#pragma clang attribute push(                                                                            \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi,gfni,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi,gfni,fma,f16c")
#endif
namespace vnni {
namespace {

inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i ld128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// The high nibble of every byte, in its low 4 bits: one GF2P8AFFINEQB, whose bit matrix takes bits
// 4..7 to bits 0..3 and clears the rest (matrix byte 7 - i selects the input bits of output bit i),
// in place of a shift and a mask.
inline __m512i high_nibbles(__m512i q) {
  return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(0x1020408000000000ll), 0);
}

// -128 * (sum of each lane's 4 signed weight bytes w): the start of the lanes against x + 128.
inline __m512i unsigned_x_start(__m512i w) {
  return _mm512_sub_epi32(_mm512_setzero_si512(),
                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w));
}
// The same for w = codes - off from the unsigned codes, in one instruction: 512 off - 128 sum codes.
inline __m512i unsigned_x_start(__m512i codes, int off) {
  return _mm512_dpbusd_epi32(_mm512_set1_epi32(512 * off), codes, _mm512_set1_epi8(-128));
}

// acc[j] += cvt(sum (x_j + 128) * w - 128 * sum w) * ws * dl_j for the 64 elements at k.
template <int NV>
inline void dot64(__m512i w, __m512i start, __m512 ws, const Q8Ref* xs, int K, int k, __m512* acc) {
  const int kd = K + k;
  for (int j = 0; j < NV; ++j) {
    const __m512i s = _mm512_dpbusd_epi32(start, ld512(xs[j].q + k), w);
    const __m512 dl = _mm512_loadu_ps(reinterpret_cast<const float*>(xs[j].q + kd));
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws, dl), acc[j]);
  }
}

// A single 32-element block at k (the last of an odd row): the upper 8 lanes get dl = 0.
template <int NV>
inline void dot32(__m512i w, __m512i start, __m512 ws, const Q8Ref* xs, int K, int k, __m512* acc) {
  const int kd = K + k;
  for (int j = 0; j < NV; ++j) {
    const __m512i s = _mm512_dpbusd_epi32(start, _mm512_maskz_loadu_epi8(0xffffffffull, xs[j].q + k), w);
    const __m512 dl = _mm512_maskz_loadu_ps(0x00ff, reinterpret_cast<const float*>(xs[j].q + kd));
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(ws, dl), acc[j]);
  }
}

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

inline __m512 f16_bcast(const uint8_t* p) { return _mm512_set1_ps(_cvtsh_ss(load_u16(p))); }

// Q4_0 against x in the Q4_0 layout (q4_0_xq_* in ggml_blocks.h): per group of 8 blocks (144
// bytes) one permute per 4 blocks gathers their 64 code bytes in block order (qs of blocks
// 4c..4c+3, 16 bytes each: low nibbles are elements 0..15 of each block, high nibbles 16..31, which
// is the order of x's lo and hi halves): by dwords from four unaligned loads (Q4_0::codes; Q4_0Dwords
// below), or by words from three loads (Q4_0Words, and masked ones for a last, partial group). The
// 8 fp16 scales are gathered from the group's first 128 bytes and converted to fp32, each on its
// block's 4 lanes. Per 4 blocks and vector: two VPDPBUSD into int32 lanes that start at the
// precomputed -8 * (sum of the lane's x codes), one conversion, one FMA by the scales; the group's
// sum is multiplied by dx at its end.
struct Q4_0 {
  static constexpr int elems = 32, bytes = 18;
  // Word permute indices (vpermt2w: 0..31 the first table, 32..63 the second).
  // Codes of blocks 0..3 from (p, p + 64): word (18 bb + 2 + 2 w2) / 2 = 9 bb + 1 + w2.
  static inline __m512i idx_codes0() {
    alignas(64) int16_t v[32];
    for (int i = 0; i < 32; ++i) v[i] = static_cast<int16_t>(9 * (i / 8) + 1 + i % 8);
    return _mm512_load_si512(v);
  }
  // Codes of blocks 4..7 from (p + 64, p + 128): bytes 72 + 18 bb + 2 + 2 w2 - 64 = 10 + 18 bb + 2 w2.
  static inline __m512i idx_codes1() {
    alignas(64) int16_t v[32];
    for (int i = 0; i < 32; ++i) v[i] = static_cast<int16_t>(5 + 9 * (i / 8) + i % 8);
    return _mm512_load_si512(v);
  }
  // Codes of blocks 0..3 / 4..7 of a whole group by dwords (VPERMT2D, one uop, where VPERMT2W holds
  // port 5 for two cycles) from unaligned loads that put two blocks' codes on dword boundaries:
  // (p + 2, p + 20) hold blocks 0, 2 / 1, 3 at dwords 0 and 9, (p + 74, p + 80) blocks 4, 6 at
  // dwords 0, 9 / 5, 7 at dwords 3, 12; no load reaches past the group's 144 bytes.
  static inline __m512i idx_dwords0() {
    return _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 9, 10, 11, 12, 25, 26, 27, 28);
  }
  static inline __m512i idx_dwords1() {
    return _mm512_setr_epi32(0, 1, 2, 3, 19, 20, 21, 22, 9, 10, 11, 12, 28, 29, 30, 31);
  }
  static inline void codes(const uint8_t* p, __m512i& q0, __m512i& q1) {
    q0 = _mm512_permutex2var_epi32(_mm512_loadu_si512(p + 2), idx_dwords0(), _mm512_loadu_si512(p + 20));
    q1 = _mm512_permutex2var_epi32(_mm512_loadu_si512(p + 74), idx_dwords1(), _mm512_loadu_si512(p + 80));
  }
  // Scales of blocks 0..7 from (p, p + 64), each 4 times: word 9 b, b = i / 4.
  static inline __m512i idx_scales() {
    alignas(64) int16_t v[32];
    for (int i = 0; i < 32; ++i) v[i] = static_cast<int16_t>(9 * (i / 4));
    return _mm512_load_si512(v);
  }
};

// How the kernels below gather a whole group's codes (q0: blocks 0..3, q1: 4..7, as Q4_0::codes)
// and its scales in fp32 on their blocks' lanes (ws0: blocks 0..3, ws1: 4..7). Both give the same
// values bit for bit; they differ in the instructions spent.
//
// Q4_0Dwords (Intel): Q4_0::codes's four unaligned loads and two VPERMT2D, then one word permute of
// the group's first 128 bytes that repeats each scale on its block's 4 lanes and two conversions of
// 16 fp16 scales each. Intel's cores issue two 512-bit loads a cycle and run every permute on one
// port, so permutes are what this path saves.
// (Explicit constructors: an implicit one would be compiled without this section's target.)
struct Q4_0Dwords {
  __m512i isc;
  Q4_0Dwords() : isc(Q4_0::idx_scales()) {}
  __attribute__((always_inline)) void decode(const uint8_t* p, __m512i& q0, __m512i& q1, __m512& ws0,
                                             __m512& ws1) const {
    Q4_0::codes(p, q0, q1);
    const __m512i sw = _mm512_permutex2var_epi16(ld512(p), isc, ld512(p + 64));
    ws0 = _mm512_cvtph_ps(_mm512_castsi512_si256(sw));
    ws1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sw, 1));
  }
};

// Q4_0Words (AMD): the group's 144 bytes in three loads (64, 64 and 16 bytes), the codes by words
// from them (the masked path's permutes), the 8 scales gathered into one 128-bit lane, converted
// in one 256-bit VCVTPH2PS and spread over their lanes by two VPERMPS. Zen 4 loads one 512-bit
// vector a cycle, and about 1.6 cycles for one whose 32-byte half crosses a cache line (most of
// Q4_0::codes's, whose groups start 16 bytes apart modulo 64); its 512-bit VCVTPH2PS takes about 1.7
// cycles where the 256-bit one takes 0.7. Probe of a gate/up row pair (2-core Zen 4, rows in L1
// / L2): 15.8 / 16.6 cycles per row and group with Q4_0Dwords, 14.3 / 14.9 with this
// (docs/benchmarks.md, thirty-second session).
struct Q4_0Words {
  __m512i ic0, ic1;
  __m512i is8;       // the scales of blocks 0..7 in words 0..7 (word 9 b of (p, p + 64))
  __m512i il0, il1;  // lanes 4c..4c+3 take scale c (ws0) or 4 + c (ws1)
  Q4_0Words()
      : ic0(Q4_0::idx_codes0()),
        ic1(Q4_0::idx_codes1()),
        is8(_mm512_setr_epi32(9 << 16, 27 << 16 | 18, 45 << 16 | 36, 63 << 16 | 54, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                              0, 0)),
        il0(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
        il1(_mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)) {}
  __attribute__((always_inline)) void decode(const uint8_t* p, __m512i& q0, __m512i& q1, __m512& ws0,
                                             __m512& ws1) const {
    __m512i a = ld512(p), b = ld512(p + 64), c = _mm512_castsi128_si512(ld128(p + 128));
    // Kept in registers: VPERMT2W overwrites a table, and GCC would otherwise load a and b again
    // for each permute, which is the cost this path exists to save.
    FT_IN_REGISTER(a);
    FT_IN_REGISTER(b);
    FT_IN_REGISTER(c);
    q0 = _mm512_permutex2var_epi16(a, ic0, b);
    q1 = _mm512_permutex2var_epi16(b, ic1, c);
    const __m256 s = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, is8, b)));
    ws0 = _mm512_permutexvar_ps(il0, _mm512_castps256_ps512(s));
    ws1 = _mm512_permutexvar_ps(il1, _mm512_castps256_ps512(s));
  }
};

// One group of nblk <= 8 blocks at p against the vectors' group records at xo (byte offset); a
// whole group decoded by D (Q4_0Dwords or Q4_0Words).
template <int NV, class D>
__attribute__((always_inline)) inline void q4_0_group(const uint8_t* p, int nblk, const Q8Ref* xs, size_t xo,
                                                      const D& dec, __m512i ic0, __m512i ic1, __m512i isc,
                                                      __m512* acc) {
  __m512i q0, q1;
  __m512 ws0, ws1;
  if (nblk == 8) {
    dec.decode(p, q0, q1, ws0, ws1);
  } else {  // masked: nothing past the row's last block is read; missing blocks are zero (scale 0)
    const int n = nblk * Q4_0::bytes;
    const __mmask64 m0 = n >= 64 ? ~0ull : (1ull << n) - 1;
    const __mmask64 m1 = n >= 128 ? ~0ull : n <= 64 ? 0ull : (1ull << (n - 64)) - 1;
    const __mmask64 m2 = n <= 128 ? 0ull : (1ull << (n - 128)) - 1;
    const __m512i a = _mm512_maskz_loadu_epi8(m0, p);
    const __m512i b = _mm512_maskz_loadu_epi8(m1, p + 64);
    const __m512i c = _mm512_maskz_loadu_epi8(m2, p + 128);
    q0 = _mm512_permutex2var_epi16(a, ic0, b);
    q1 = _mm512_permutex2var_epi16(b, ic1, c);
    const __m512i sw = _mm512_permutex2var_epi16(a, isc, b);
    ws0 = _mm512_cvtph_ps(_mm512_castsi512_si256(sw));
    ws1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sw, 1));
  }
  const __m512i m = _mm512_set1_epi8(15);
  const __m512i l0 = _mm512_and_si512(q0, m), h0 = high_nibbles(q0);
  const __m512i l1 = _mm512_and_si512(q1, m), h1 = high_nibbles(q1);
  for (int j = 0; j < NV; ++j) {
    const uint8_t* x = xs[j].q + xo;
    const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ld512(x + 256), l0, ld512(x)), h0, ld512(x + 64));
    const __m512i s1 =
        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ld512(x + 320), l1, ld512(x + 128)), h1, ld512(x + 192));
    const __m512 g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), ws1, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), ws0));
    acc[j] = _mm512_fmadd_ps(g, _mm512_set1_ps(load_f32(x + 384)), acc[j]);
  }
}

// Two rows against NV vectors, a whole group of 8 blocks each: every vector's record lines are
// loaded once for both rows (Zen 4 loads one 512-bit line a cycle; docs/benchmarks.md, fourteenth
// session). Each row's arithmetic is exactly q4_0_group<NV>'s with nblk = 8.
template <int NV, class D>
__attribute__((always_inline)) inline void q4_0_group_pair(const uint8_t* p0, const uint8_t* p1, const Q8Ref* xs,
                                                           size_t xo, const D& dec, __m512* acc0, __m512* acc1) {
  const __m512i m = _mm512_set1_epi8(15);
  __m512i q00, q01, q10, q11;
  __m512 ws00, ws01, ws10, ws11;
  dec.decode(p0, q00, q01, ws00, ws01);
  dec.decode(p1, q10, q11, ws10, ws11);
  const __m512i l00 = _mm512_and_si512(q00, m), h00 = high_nibbles(q00);
  const __m512i l01 = _mm512_and_si512(q01, m), h01 = high_nibbles(q01);
  const __m512i l10 = _mm512_and_si512(q10, m), h10 = high_nibbles(q10);
  const __m512i l11 = _mm512_and_si512(q11, m), h11 = high_nibbles(q11);
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const uint8_t* x = xs[j].q + xo;
    const __m512i x0 = ld512(x), x1 = ld512(x + 64), x2 = ld512(x + 128), x3 = ld512(x + 192);
    const __m512i o0 = ld512(x + 256), o1 = ld512(x + 320);
    const __m512 dx = _mm512_set1_ps(load_f32(x + 384));
    const __m512i s00 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o0, l00, x0), h00, x1);
    const __m512i s01 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o1, l01, x2), h01, x3);
    const __m512i s10 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o0, l10, x0), h10, x1);
    const __m512i s11 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o1, l11, x2), h11, x3);
    const __m512 g0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s01), ws01, _mm512_mul_ps(_mm512_cvtepi32_ps(s00), ws00));
    const __m512 g1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s11), ws11, _mm512_mul_ps(_mm512_cvtepi32_ps(s10), ws10));
    acc0[j] = _mm512_fmadd_ps(g0, dx, acc0[j]);
    acc1[j] = _mm512_fmadd_ps(g1, dx, acc1[j]);
  }
}

// R rows of one vector at once, whole groups of 8 blocks: x's record is loaded once for the R rows;
// each row's arithmetic is exactly q4_0_group<1>'s.
template <int R, class D>
__attribute__((always_inline)) inline void q4_0_group_rows(const uint8_t* const* p, const uint8_t* x, const D& dec,
                                                           __m512* acc) {
  const __m512i x0 = ld512(x), x1 = ld512(x + 64), x2 = ld512(x + 128), x3 = ld512(x + 192);
  const __m512i o0 = ld512(x + 256), o1 = ld512(x + 320);
  const __m512 dx = _mm512_set1_ps(load_f32(x + 384));
  const __m512i m = _mm512_set1_epi8(15);
  for (int i = 0; i < R; ++i) {
    __m512i q0, q1;
    __m512 ws0, ws1;
    dec.decode(p[i], q0, q1, ws0, ws1);
    const __m512i l0 = _mm512_and_si512(q0, m), h0 = high_nibbles(q0);
    const __m512i l1 = _mm512_and_si512(q1, m), h1 = high_nibbles(q1);
    const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o0, l0, x0), h0, x1);
    const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o1, l1, x2), h1, x3);
    const __m512 g = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), ws1, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), ws0));
    acc[i] = _mm512_fmadd_ps(g, dx, acc[i]);
  }
}

template <int NV, class D>
void rows_q4_0(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 32, nfull = nb / 8;
  const __m512i ic0 = Q4_0::idx_codes0(), ic1 = Q4_0::idx_codes1(), isc = Q4_0::idx_scales();
  const D dec;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * Q4_0::bytes), prefetch);
  int r = 0;
  const int side_rows = multirow(static_cast<size_t>(nb) * Q4_0::bytes, NV) ? nrows : 0;  // rows side by side
  if constexpr (NV == 1) {
    // 4 rows at a time (their 4 streams advance together), summed by one transposed reduction
    for (; r + 4 <= side_rows; r += 4) {
      const uint8_t* w[4] = {W + r * ld, W + (r + 1) * ld, W + (r + 2) * ld, W + (r + 3) * ld};
      __m512 acc[4];
      #pragma GCC unroll 8
      for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
      int g = 0;
      for (; g < nfull; ++g) {
        // the 4 rows' span read as one stream at 4 times the pace: requests stay in address order
        if (prefetch) pf.ahead_block<4 * 144>(w[0] + 4 * g * 144);
        const uint8_t* p[4] = {w[0] + g * 144, w[1] + g * 144, w[2] + g * 144, w[3] + g * 144};
        q4_0_group_rows<4>(p, xs[0].q + static_cast<size_t>(g) * kQ4_0XGroupBytes, dec, acc);
      }
      if (8 * g < nb) {
        if (prefetch) pf.ahead_block<4 * 144>(w[0] + 4 * g * 144);
        for (int i = 0; i < 4; ++i) {
          q4_0_group<1>(w[i] + g * 144, nb - 8 * g, xs, static_cast<size_t>(g) * kQ4_0XGroupBytes, dec, ic0, ic1,
                        isc, &acc[i]);
        }
      }
      _mm_storeu_ps(out + r, rowred::hsum_x4(acc[0], acc[1], acc[2], acc[3]));
    }
  } else {
    // 2 rows at a time where the rows are long enough (stream_prefetch.h's multirow), read as one
    // stream at twice the pace; a last partial group row by row
    for (; r + 2 <= side_rows; r += 2) {
      const uint8_t* w0 = W + r * ld;
      const uint8_t* w1 = w0 + ld;
      __m512 acc0[NV], acc1[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
      int g = 0;
      for (; g < nfull; ++g) {
        if (prefetch) pf.ahead_block<2 * 144>(w0 + 2 * g * 144);
        q4_0_group_pair<NV>(w0 + g * 144, w1 + g * 144, xs, static_cast<size_t>(g) * kQ4_0XGroupBytes, dec, acc0,
                            acc1);
      }
      if (8 * g < nb) {
        if (prefetch) pf.ahead_block<2 * 144>(w0 + 2 * g * 144);
        const size_t xo = static_cast<size_t>(g) * kQ4_0XGroupBytes;
        q4_0_group<NV>(w0 + g * 144, nb - 8 * g, xs, xo, dec, ic0, ic1, isc, acc0);
        q4_0_group<NV>(w1 + g * 144, nb - 8 * g, xs, xo, dec, ic0, ic1, isc, acc1);
      }
      rowred::store_sums(acc0, NV, out + r, os);
      rowred::store_sums(acc1, NV, out + r + 1, os);
    }
  }
  for (; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    __m512 acc[NV];
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_ps();
    int g = 0;
    for (; g < nfull; ++g) {
      if (prefetch) pf.ahead_block<144>(w + g * 144);
      q4_0_group<NV>(w + g * 144, 8, xs, static_cast<size_t>(g) * kQ4_0XGroupBytes, dec, ic0, ic1, isc, acc);
    }
    if (8 * g < nb) {
      if (prefetch) pf.ahead_block<144>(w + g * 144);
      q4_0_group<NV>(w + g * 144, nb - 8 * g, xs, static_cast<size_t>(g) * kQ4_0XGroupBytes, dec, ic0, ic1, isc,
                     acc);
    }
    rowred::store_sums(acc, NV, out + r, os);
  }
}

// Row r of a gate block and row r of its up block against one vector, side by side group by group:
// the core's two weight streams, rows apart by the intermediate size, in one loop (stream_prefetch.h's
// gate and up turns, at their finest), x's record loaded once for both rows, and one call per unit in
// place of one per turn of a row or two (on the 2-core Zen 5 the calls' fixed costs were ~12% of a
// step in cache; docs/benchmarks.md, twenty-eighth session). Each row's arithmetic is exactly
// q4_0_group<1>'s and its sum rows_q4_0's, so results are those of rows_q4_0<1> bit for bit.
template <class D>
void gate_up_q4_0(const uint8_t* Wg, const uint8_t* Wu, size_t ld, int nrows, const Q8Ref& x, int K, float* og,
                  float* ou, int prefetch) {
  const int nb = K / 32, nfull = nb / 8;
  const __m512i ic0 = Q4_0::idx_codes0(), ic1 = Q4_0::idx_codes1(), isc = Q4_0::idx_scales();
  const D dec;
  const size_t span = rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * Q4_0::bytes);
  const StreamPrefetch<> pg(Wg, span, prefetch), pu(Wu, span, prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* g = Wg + r * ld;
    const uint8_t* u = Wu + r * ld;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int k = 0;
    for (; k < nfull; ++k) {
      if (prefetch) {
        pg.ahead_block<144>(g + k * 144);
        pu.ahead_block<144>(u + k * 144);
      }
      const uint8_t* p[2] = {g + k * 144, u + k * 144};
      q4_0_group_rows<2>(p, x.q + static_cast<size_t>(k) * kQ4_0XGroupBytes, dec, acc);
    }
    if (8 * k < nb) {
      if (prefetch) {
        pg.ahead_block<144>(g + k * 144);
        pu.ahead_block<144>(u + k * 144);
      }
      const size_t xo = static_cast<size_t>(k) * kQ4_0XGroupBytes;
      q4_0_group<1>(g + k * 144, nb - 8 * k, &x, xo, dec, ic0, ic1, isc, &acc[0]);
      q4_0_group<1>(u + k * 144, nb - 8 * k, &x, xo, dec, ic0, ic1, isc, &acc[1]);
    }
    og[r] = rowred::hsum(acc[0]);
    ou[r] = rowred::hsum(acc[1]);
  }
}

// Q8_0: int8 codes as they are.
struct Q8_0 {
  static constexpr int elems = 32, bytes = 34;
  template <int NV>
  static inline void pair(const uint8_t* p, const Q8Ref* xs, int K, int k, __m512* acc) {
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(ld256(p + 2)), ld256(p + 36), 1);
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17, 17, 17, 17, 17,
                                         17, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 ws = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, ld512(p))));
    dot64<NV>(w, unsigned_x_start(w), ws, xs, K, k, acc);
  }
  template <int NV>
  static inline void single(const uint8_t* p, const Q8Ref* xs, int K, int k, __m512* acc) {
    const __m512i w = _mm512_zextsi256_si512(ld256(p + 2));
    dot32<NV>(w, unsigned_x_start(w), f16_bcast(p), xs, K, k, acc);
  }
};

template <class T, int NV>
void rows32(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 32;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * T::bytes), prefetch);
  int r = 0;
  if constexpr (NV == 1) {
    // 4 rows at a time where the rows are long enough (stream_prefetch.h's multirow), as rows256
    const int side_rows = multirow(static_cast<size_t>(nb) * T::bytes, 1) ? nrows : 0;
    for (; r + 4 <= side_rows; r += 4) {
      const uint8_t* w = W + r * ld;
      __m512 acc[4];
      #pragma GCC unroll 8
      for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
      int b = 0;
      for (; b + 2 <= nb; b += 2) {
        if (prefetch) pf.ahead_block<8 * T::bytes>(w + 4 * b * T::bytes);
        for (int i = 0; i < 4; ++i) T::template pair<1>(w + i * ld + b * T::bytes, xs, K, 32 * b, &acc[i]);
      }
      if (b < nb) {
        for (int i = 0; i < 4; ++i) T::template single<1>(w + i * ld + b * T::bytes, xs, K, 32 * b, &acc[i]);
      }
      _mm_storeu_ps(out + r, rowred::hsum_x4(acc[0], acc[1], acc[2], acc[3]));
    }
  }
  for (; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    __m512 acc[NV];
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
      if (prefetch) pf.ahead_block<2 * T::bytes>(w + b * T::bytes);
      T::template pair<NV>(w + b * T::bytes, xs, K, 32 * b, acc);
    }
    if (b < nb) T::template single<NV>(w + b * T::bytes, xs, K, 32 * b, acc);
    rowred::store_sums(acc, NV, out + r, os);
  }
}

// K-quants take x in groups of 256 (one dx per super-block, as ggml's Q8_K). Every VPDPBUSD lane
// then fits in int16 (|lane| <= 4 * 63 * 127), so two results pack into words exactly (packed pairs,
// below) and VPMADDWD / VPDPWSSD multiply them by their sub-blocks' integer scales and sum into int32:
// the whole super-block stays integer and is converted and scaled by d * dx once. Against scaling
// each result by itself (a VPMADDWD or VPDPWSSD per result) this takes 2 of Zen 4's 512-bit multiply
// slots a super-block and vector off 8 (Q4_K; Q6_K 2 off 9): gguf's batch 8 took 6% less time in
// cache on the 2-core Zen 4, where these 512-bit operations and VFMADD231PS share one a cycle
// (docs/benchmarks.md, thirtieth session).

// The 6-bit scales (bytes 0..7) and mins (bytes 8..15) of Q4_K/Q5_K super-blocks, one per 128-bit
// lane of v, from the 16 bytes at p + 4 of each block (the 12 scale bytes s0..s11; the rest is the
// block's next field, unused):
//   sc0..3 = s0..3 & 63, sc4..7 = (s8..11 & 15) | (s0..3 >> 6) << 4,
//   mn0..3 = s4..7 & 63, mn4..7 = (s8..11 >> 4) | (s4..7 >> 6) << 4
inline __m512i kquant_scale_bytes(__m512i v) {
  const __m512i a = _mm512_shuffle_epi8(
      v, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
  const __m512i top = _mm512_shuffle_epi8(
      v, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
  const __m512i low = _mm512_and_si512(
      _mm512_mask_blend_epi16(0xC0C0C0C0u, a, _mm512_srli_epi16(a, 4)),
      _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15)));
  return _mm512_or_si512(low, _mm512_and_si512(_mm512_srli_epi16(top, 2), _mm512_set1_epi8(0x30)));
}
// The scales (lanes 0..7) and mins (lanes 8..15) of one super-block as int32.
inline __m512i kquant_scales(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm512_castsi512_si128(kquant_scale_bytes(_mm512_castsi128_si512(ld128(p + 4)))));
}
// The same for the super-blocks at p[i], i < 4: one decode for all four.
inline void kquant_scales_at(const uint8_t* const* p, __m512i* sc) {
  __m512i v = _mm512_castsi128_si512(ld128(p[0] + 4));
  v = _mm512_inserti32x4(v, ld128(p[1] + 4), 1);
  v = _mm512_inserti32x4(v, ld128(p[2] + 4), 2);
  v = _mm512_inserti32x4(v, ld128(p[3] + 4), 3);
  v = kquant_scale_bytes(v);
  sc[0] = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(v));
  sc[1] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1));
  sc[2] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2));
  sc[3] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 3));
}

// Packed pairs: the K-quant kernels multiply each VPDPBUSD result (16 int32 lanes, each fitting
// int16) by its scales after packing two of them into one register of words (VPACKSSDW, exact), so
// one VPMADDWD / VPDPWSSD scales two results: per 128-bit lane L the pack holds dwords 4L..4L+3 of
// the first, then of the second, and word pair q (q < 4) of the lane comes from the first for q < 2.
// The tables are VPERMW indices that put each pair's scale (as a word) on both its words.
struct WordIndex {
  alignas(64) int16_t w[32];
};
// Q4_K / Q5_K: scales as dwords (word 2s holds scale s); the first result's lanes 0..7 are
// sub-block `base`, 8..15 `base + 2`, the second's `base + 1` and `base + 3`.
constexpr WordIndex kquant_pair_index(int base) {
  WordIndex t{};
  for (int w = 0; w < 32; ++w) {
    const int lane = w / 8, q = (w / 2) % 4;
    t.w[w] = static_cast<int16_t>(2 * (base + (lane < 2 ? 0 : 2) + (q < 2 ? 0 : 1)));
  }
  return t;
}
// Q6_K: scales as words (scale s at word s); dword i of result g has scale 4g + i / 4, so in lane L
// the first result's pairs take scale `base + L`, the second's `base + 4 + L`.
constexpr WordIndex q6k_pair_index(int base) {
  WordIndex t{};
  for (int w = 0; w < 32; ++w) {
    const int lane = w / 8, q = (w / 2) % 4;
    t.w[w] = static_cast<int16_t>(base + (q < 2 ? 0 : 4) + lane);
  }
  return t;
}
constexpr WordIndex kKPair01 = kquant_pair_index(0), kKPair23 = kquant_pair_index(4);
constexpr WordIndex kQ6Pair01 = q6k_pair_index(0), kQ6Pair23 = q6k_pair_index(8);
inline __m512i ld_index(const WordIndex& t) { return _mm512_load_si512(t.w); }

// Q4_K / Q5_K: codes 0..15 (0..31) per 32-element sub-block with 6-bit scale sc and min m: the min
// terms dmin * m[s] multiply the fp32 sums of x, 8 lanes per super-block. x comes in the kQ8KQuant
// layout (sub-blocks 0, 2, 1, 3, 4, 6, 5, 7 of each super-block): the low nibbles of 64 qs bytes are
// then sub-blocks 2c and 2c + 2's codes in x's order, the high nibbles 2c + 1 and 2c + 3's.
template <bool kQ5>
struct QK45 {
  static constexpr int elems = 256, bytes = kQ5 ? 176 : 144;
  static constexpr bool kScalesX4 = true;  // rows256's 4-row loop decodes the scales of 4 rows at once
  // One super-block of a row, decoded once for every vector that meets it.
  struct Block {
    __m512i codes[4];  // sub-blocks (0, 2), (1, 3), (4, 6), (5, 7)
    __m512i s01, s23;  // the scales of the packed pairs
    __m256 M;          // the min terms dmin * m[s], sub-block s in lane s
    float d;
  };
  static inline Block decode(const uint8_t* p) { return decode_sc(p, kquant_scales(p)); }
  // sc: kquant_scales(p)
  static inline Block decode_sc(const uint8_t* p, __m512i sc) {
    Block w;
    // d and dmin in one conversion
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u16(p) | uint32_t{load_u16(p + 2)} << 16)));
    w.d = _mm_cvtss_f32(dd);
    w.M = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(sc, 1)), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
    const uint8_t* qs = p + (kQ5 ? 48 : 16);
    const __m512i m = _mm512_set1_epi8(15);
    for (int c = 0; c < 2; ++c) {
      const __m512i q = ld512(qs + 64 * c);
      w.codes[2 * c] = _mm512_and_si512(q, m);
      w.codes[2 * c + 1] = high_nibbles(q);
    }
    if (kQ5) {
      // bit s of qh[l] is bit 4 of element l of sub-block s
      const __m512i qh = _mm512_broadcast_i64x4(ld256(p + 16));
      for (int v = 0; v < 4; ++v) {
        const int s0 = 4 * (v / 2) + v % 2;  // the vector's sub-blocks s0 (bytes 0..31) and s0 + 2
        const __m512i bit = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi8(static_cast<char>(1 << s0)),
                                                    _mm512_set1_epi8(static_cast<char>(1 << (s0 + 2))));
        w.codes[v] =
            _mm512_mask_add_epi8(w.codes[v], _mm512_test_epi8_mask(qh, bit), w.codes[v], _mm512_set1_epi8(16));
      }
    }
    w.s01 = _mm512_permutexvar_epi16(ld_index(kKPair01), sc);
    w.s23 = _mm512_permutexvar_epi16(ld_index(kKPair23), sc);
    return w;
  }
  // The block against one vector x whose 4 lines of codes at k are xv.
  // dd = d * dx (x's scale of this super-block).
  static inline void dot(const Block& w, const __m512i* xv, float dd, const Q8Ref& /*x*/, int /*K*/, int /*k*/,
                         __m512& acc) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i p01 =
        _mm512_packs_epi32(_mm512_dpbusd_epi32(z, w.codes[0], xv[0]), _mm512_dpbusd_epi32(z, w.codes[1], xv[1]));
    const __m512i p23 =
        _mm512_packs_epi32(_mm512_dpbusd_epi32(z, w.codes[2], xv[2]), _mm512_dpbusd_epi32(z, w.codes[3], xv[3]));
    const __m512i i = _mm512_dpwssd_epi32(_mm512_madd_epi16(p01, w.s01), p23, w.s23);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(dd), acc);
  }
  // Less the min terms against x's fp32 sums per sub-block, in lanes 0..7 of the same accumulator:
  // against a separate 8-lane one (subtracted at the end) gguf's batch 8 took 4% less time in cache
  // on the 2-core Zen 4, with 8 registers fewer (docs/benchmarks.md, thirtieth session).
  static inline void mins(const Block& w, const Q8Ref& x, int K, int k, __m512& acc) {
    const __m256 xsum = _mm256_loadu_ps(reinterpret_cast<const float*>(x.q + 2 * K + k / 8));
    acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(w.M), _mm512_zextps256_ps512(xsum), acc);
  }
};
// Q6_K: unsigned codes 0..63 against signed x (lanes <= 4 * 63 * 127 fit int16), an int8 scale per
// 16 elements (4 lanes); the offset -32 is one more VPDPWSSD per block and vector: x's int16 code
// sums per 16 elements (kQ8Q6K layout) times the block's scales * -32.
struct Q6K {
  static constexpr int elems = 256, bytes = 210;
  static constexpr bool kScalesX4 = false;
  struct Block {
    __m512i cv[4];     // elements 64g..64g+63
    __m512i s01, s23;  // the scales of the packed pairs
    __m512i scm;       // the scales * -32
    float d;
  };
  static inline Block decode(const uint8_t* p) {
    Block w;
    const __m128i s8 = ld128(p + 192);
    const __m256i sc16 = _mm256_cvtepi8_epi16(s8);  // the int8 scales as words
    const __m512i sc = _mm512_castsi256_si512(sc16);
    w.scm = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
    w.d = _cvtsh_ss(load_u16(p + 208));
    const __m512i shl = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                         0x0002000200020002, 0x0004000400040004, 0x0004000400040004,
                                         0x0004000400040004, 0x0004000400040004);
    const __m512i shr = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                         0x0002000200020002, 0, 0, 0, 0);
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      __m512i ql = ld512(p + 64 * h);
      FT_IN_REGISTER(ql);
      const __m512i hz = _mm512_broadcast_i64x4(ld256(p + 128 + 32 * h));
      // codes (a & b) | c: 0xEA
      w.cv[2 * h] = _mm512_ternarylogic_epi32(ql, m0f, _mm512_and_si512(_mm512_sllv_epi16(hz, shl), m30), 0xEA);
      w.cv[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m0f,
                                                  _mm512_and_si512(_mm512_srlv_epi16(hz, shr), m30), 0xEA);
    }
    w.s01 = _mm512_permutexvar_epi16(ld_index(kQ6Pair01), sc);
    w.s23 = _mm512_permutexvar_epi16(ld_index(kQ6Pair23), sc);
    return w;
  }
  static inline void dot(const Block& w, const __m512i* xv, float dd, const Q8Ref& x, int K, int k, __m512& acc) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i p01 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, w.cv[0], xv[0]), _mm512_dpbusd_epi32(z, w.cv[1], xv[1]));
    const __m512i p23 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, w.cv[2], xv[2]), _mm512_dpbusd_epi32(z, w.cv[3], xv[3]));
    __m512i i = _mm512_dpwssd_epi32(_mm512_madd_epi16(p01, w.s01), p23, w.s23);
    i = _mm512_dpwssd_epi32(i, _mm512_zextsi256_si512(ld256(x.q + 2 * K + k / 8)), w.scm);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(dd), acc);
  }
  static inline void mins(const Block&, const Q8Ref&, int, int, __m512&) {}  // no min terms
};

// x's 4 lines of codes for the super-block at k.
struct XLines {
  __m512i v[4];
  XLines(const Q8Ref& x, int k) {
    for (int c = 0; c < 4; ++c) v[c] = ld512(x.q + k + 64 * c);
  }
  // the same, held in registers: the compiler would otherwise fold each load into every row's
  // VPDPBUSD as its memory operand, loading the line once per row
  XLines(const Q8Ref& x, int k, int /*held*/) : XLines(x, k) {
    for (int c = 0; c < 4; ++c) FT_IN_REGISTER(v[c]);
  }
};
// Rows' super-blocks at p[i], i < R, against one vector x at k, x's lines loaded once for all R
// (held in registers), each row decoded just before its products (R rows' decoded blocks at once
// would not fit the registers). sc: the rows' kquant_scales where the caller decoded them at once.
template <class T, int R>
inline void dot_rows_x1(const uint8_t* const* p, const __m512i* sc, const Q8Ref& x, int K, int k, __m512* acc) {
  const XLines xl = R == 1 ? XLines(x, k) : XLines(x, k, 0);
  const float dx = load_f32(x.q + K + k);
  for (int i = 0; i < R; ++i) {
    typename T::Block blk;
    if constexpr (T::kScalesX4) {
      blk = sc ? T::decode_sc(p[i], sc[i]) : T::decode(p[i]);
    } else {
      blk = T::decode(p[i]);
    }
    T::dot(blk, xl.v, blk.d * dx, x, K, k, acc[i]);
    T::mins(blk, x, K, k, acc[i]);
  }
}

// 4 rows at w (ld apart) against one vector, side by side (their 4 streams advance together): x's
// lines are loaded once for the 4 rows, and each row's arithmetic is exactly rows256's single-row
// loop's; the 4 sums by one transposed reduction, to out[0..3].
template <class T>
void rows256_x4(const uint8_t* w, size_t ld, int nb, const Q8Ref& x, int K, float* out, const StreamPrefetch<>* pf) {
  __m512 acc[4];
  #pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    if (pf) pf->ahead_block<4 * T::bytes>(w + 4 * b * T::bytes);
    const uint8_t* p[4];
    for (int i = 0; i < 4; ++i) p[i] = w + i * ld + b * T::bytes;
    if constexpr (T::kScalesX4) {
      __m512i sc[4];
      kquant_scales_at(p, sc);
      dot_rows_x1<T, 4>(p, sc, x, K, 256 * b, acc);
    } else {
      dot_rows_x1<T, 4>(p, nullptr, x, K, 256 * b, acc);
    }
  }
  _mm_storeu_ps(out, rowred::hsum_x4(acc[0], acc[1], acc[2], acc[3]));
}

template <class T, int NV>
void rows256(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int K, float* out, int os, int prefetch) {
  const int nb = K / 256;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * T::bytes), prefetch);
  // One vector: 4 rows at a time where the rows are long enough (stream_prefetch.h's multirow).
  // Several vectors: one row at a time. Two rows of several vectors sharing x's loads (q4_0's
  // choice) took 16-20% longer on the 2-core Zen 4 with the accumulators of 8 vectors spilled or
  // with the vectors in two halves of 4 (each row's super-block decoded twice), and were no faster
  // on this kernel as it is (docs/benchmarks.md, thirtieth session).
  int r = 0;
  if constexpr (NV == 1) {
    const int side = multirow(static_cast<size_t>(nb) * T::bytes, 1) ? nrows : 0;
    for (; r + 4 <= side; r += 4) rows256_x4<T>(W + r * ld, ld, nb, xs[0], K, out + r, prefetch ? &pf : nullptr);
  }
  // Several vectors: the vectors' dx per super-block gathered once a call (8 a super-block), so
  // that each row's super-block makes its d * dx for all of them in one multiply, bit for bit the
  // single products of dot_rows_x1 (the compiler broadcasts each lane by shuffles; forcing broadcasts
  // from memory instead took 15% longer on the 2-core Zen 4).
  constexpr int kStackBlocks = 64;  // K <= 16384 on the stack
  alignas(32) float dx_stack[NV > 1 ? 8 * kStackBlocks : 1];
  std::vector<float> dx_heap;
  float* dxt = dx_stack;
  if constexpr (NV > 1) {
    if (nb > kStackBlocks) dx_heap.resize(8 * static_cast<size_t>(nb) + 8), dxt = dx_heap.data();
    for (int b = 0; b < nb; ++b) {
      for (int j = 0; j < 8; ++j) dxt[8 * b + j] = j < NV ? load_f32(xs[j].q + K + 256 * b) : 0.f;
    }
  }
  for (; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    __m512 acc[NV];
    #pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      if (prefetch) pf.ahead_block<T::bytes>(w + b * T::bytes);
      if constexpr (NV == 1) {
        const uint8_t* p = w + b * T::bytes;
        dot_rows_x1<T, 1>(&p, nullptr, xs[0], K, 256 * b, acc);
      } else {
        const typename T::Block blk = T::decode(w + b * T::bytes);
        alignas(32) float dd[8];
        _mm256_store_ps(dd, _mm256_mul_ps(_mm256_set1_ps(blk.d), _mm256_loadu_ps(dxt + 8 * b)));
        #pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) {
          const XLines xl(xs[j], 256 * b);
          T::dot(blk, xl.v, dd[j], xs[j], K, 256 * b, acc[j]);
          T::mins(blk, xs[j], K, 256 * b, acc[j]);
        }
      }
    }
    // 4 vectors at a time by transposed sums (the same trees): against one reduction per vector,
    // gguf's batch 8 (Q4_K / Q6_K, rows of 3-8 super-blocks) took 4% less time in cache on the
    // 2-core Zen 4 (docs/benchmarks.md, thirtieth session)
    rowred::store_sums(acc, NV, out + r, os);
  }
}

}  // namespace

// The int8 codes of the group x[0, n) (n a multiple of 32) into q (n bytes, xor `flip`); returns dx.
inline float quantize_group(const float* x, int n, uint8_t* q, __m256i flip) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 mx = _mm512_setzero_ps();
  for (int k = 0; k < n; k += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(x + k), absmask));
  const float amax = _mm512_reduce_max_ps(mx);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  for (int k = 0; k < n; k += 32) {
    // round half to even (MXCSR default), |x * inv| <= 127 up to rounding: clamp, then narrow
    const __m512i q0 = _mm512_max_epi32(
        _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv)), lim), nlim);
    const __m512i q1 = _mm512_max_epi32(
        _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 16), vinv)), lim), nlim);
    const __m256i qb =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)), _mm512_cvtepi32_epi8(q1), 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_xor_si256(qb, flip));
  }
  return amax / 127.f;
}

void quantize(const float* x, int k0, int k1, int K, int G, bool unsigned_x, int layout, void* base) {
  auto* b = static_cast<uint8_t*>(base);
  auto* dl = reinterpret_cast<float*>(b + K);
  auto* xsum = reinterpret_cast<float*>(b + 2 * static_cast<size_t>(K));
  const __m256i flip = _mm256_set1_epi8(unsigned_x ? static_cast<char>(0x80) : 0);
  for (int g = k0; g < k1; g += G) {
    const int ge = std::min(g + G, k1);  // a shorter last group (whole 32-blocks)
    float dx;
    if (layout == kQ8KQuant && ge - g == 256) {
      alignas(64) uint8_t codes[256];
      dx = quantize_group(x + g, 256, codes, flip);
      // sub-blocks 0, 2, 1, 3, 4, 6, 5, 7
      for (int sb = 0; sb < 8; ++sb) {
        const int pos = 4 * (sb / 4) + 2 * (sb % 2) + (sb % 4) / 2;
        std::memcpy(b + g + 32 * pos, codes + 32 * sb, 32);
      }
    } else {
      dx = quantize_group(x + g, ge - g, b + g, flip);
    }
    for (int k = g; k < ge; k += 32) {
      if (layout == kQ8Q6K) {  // int16 sums of the codes per 16 elements in xsum's place
        auto* cs = reinterpret_cast<int16_t*>(xsum) + k / 16;
        for (int h = 0; h < 2; ++h) {
          int sum = 0;
          for (int i = 0; i < 16; ++i) sum += static_cast<int8_t>(b[k + 16 * h + i]);
          cs[h] = static_cast<int16_t>(sum);
        }
      } else {
        xsum[k / 32] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(x + k + 16)));
      }
      _mm256_storeu_ps(dl + k / 4, _mm256_set1_ps(dx));
    }
  }
}

void quantize_q4_0(const float* x, int k0, int k1, void* base) {
  for (int g = k0; g < k1; g += 256) {
    uint8_t* rec = static_cast<uint8_t*>(base) + static_cast<size_t>(g / 256) * kQ4_0XGroupBytes;
    const int n = std::min(256, k1 - g);
    alignas(64) uint8_t codes[256];
    std::memset(codes, 0, sizeof codes);
    const float dx = quantize_group(x + g, n, codes, _mm256_setzero_si256());
    // block b's elements 0..15 to bytes 128 (b / 4) + 16 (b % 4), 16..31 to 64 bytes further
    for (int blk = 0; blk < 8; ++blk) {
      uint8_t* dst = rec + 128 * (blk / 4) + 16 * (blk % 4);
      std::memcpy(dst, codes + 32 * blk, 16);
      std::memcpy(dst + 64, codes + 32 * blk + 16, 16);
    }
    for (int c = 0; c < 2; ++c) {
      const __m512i lo = ld512(rec + 128 * c), hi = ld512(rec + 128 * c + 64);
      const __m512i one = _mm512_set1_epi8(1);
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), one, lo), one, hi);
      _mm512_storeu_si512(rec + 256 + 64 * c, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-8)));
    }
    std::memset(rec + 384, 0, kQ4_0XGroupBytes - 384);
    std::memcpy(rec + 384, &dx, sizeof dx);
  }
}

namespace {
template <class T>
void q8_32(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows32<T, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
template <class D>
void q8_q4_0(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows_q4_0<decltype(nv)::value, D>(W, ld, nrows, xs, K, out, os, pf); });
}

template <class T>
void q8_256(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os, int pf) {
  dispatch_n(n, [&](auto nv) { rows256<T, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, pf); });
}
// gate_up_q4_0's side-by-side rows for the K-quants: row r of gate and of up against one vector,
// super-block by super-block, each row's arithmetic and sum exactly rows256's single-row loop.
template <class T>
void gate_up256(const uint8_t* Wg, const uint8_t* Wu, size_t ld, int nrows, const Q8Ref& x, int K, float* og,
                float* ou, int prefetch) {
  const int nb = K / 256;
  const size_t span = rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * T::bytes);
  const StreamPrefetch<> pg(Wg, span, prefetch), pu(Wu, span, prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* g = Wg + r * ld;
    const uint8_t* u = Wu + r * ld;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int b = 0;
    if constexpr (T::kScalesX4) {
      // two super-blocks of each row at a time, the 4 blocks' scales decoded at once (on the 2-core
      // Zen 4 the one-vector K-quant kernels are bound by their own operations: docs/benchmarks.md,
      // thirty-first session)
      for (; b + 2 <= nb; b += 2) {
        if (prefetch) {
          pg.ahead_block<2 * T::bytes>(g + b * T::bytes);
          pu.ahead_block<2 * T::bytes>(u + b * T::bytes);
        }
        const uint8_t* p[4] = {g + b * T::bytes, u + b * T::bytes, g + (b + 1) * T::bytes, u + (b + 1) * T::bytes};
        __m512i sc[4];
        kquant_scales_at(p, sc);
        dot_rows_x1<T, 2>(p, sc, x, K, 256 * b, acc);
        dot_rows_x1<T, 2>(p + 2, sc + 2, x, K, 256 * (b + 1), acc);
      }
    }
    for (; b < nb; ++b) {
      if (prefetch) {
        pg.ahead_block<T::bytes>(g + b * T::bytes);
        pu.ahead_block<T::bytes>(u + b * T::bytes);
      }
      const uint8_t* p[2] = {g + b * T::bytes, u + b * T::bytes};
      dot_rows_x1<T, 2>(p, nullptr, x, K, 256 * b, acc);
    }
    og[r] = rowred::hsum(acc[0]);
    ou[r] = rowred::hsum(acc[1]);
  }
}

}  // namespace
}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#define FT_GGML_TIERS(scalar_fn, T) \
  {scalar_fn, avx2::rows<avx2::T>, avx512::rows<avx512::T>, avx512::rows<avx512::T>}, \
      {multi_scalar<scalar_fn>, avx2::multi<avx2::T>, avx512::multi<avx512::T>, avx512::multi<avx512::T>}
#define FT_GGML_F16_TIERS                                                                          \
  {rows_f16_scalar, avx2::rows_f16, avx512::rows_f16, avx512::rows_f16},                           \
      {multi_scalar<rows_f16_scalar>, avx2::multi_f16, avx512::multi_f16, avx512::multi_f16}
#define FT_GGML_Q8(R, T) vnni::R<vnni::T>
#define FT_GGML_Q8_Q4_0(D) vnni::q8_q4_0<vnni::D>
#define FT_GGML_Q8_GATE_UP_Q4_0(D) vnni::gate_up_q4_0<vnni::D>
#define FT_GGML_Q8_GATE_UP(T) vnni::gate_up256<vnni::T>
#define FT_GGML_Q8_AVX2(T) avx2q8::q8_##T
#else
#define FT_GGML_TIERS(scalar_fn, T) \
  {scalar_fn, scalar_fn, scalar_fn, scalar_fn}, \
      {multi_scalar<scalar_fn>, multi_scalar<scalar_fn>, multi_scalar<scalar_fn>, multi_scalar<scalar_fn>}
#define FT_GGML_F16_TIERS                                                      \
  {rows_f16_scalar, rows_f16_scalar, rows_f16_scalar, rows_f16_scalar},        \
      {multi_scalar<rows_f16_scalar>, multi_scalar<rows_f16_scalar>, multi_scalar<rows_f16_scalar>, \
       multi_scalar<rows_f16_scalar>}
#define FT_GGML_Q8(R, T) nullptr
#define FT_GGML_Q8_Q4_0(D) nullptr
#define FT_GGML_Q8_GATE_UP_Q4_0(D) nullptr
#define FT_GGML_Q8_GATE_UP(T) nullptr
#define FT_GGML_Q8_AVX2(T) nullptr
#endif  // FT_X86

namespace {

// The supported types, in the order they are listed in errors. In the avx512_bf16 tier the types
// with a q8 kernel take int8 activations (VNNI); the others run the AVX-512 fp32 kernels there (the
// weights are dequantized to fp32 in registers either way, and a bf16 dot product would only add a
// conversion). In the avx2 tier the types with a q8_avx2 kernel (Q4_0, MXFP4, Q4_K, Q5_K, Q6_K) take int8
// activations too.
const TypeInfo kTypes[] = {
    {8, "Q8_0", 32, 34, FT_GGML_TIERS((rows_scalar<32, 34, deq_q8_0>), Q8_0), FT_GGML_Q8(q8_32, Q8_0), true, 32, 0, nullptr},
    {2, "Q4_0", 32, 18, FT_GGML_TIERS((rows_scalar<32, 18, deq_q4_0>), Q4_0), FT_GGML_Q8_Q4_0(Q4_0Dwords), false, 256,
     kQ8Q4_0, FT_GGML_Q8_AVX2(q4_0), 8, FT_GGML_Q8_GATE_UP_Q4_0(Q4_0Dwords), FT_GGML_Q8_Q4_0(Q4_0Words),
     FT_GGML_Q8_GATE_UP_Q4_0(Q4_0Words)},
    {30, "BF16", 1, 2, {rows_bf16<Isa::scalar>, rows_bf16<Isa::avx2>, rows_bf16<Isa::avx512>, rows_bf16<Isa::avx512>},
     {multi_bf16<Isa::scalar>, multi_bf16<Isa::avx2>, multi_bf16<Isa::avx512>, multi_bf16<Isa::avx512>}, nullptr, false,
     32, 0, nullptr},
    {1, "F16", 1, 2, FT_GGML_F16_TIERS, nullptr, false, 32, 0, nullptr},
    {39, "MXFP4", 32, 17, FT_GGML_TIERS((rows_scalar<32, 17, deq_mxfp4>), MXFP4), nullptr, false, 32, 0,
     FT_GGML_Q8_AVX2(mxfp4), 12},
    {12, "Q4_K", 256, 144, FT_GGML_TIERS((rows_scalar<256, 144, deq_q4_k>), Q4_K), FT_GGML_Q8(q8_256, QK45<false>),
     false, 256, kQ8KQuant, FT_GGML_Q8_AVX2(q4_k), 0, FT_GGML_Q8_GATE_UP(QK45<false>)},
    {14, "Q6_K", 256, 210, FT_GGML_TIERS((rows_scalar<256, 210, deq_q6_k>), Q6_K), FT_GGML_Q8(q8_256, Q6K), false,
     256, kQ8Q6K, FT_GGML_Q8_AVX2(q6_k), 0, FT_GGML_Q8_GATE_UP(Q6K)},
    {13, "Q5_K", 256, 176, FT_GGML_TIERS((rows_scalar<256, 176, deq_q5_k>), Q5_K), FT_GGML_Q8(q8_256, QK45<true>),
     false, 256, kQ8KQuant, FT_GGML_Q8_AVX2(q5_k), 0, FT_GGML_Q8_GATE_UP(QK45<true>)},
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

#if FT_X86
void q8_quantize(const float* x, int k0, int k1, int K, int G, bool unsigned_x, int layout, void* base) {
  vnni::quantize(x, k0, k1, K, G, unsigned_x, layout, base);
}
void q8_avx2k_quantize(const float* x, int k0, int k1, int K, void* base) {
  avx2q8::quantize_kquant(x, k0, k1, K, base);
}
void q4_0_xq_quantize(const float* x, int k0, int k1, void* base) { vnni::quantize_q4_0(x, k0, k1, base); }
#else
void q8_quantize(const float*, int, int, int, int, bool, int, void*) { throw Error("q8_quantize needs AVX-512"); }
void q4_0_xq_quantize(const float*, int, int, void*) { throw Error("q4_0_xq_quantize needs AVX-512"); }
void q8_avx2k_quantize(const float*, int, int, int, void*) { throw Error("q8_avx2k_quantize needs AVX2"); }
#endif

GgmlMoeFormat::GgmlMoeFormat(const MoeParams& p, const Matrix& gate, const Matrix& up, const Matrix& down)
    : p_(p), gate_(gate), up_(up), down_(down) {
  avx2_q8_ = p.isa == Isa::avx2;
  auto has_q8 = [&](const TypeInfo* t) {
    return p.isa == Isa::avx512_bf16 ? t->q8 != nullptr : avx2_q8_ && t->q8_avx2 != nullptr;
  };
  gu_q8_ = has_q8(gate.type) && has_q8(up.type) && gate.type == up.type;
  down_q8_ = has_q8(down.type);
  // $FT_CPU_MOE_Q4_0_GATHER (auto, dwords or words), read when a layer with Q4_0 rows is made: how the
  // avx512_bf16 tier's Q4_0 kernels gather a group's codes and scales (TypeInfo::q8_words; the same
  // results either way). auto: words except on Intel, whose permutes all run on one port, where
  // Zen 4 is bound by its loads (Q4_0Words).
  const auto q4_0 = [](const TypeInfo* t) { return t->q8_words != nullptr; };
  if (q4_0(gate.type) || q4_0(up.type) || q4_0(down.type)) {
    const std::string v = amx::kernel_choice("FT_CPU_MOE_Q4_0_GATHER", p.isa,
                                             {{"dwords", Isa::avx512_bf16}, {"words", Isa::avx512_bf16}},
                                             "auto, dwords or words");
    if (p.isa == Isa::avx512_bf16) q4_0_gather_ = v != "auto" ? v : cpu_is_intel() ? "dwords" : "words";
    q4_0_words_ = q4_0_gather_ == "words";
  }
}

Q8Fn GgmlMoeFormat::q8_fn(const TypeInfo& t) const {
  if (avx2_q8_) return t.q8_avx2;
  return t.q8_words && q4_0_words_ ? t.q8_words : t.q8;
}

Q8GateUpFn GgmlMoeFormat::q8_gate_up_fn(const TypeInfo& t) const {
  if (avx2_q8_) return nullptr;
  return t.q8_gate_up_words && q4_0_words_ ? t.q8_gate_up_words : t.q8_gate_up;
}

size_t GgmlMoeFormat::xq_bytes(const TypeInfo& t, int K) const {
#if FT_X86
  if (avx2_q8_ && t.q8_avx2_pairs) return pairs::record_bytes(K);
#endif
  if (avx2_q8_) return q8_avx2k_bytes(K);
  return t.q8_layout == kQ8Q4_0 ? q4_0_xq_bytes(K) : q8_bytes(K);
}

void GgmlMoeFormat::xq_quantize(const TypeInfo& t, const float* x, int k0, int k1, int K, void* base) const {
  if (avx2_q8_ && t.q8_avx2_pairs) {
#if FT_X86
    pairs::quantize(x + k0, k0, k1, pairs::PairOrder::kHalves, t.q8_avx2_pairs, 32, base);
#endif
  } else if (avx2_q8_) {
    q8_avx2k_quantize(x, k0, k1, K, base);
  } else if (t.q8_layout == kQ8Q4_0) {
    q4_0_xq_quantize(x, k0, k1, base);
  } else {
    q8_quantize(x, k0, k1, K, t.q8_group, t.q8_xu, t.q8_layout, base);
  }
}

void GgmlMoeFormat::prep_input(const TaskInput& in) {
  if (!gu_q8_) return;
  const int H = p_.hidden;
  const size_t nb = x_stride();
  if (xq_.size() < in.num_tokens * nb) xq_.resize(in.num_tokens * nb);
  for (int t = 0; t < in.num_tokens; ++t) {
    xq_quantize(*gate_.type, in.x_f32 + static_cast<size_t>(t) * H, 0, H, H, xq_.data() + t * nb);
  }
}

void GgmlMoeFormat::prep_inter(const float* h, int i0, int i1, void* prepped) const {
  if (down_q8_) xq_quantize(*down_.type, h, i0, i1, p_.intermediate, prepped);
}

void GgmlMoeFormat::mat_rows(const Matrix& m, bool q8, int e, int r0, int r1, const float* const* xs,
                             const Q8Ref* qs, int n, int K, float* out, int os) const {
  const uint8_t* w = m.data + e * m.expert_stride + r0 * m.row_bytes;
  const int isa = static_cast<int>(p_.isa), rows = r1 - r0;
  if (q8) {
    // The kernels read 4 rows interleaved, which the hardware prefetchers of Zen 5 do not follow (2
    // threads, 1 GiB pool: q4_0 0.73 -> 0.45 of the read bandwidth without software prefetch); the
    // prefetch walks the 4 rows' span in address order. On a 2-core Zen 3 the avx2 tier's kernels
    // took the sum of their compute and memory time without it (docs/benchmarks.md).
    q8_fn(*m.type)(w, m.row_bytes, rows, qs, n, K, out, os, p_.prefetch);
  } else if (n == 1) {
    m.type->rows[isa](w, m.row_bytes, rows, xs[0], K, out, p_.prefetch);
  } else {
    m.type->multi[isa](w, m.row_bytes, rows, xs, n, K, out, os, p_.prefetch);
  }
}

void GgmlMoeFormat::gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
                            float* up) const {
  gate_up_tokens(in, e, &t, &in_scale, 1, i0, i1, gate, up, 0);
}

void GgmlMoeFormat::gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n,
                                   int i0, int i1, float* gate, float* up, int stride) const {
  const int H = p_.hidden, rows = i1 - i0;
  const float* xs[kMaxTokensPerCall];
  Q8Ref qs[kMaxTokensPerCall];
  for (int j = 0; j < n; ++j) {
    xs[j] = in.x_f32 + static_cast<size_t>(tokens[j]) * H;
    if (gu_q8_) qs[j] = Q8Ref{xq_.data() + tokens[j] * x_stride()};
  }
  // One vector, Q4_0 and the K-quants: gate row r and up row r side by side in one call where gate and
  // up go in turns (their finest turns), and where the rows are too short to go four at a time (the
  // one-row kernels would read them one by one): on a 2-core Zen 4, one thread in cache, q4_0's step
  // took 947 us against 1076 (gate rows, then up rows, one at a time) and gguf's 1055 against 1136
  // (docs/benchmarks.md, twenty-ninth session).
  const Q8GateUpFn side_by_side = gu_q8_ ? q8_gate_up_fn(*gate_.type) : nullptr;
  if (n == 1 && side_by_side && (t_gate_up_slice_bytes > 0 || !multirow(gate_.row_bytes, 1))) {
    const uint8_t* wg = gate_.data + e * gate_.expert_stride + i0 * gate_.row_bytes;
    const uint8_t* wu = up_.data + e * up_.expert_stride + i0 * up_.row_bytes;
    side_by_side(wg, wu, gate_.row_bytes, rows, qs[0], H, gate, up, p_.prefetch);
  } else {
    auto part = [&](int r, int c, bool is_up) {
      mat_rows(is_up ? up_ : gate_, gu_q8_, e, i0 + r, i0 + r + c, xs, qs, n, H, (is_up ? up : gate) + r, stride);
    };
    gate_up_slices(rows, gate_.row_bytes, n, part);  // one vector: gate and up in turns (stream_prefetch.h)
  }
  const float* bg = gate_.bias ? gate_.bias + e * gate_.bias_stride + i0 : nullptr;
  const float* bu = up_.bias ? up_.bias + e * up_.bias_stride + i0 : nullptr;
  for (int j = 0; j < n; ++j) {
    float* g = gate + j * stride;
    float* u = up + j * stride;
    for (int i = 0; i < rows; ++i) {
      g[i] = in_scales[j] * g[i] + (bg ? bg[i] : 0.f);
      u[i] = in_scales[j] * u[i] + (bu ? bu[i] : 0.f);
    }
  }
}

void GgmlMoeFormat::down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const {
  const int I = p_.intermediate, rows = h1 - h0;
  const float* hs[kMaxTokensPerCall];
  Q8Ref qs[kMaxTokensPerCall];
  for (int j = 0; j < n; ++j) {
    hs[j] = routes[j].h;
    if (down_q8_) qs[j] = Q8Ref{static_cast<const uint8_t*>(routes[j].h_prepped)};
  }
  mat_rows(down_, down_q8_, e, h0, h1, hs, qs, n, I, out, stride);
  if (down_.bias) {
    const float* b = down_.bias + e * down_.bias_stride + h0;
    for (int j = 0; j < n; ++j) {
      for (int r = 0; r < rows; ++r) out[j * stride + r] += b[r];
    }
  }
}

}  // namespace ggml
}  // namespace ft
