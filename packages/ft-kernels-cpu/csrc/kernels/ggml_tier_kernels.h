// Row-dot kernels of the ggml block types, written once over a vector type V and compiled once per
// SIMD tier: ggml_blocks.cpp includes this file (deliberately without an include guard) inside a
// namespace that defines V, between target pragmas. V provides N fp32 lanes (8: AVX2, 16: AVX-512):
// F/I vector types, zero, lx (load N floats), u8/s8 (N bytes widened to int32), s8x (bytes
// N*part.. of a 128-bit register widened), cvt, andi, srl<n>,
// sll<n>, srlv, or_, subi, set, mul, fma (a*b+c), fms (a*b-c), add, hsum, f16x (N fp16), f16s (one fp16 scalar).
//
// Every block is dequantized in registers to fp32 and multiplied into fp32 accumulators; each row is
// read once, in address order. Blocks alternate between two pairs of accumulators to hide the FMA
// latency.

using F = V::F;
using I = V::I;
constexpr int N = V::N;

struct Q8_0 {
  static constexpr int elems = 32, bytes = 34;
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    const F d = V::set(V::f16s(p));
#pragma GCC unroll 4
    for (int c = 0; c < 32 / N; ++c) {
      F& a = (c & 1) ? a1 : a0;
      a = V::fma(V::mul(V::cvt(V::s8(p + 2 + c * N)), d), V::lx(x + c * N), a);
    }
  }
  static inline void deq(const uint8_t* p, F* w) {
    const F d = V::set(V::f16s(p));
    for (int c = 0; c < 32 / N; ++c) w[c] = V::mul(V::cvt(V::s8(p + 2 + c * N)), d);
  }
};

// 32 int8 codes (elements 0..15 in `lo`, 16..31 in `hi`) times x, scaled by d. The codes are split
// and offset as bytes (cheap 128-bit ops) and widened once: fewer wide ops than widening first.
inline void dot32_i8(__m128i lo, __m128i hi, const float* x, F d, F& a0, F& a1) {
#pragma GCC unroll 2
  for (int c = 0; c < 16 / N; ++c) {
    F& a = (c & 1) ? a1 : a0;
    const F t = V::mul(V::cvt(V::s8x(lo, c)), V::lx(x + c * N));
    a = V::fma(V::fma(V::cvt(V::s8x(hi, c)), V::lx(x + 16 + c * N), t), d, a);
  }
}

// 32 int8 codes as fp32 times d, in element order.
inline void deq32_i8(__m128i lo, __m128i hi, F d, F* w) {
  for (int c = 0; c < 16 / N; ++c) {
    w[c] = V::mul(V::cvt(V::s8x(lo, c)), d);
    w[16 / N + c] = V::mul(V::cvt(V::s8x(hi, c)), d);
  }
}

struct Q4_0 {
  static constexpr int elems = 32, bytes = 18;
  static inline void codes(const uint8_t* p, __m128i& lo, __m128i& hi) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i m = _mm_set1_epi8(15), c8 = _mm_set1_epi8(8);
    lo = _mm_sub_epi8(_mm_and_si128(raw, m), c8);
    hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), c8);
  }
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    __m128i lo, hi;
    codes(p, lo, hi);
    dot32_i8(lo, hi, x, V::set(V::f16s(p)), a0, a1);
  }
  static inline void deq(const uint8_t* p, F* w) {
    __m128i lo, hi;
    codes(p, lo, hi);
    deq32_i8(lo, hi, V::set(V::f16s(p)), w);
  }
};

struct MXFP4 {
  static constexpr int elems = 32, bytes = 17;
  static inline void codes(const uint8_t* p, __m128i& lo, __m128i& hi) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 1));
    const __m128i m = _mm_set1_epi8(15);
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    lo = _mm_shuffle_epi8(tab, _mm_and_si128(raw, m));
    hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(raw, 4), m));
  }
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    __m128i lo, hi;
    codes(p, lo, hi);
    dot32_i8(lo, hi, x, V::set(e8m0_half(p[0])), a0, a1);
  }
  static inline void deq(const uint8_t* p, F* w) {
    __m128i lo, hi;
    codes(p, lo, hi);
    deq32_i8(lo, hi, V::set(e8m0_half(p[0])), w);
  }
};

struct Q4_K {
  static constexpr int elems = 256, bytes = 144;
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    const float d = V::f16s(p), dmin = V::f16s(p + 2);
    uint8_t sc[8], mn[8];
    kquant_scale_min(p + 4, sc, mn);
    const uint8_t* qs = p + 16;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const F ds0 = V::set(d * sc[2 * j]), dm0 = V::set(dmin * mn[2 * j]);
      const F ds1 = V::set(d * sc[2 * j + 1]), dm1 = V::set(dmin * mn[2 * j + 1]);
#pragma GCC unroll 4
      for (int c = 0; c < 32 / N; ++c) {
        const I b = V::u8(qs + 32 * j + c * N);
        a0 = V::fma(V::fms(V::cvt(V::andi(b, 15)), ds0, dm0), V::lx(x + 64 * j + c * N), a0);
        a1 = V::fma(V::fms(V::cvt(V::template srl<4>(b)), ds1, dm1), V::lx(x + 64 * j + 32 + c * N), a1);
      }
    }
  }
  static inline void deq(const uint8_t* p, F* w) {
    const float d = V::f16s(p), dmin = V::f16s(p + 2);
    uint8_t sc[8], mn[8];
    kquant_scale_min(p + 4, sc, mn);
    const uint8_t* qs = p + 16;
    for (int j = 0; j < 4; ++j) {
      const F ds0 = V::set(d * sc[2 * j]), dm0 = V::set(dmin * mn[2 * j]);
      const F ds1 = V::set(d * sc[2 * j + 1]), dm1 = V::set(dmin * mn[2 * j + 1]);
      for (int c = 0; c < 32 / N; ++c) {
        const I b = V::u8(qs + 32 * j + c * N);
        w[(64 * j + c * N) / N] = V::fms(V::cvt(V::andi(b, 15)), ds0, dm0);
        w[(64 * j + 32 + c * N) / N] = V::fms(V::cvt(V::template srl<4>(b)), ds1, dm1);
      }
    }
  }
};

struct Q5_K {
  static constexpr int elems = 256, bytes = 176;
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    const float d = V::f16s(p), dmin = V::f16s(p + 2);
    uint8_t sc[8], mn[8];
    kquant_scale_min(p + 4, sc, mn);
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + 48;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const F ds0 = V::set(d * sc[2 * j]), dm0 = V::set(dmin * mn[2 * j]);
      const F ds1 = V::set(d * sc[2 * j + 1]), dm1 = V::set(dmin * mn[2 * j + 1]);
#pragma GCC unroll 4
      for (int c = 0; c < 32 / N; ++c) {
        const I b = V::u8(qs + 32 * j + c * N);
        const I h4 = V::template sll<4>(V::u8(qh + c * N));  // bit s of qh moves to bit s + 4
        const I lo = V::or_(V::andi(b, 15), V::andi(V::srlv(h4, 2 * j), 16));
        const I hi = V::or_(V::template srl<4>(b), V::andi(V::srlv(h4, 2 * j + 1), 16));
        a0 = V::fma(V::fms(V::cvt(lo), ds0, dm0), V::lx(x + 64 * j + c * N), a0);
        a1 = V::fma(V::fms(V::cvt(hi), ds1, dm1), V::lx(x + 64 * j + 32 + c * N), a1);
      }
    }
  }
  static inline void deq(const uint8_t* p, F* w) {
    const float d = V::f16s(p), dmin = V::f16s(p + 2);
    uint8_t sc[8], mn[8];
    kquant_scale_min(p + 4, sc, mn);
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + 48;
    for (int j = 0; j < 4; ++j) {
      const F ds0 = V::set(d * sc[2 * j]), dm0 = V::set(dmin * mn[2 * j]);
      const F ds1 = V::set(d * sc[2 * j + 1]), dm1 = V::set(dmin * mn[2 * j + 1]);
      for (int c = 0; c < 32 / N; ++c) {
        const I b = V::u8(qs + 32 * j + c * N);
        const I h4 = V::template sll<4>(V::u8(qh + c * N));
        const I lo = V::or_(V::andi(b, 15), V::andi(V::srlv(h4, 2 * j), 16));
        const I hi = V::or_(V::template srl<4>(b), V::andi(V::srlv(h4, 2 * j + 1), 16));
        w[(64 * j + c * N) / N] = V::fms(V::cvt(lo), ds0, dm0);
        w[(64 * j + 32 + c * N) / N] = V::fms(V::cvt(hi), ds1, dm1);
      }
    }
  }
};

struct Q6_K {
  static constexpr int elems = 256, bytes = 210;
  static inline void block(const uint8_t* p, const float* x, F& a0, F& a1) {
    const float d = V::f16s(p + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = p + 64 * h;
      const uint8_t* qh = p + 128 + 32 * h;
      const float* xh = x + 128 * h;
      const int8_t* s = sc + 8 * h;
#pragma GCC unroll 4
      for (int c = 0; c < 32 / N; ++c) {
        const int l = c * N, is = l / 16;
        const I la = V::u8(ql + l), lb = V::u8(ql + 32 + l), hh = V::u8(qh + l);
        const I q1 = V::or_(V::andi(la, 15), V::andi(V::template sll<4>(hh), 0x30));
        const I q2 = V::or_(V::andi(lb, 15), V::andi(V::template sll<2>(hh), 0x30));
        const I q3 = V::or_(V::template srl<4>(la), V::andi(hh, 0x30));
        const I q4 = V::or_(V::template srl<4>(lb), V::andi(V::template srl<2>(hh), 0x30));
        a0 = V::fma(V::mul(V::cvt(V::subi(q1, 32)), V::set(d * s[is])), V::lx(xh + l), a0);
        a1 = V::fma(V::mul(V::cvt(V::subi(q2, 32)), V::set(d * s[is + 2])), V::lx(xh + 32 + l), a1);
        a0 = V::fma(V::mul(V::cvt(V::subi(q3, 32)), V::set(d * s[is + 4])), V::lx(xh + 64 + l), a0);
        a1 = V::fma(V::mul(V::cvt(V::subi(q4, 32)), V::set(d * s[is + 6])), V::lx(xh + 96 + l), a1);
      }
    }
  }
  static inline void deq(const uint8_t* p, F* w) {
    const float d = V::f16s(p + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = p + 64 * h;
      const uint8_t* qh = p + 128 + 32 * h;
      const int8_t* s = sc + 8 * h;
      F* wh = w + 128 * h / N;
      for (int c = 0; c < 32 / N; ++c) {
        const int l = c * N, is = l / 16;
        const I la = V::u8(ql + l), lb = V::u8(ql + 32 + l), hh = V::u8(qh + l);
        const I q1 = V::or_(V::andi(la, 15), V::andi(V::template sll<4>(hh), 0x30));
        const I q2 = V::or_(V::andi(lb, 15), V::andi(V::template sll<2>(hh), 0x30));
        const I q3 = V::or_(V::template srl<4>(la), V::andi(hh, 0x30));
        const I q4 = V::or_(V::template srl<4>(lb), V::andi(V::template srl<2>(hh), 0x30));
        wh[l / N] = V::mul(V::cvt(V::subi(q1, 32)), V::set(d * s[is]));
        wh[(32 + l) / N] = V::mul(V::cvt(V::subi(q2, 32)), V::set(d * s[is + 2]));
        wh[(64 + l) / N] = V::mul(V::cvt(V::subi(q3, 32)), V::set(d * s[is + 4]));
        wh[(96 + l) / N] = V::mul(V::cvt(V::subi(q4, 32)), V::set(d * s[is + 6]));
      }
    }
  }
};

// Rows of a block type, one after the other (they are contiguous in a call, so one prefetch stream;
// a fixed number of requests per pair of blocks, StreamPrefetch::ahead_block).
template <class T>
void rows(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int prefetch) {
  const int nb = K / T::elems;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * T::bytes), prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
      if (prefetch) pf.ahead_block<2 * T::bytes>(w + b * T::bytes);
      T::block(w + b * T::bytes, x + b * T::elems, a0, a1);
      T::block(w + (b + 1) * T::bytes, x + (b + 1) * T::elems, a2, a3);
    }
    if (b < nb) T::block(w + b * T::bytes, x + b * T::elems, a0, a1);
    out[r] = V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
  }
}

// fp16 rows: N elements at a time, a scalar tail.
inline void rows_f16(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int prefetch) {
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(K) * 2), prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 4 * N <= K; k += 4 * N) {
      if (prefetch) pf.ahead_block<8 * N>(w + 2 * k);
      a0 = V::fma(V::f16x(w + 2 * k), V::lx(x + k), a0);
      a1 = V::fma(V::f16x(w + 2 * (k + N)), V::lx(x + k + N), a1);
      a2 = V::fma(V::f16x(w + 2 * (k + 2 * N)), V::lx(x + k + 2 * N), a2);
      a3 = V::fma(V::f16x(w + 2 * (k + 3 * N)), V::lx(x + k + 3 * N), a3);
    }
    for (; k + N <= K; k += N) a0 = V::fma(V::f16x(w + 2 * k), V::lx(x + k), a0);
    float s = V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
    for (; k < K; ++k) s += V::f16s(w + 2 * k) * x[k];
    out[r] = s;
  }
}

// NV >= 2 vectors: each block dequantized once into registers (32 elements at a time for the
// 32-element types, the whole super-block for K-quants) and multiplied into NV accumulators.
template <class T, int NV>
void rows_nv(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int K, float* out, int os,
             int prefetch) {
  constexpr int nw = T::elems / N;
  const int nb = K / T::elems;
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(nb) * T::bytes), prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    F acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = V::zero();
    for (int b = 0; b < nb; ++b) {
      if (prefetch) pf.ahead_block<T::bytes>(w + b * T::bytes);
      F wv[nw];
      T::deq(w + b * T::bytes, wv);
      for (int c = 0; c < nw; ++c) {
        for (int j = 0; j < NV; ++j) acc[j] = V::fma(wv[c], V::lx(xs[j] + b * T::elems + c * N), acc[j]);
      }
    }
    for (int j = 0; j < NV; ++j) out[j * os + r] = V::hsum(acc[j]);
  }
}

template <class T>
void multi(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int n, int K, float* out, int os,
           int prefetch) {
  dispatch_n(n, [&](auto nv) { rows_nv<T, decltype(nv)::value>(W, ld, nrows, xs, K, out, os, prefetch); });
}

// fp16 rows times n vectors.
inline void multi_f16(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int n, int K, float* out,
                      int os, int prefetch) {
  const StreamPrefetch<> pf(W, rows_stream_bytes(ld, nrows, static_cast<size_t>(K) * 2), prefetch);
  for (int r = 0; r < nrows; ++r) {
    const uint8_t* w = W + r * ld;
    F acc[8];
    for (int j = 0; j < n; ++j) acc[j] = V::zero();
    int k = 0;
    for (; k + N <= K; k += N) {
      if (prefetch && k % (4 * N) == 0) pf.ahead_block<8 * N>(w + 2 * k);  // a fixed period of 4
      const F wv = V::f16x(w + 2 * k);
      for (int j = 0; j < n; ++j) acc[j] = V::fma(wv, V::lx(xs[j] + k), acc[j]);
    }
    for (int j = 0; j < n; ++j) {
      float s = V::hsum(acc[j]);
      for (int kk = k; kk < K; ++kk) s += V::f16s(w + 2 * kk) * xs[j][kk];
      out[j * os + r] = s;
    }
  }
}
