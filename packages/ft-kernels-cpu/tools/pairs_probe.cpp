// Time of the avx2 tier's int8 row kernels (csrc/kernels/avx2_pairs.h) per row and pair of blocks,
// by vector count and by path: rows_chains (one FMA chain per vector) and rows_by4 (four vectors'
// VPMADDUBSW sums reduced across lanes in int16, then one conversion, scale and FMA per four), on one
// core. A developer tool (not part of the package): it answers "what does a call of 8 vectors cost
// against one of 1, and which path is faster on this core", without the executor around it, whose
// step times on a shared 2-core VM drift by 20% between runs.
//
//   cd packages/ft-kernels-cpu
//   g++ -O2 -std=c++17 -mavx2 -mfma -mf16c -I csrc -o /tmp/pairs_probe tools/pairs_probe.cpp csrc/kernels/int8_codes.cpp
//   /tmp/pairs_probe [K, default 2048] [rows per call, default 64] [calls, default 16]
//
// The weights are Q4_0-like codes (16 nibble bytes a block of 32, offset 8, rows of K / 2 bytes, the
// calls' rows one after another: 1 MiB by default, so they come from L2 / L3 as in a decode step),
// one fp32 scale a block; x is random, in pairs::quantize's records (kHalves, as gguf's Q4_0 takes
// them). Every result is checked against a float64 dot product of the same codes, steps and scales.
// Per line: ns per (row, pair) as the minimum over 15 timings, and that time over one vector's; the
// exit status is 1 if any result was off the reference ("MISMATCH").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/avx2_pairs.h"

namespace {

using ft::pairs::kPairBytes;

// avx2_pairs.h's block policy for the probe's rows (no prefetch: the rows come from cache).
struct Codes4 {
  static constexpr int kOffset = 8;
  static constexpr bool kScalePerBlock = true;
  const uint8_t* W;    // row r at W + r * nb * 16
  const float* S;      // block scales, row r at S + r * nb
  int nb;
  const uint8_t* row(int r) const { return W + static_cast<size_t>(r) * nb * 16; }
  FT_TARGET_AVX2 void pair(int r, int p, __m256i& L, __m256i& H) const {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row(r) + 32 * p));
    const __m256i m = _mm256_set1_epi8(15);
    L = _mm256_and_si256(v, m);
    H = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
  }
  FT_TARGET_AVX2 void half(int r, int p, __m256i& L, __m256i& H) const {
    const __m256i v = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row(r) + 32 * p)));
    const __m256i m = _mm256_set1_epi8(15);
    L = _mm256_and_si256(v, m);
    H = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
  }
  FT_TARGET_AVX2 static __m256 two(float a, float b) { return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a)); }
  FT_TARGET_AVX2 void scales4(int r, int g, __m256& s0, __m256& s1) const {
    const float* s = S + static_cast<size_t>(r) * nb + 4 * g;
    s0 = two(s[0], s[1]);
    s1 = two(s[2], s[3]);
  }
  FT_TARGET_AVX2 __m256 scales2(int r, int p, bool half) const {
    const float* s = S + static_cast<size_t>(r) * nb + 2 * p;
    return two(s[0], half ? 0.f : s[1]);
  }
  void ahead(int, int) const {}
};

// row r . x_j in float64 from the codes, x's record (codes XL / XH, steps DX) and the scales.
double reference(const Codes4& w, int r, const uint8_t* rec) {
  double sum = 0.0;
  for (int b = 0; b < w.nb; ++b) {
    const uint8_t* x = rec + static_cast<size_t>(b / 2) * kPairBytes;
    const int h = b % 2;
    float dx;
    std::memcpy(&dx, x + 96 + 16 * h, sizeof dx);
    long dot = 0;
    for (int k = 0; k < 16; ++k) {
      const uint8_t q = w.row(r)[16 * b + k];
      dot += static_cast<long>((q & 15) - 8) * static_cast<int8_t>(x[16 * h + k]);
      dot += static_cast<long>((q >> 4) - 8) * static_cast<int8_t>(x[32 + 16 * h + k]);
    }
    sum += static_cast<double>(dot) * dx * w.S[static_cast<size_t>(r) * w.nb + b];
  }
  return sum;
}

template <int NV, bool By4>
void call(const Codes4& w, const uint8_t* const* xs, int nrows, float* out, int os) {
  if constexpr (By4) {
    ft::pairs::rows_by4<NV>(w, xs, nrows, w.nb, out, os);
  } else {
    ft::pairs::rows_chains<NV>(w, xs, nrows, w.nb, out, os);
  }
}

// fp32 sums of exact int32 block sums stay within ~1e-7 of float64; a wrong lane, step or offset is
// off by far more.
constexpr double kMaxError = 1e-5;

struct Setup {
  int K, rows, calls, nb;
  std::vector<uint8_t> W;
  std::vector<float> S;
  std::vector<uint8_t> X;  // 8 records at a stride of ft::vec_stride
  size_t stride;
};

// ns per (row, pair); *max_err: the largest |out - reference()| over all rows and vectors, relative
// to the largest |reference()| (fp32 accumulation of exact int32 block sums: ~1e-7).
template <int NV, bool By4>
double run(const Setup& s, double* max_err) {
  const uint8_t* xs[NV];
  for (int j = 0; j < NV; ++j) xs[j] = s.X.data() + j * s.stride;
  const int total = s.rows * s.calls;
  std::vector<float> out(static_cast<size_t>(NV) * total);
  auto pass = [&]() {
    for (int c = 0; c < s.calls; ++c) {
      const Codes4 w{s.W.data() + static_cast<size_t>(c) * s.rows * s.nb * 16, s.S.data() + static_cast<size_t>(c) * s.rows * s.nb, s.nb};
      call<NV, By4>(w, xs, s.rows, out.data() + static_cast<size_t>(c) * s.rows, total);
    }
  };
  pass();
  double scale = 0.0, err = 0.0;
  const Codes4 all{s.W.data(), s.S.data(), s.nb};
  for (int r = 0; r < total; ++r) {
    for (int j = 0; j < NV; ++j) {
      const double ref = reference(all, r, xs[j]);
      scale = std::max(scale, std::fabs(ref));
      err = std::max(err, std::fabs(out[static_cast<size_t>(j) * total + r] - ref));
    }
  }
  *max_err = scale > 0 ? err / scale : err;
  double best = 1e300;
  for (int t = 0; t < 15; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  return best / (static_cast<double>(total) * ((s.nb + 1) / 2));
}

// One line of the table; false if a result was off the reference.
template <int NV>
bool line(const Setup& s, double one) {
  double e1 = 0, e2 = 0;
  const double chains = run<NV, false>(s, &e1);
  std::printf("%3d vectors  chains %6.2f ns (%4.2fx of 1)", NV, chains, chains / one);
  if constexpr (NV % 4 == 0) {
    const double by4 = run<NV, true>(s, &e2);
    std::printf("   by4 %6.2f ns (%4.2fx of 1, %4.2f of chains)", by4, by4 / one, by4 / chains);
  }
  const bool ok = std::max(e1, e2) <= kMaxError;
  std::printf("   max error %.1e%s\n", std::max(e1, e2), ok ? "" : "  MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  s.K = argc > 1 ? std::atoi(argv[1]) : 2048;
  s.rows = argc > 2 ? std::atoi(argv[2]) : 64;
  s.calls = argc > 3 ? std::atoi(argv[3]) : 16;
  if (s.K < 32 || s.K % 32 != 0 || s.rows < 1 || s.calls < 1) {
    std::fprintf(stderr, "usage: %s [K: a multiple of 32] [rows per call >= 1] [calls >= 1]\n", argv[0]);
    return 2;
  }
  s.nb = s.K / 32;
  std::mt19937 rng(7);
  const size_t total = static_cast<size_t>(s.rows) * s.calls;
  s.W.resize(total * s.nb * 16 + 32);
  for (auto& b : s.W) b = static_cast<uint8_t>(rng());
  s.S.resize(total * s.nb);
  std::uniform_real_distribution<float> us(0.25f, 2.f);
  for (auto& v : s.S) v = us(rng);
  s.stride = ft::vec_stride(ft::pairs::record_bytes(s.K));
  s.X.assign(8 * s.stride, 0);
  std::normal_distribution<float> nx(0.f, 1.f);
  std::vector<float> x(s.K);
  for (int j = 0; j < 8; ++j) {
    for (auto& v : x) v = nx(rng);
    ft::pairs::quantize(x.data(), 0, s.K, ft::pairs::PairOrder::kHalves, 8, 32, s.X.data() + j * s.stride);
  }
  std::printf("K = %d, %d rows a call, %d calls (%.2f MiB of weights): ns per row and pair of blocks\n", s.K, s.rows,
              s.calls, s.W.size() / 1048576.0);
  double e = 0;
  const double one = run<1, false>(s, &e);
  std::printf("  1 vector   chains %6.2f ns                  max error %.1e%s\n", one, e, e <= kMaxError ? "" : "  MISMATCH");
  bool ok = e <= kMaxError;
  ok &= line<2>(s, one);
  ok &= line<3>(s, one);
  ok &= line<4>(s, one);
  ok &= line<8>(s, one);
  return ok ? 0 : 1;
}
