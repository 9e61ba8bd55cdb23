// What one 64-byte step of mxfp4's int8 one-vector row kernel costs a core, and what each of its
// parts costs. Rows of K = 2048 (4 groups of 16 blocks: qwen3-30b-a3b's gate and up rows) from L1:
// the package's kernel (fp4::q8_dot_rows_one_vector, `fastest`: dot_rows_q8_groups), then a copy of
// its arithmetic written out here (VPSRLW, two VPERMB lookups of 12 + 2 * e2m1, two VPDPBUSD from
// the step's offset lanes, VCVTDQ2PS, a VPERMPS of the group's scales, an FMA into one of two
// accumulators; per group the 16 e8m0 scales by VPMOVZXBD and a shift, times x's dx lanes; per row a
// horizontal sum), then that copy with parts left out. A developer tool (not part of the package): it
// answers "how much faster could this layout's decode get on this core", which the 0.80 target asks
// of the 2-core dev box's fast mode (docs/benchmarks.md, thirty-seventh session).
//
//   cd packages/ft-kernels-cpu
//   g++ -O2 -std=c++17 -I csrc -o /tmp/q8_step_probe tools/q8_step_probe.cpp
//       csrc/kernels/fp4_kernels.cpp csrc/kernels/int8_codes.cpp csrc/cpu_features.cpp  (one line)
//   taskset -c 1 /tmp/q8_step_probe [timings, default 200]
//
// Output, one line each:
//   clock C                      core cycles per TSC tick: the fastest of 200 windows of 100k dependent
//                                adds (one a cycle)
//   check: max error E (bound B) the package kernel's rows against a float64 dot product of the decoded
//                                weights and x's int8 record (codes times dx), and the copy's `full`
//                                rows against the package's, bit for bit; exit status 1 if either fails
//   step VARIANT: X cycles (T TSC ticks)
//                                per step, the best of the timings of 20 calls over 20 rows (16 steps
//                                each). The ticks are what was timed; a vCPU that shares its core or its
//                                time reads a lower clock, which scales every cycle figure alike.
//     kernel                     the package's kernel
//     full                       the copy
//     no_row_sums                the rows' accumulators added up as vectors, no horizontal sum a row
//     no_group_scales            x's dx lanes as each group's scales (no e8m0 conversion)
//     no_scale_permute           the group's scales unpermuted (lanes of the wrong blocks)
//     none_of_the_3              neither row sums nor group scales nor their permute: per step the
//                                lookups, the products, one conversion and one FMA
//     products_only              the lookups and VPDPBUSDs into int32 chains, nothing after them
// Only `kernel` and `full` compute the right numbers; the others time what is left.
// Exit status 2 on a CPU without the avx512_bf16 tier (the kernel's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common.h"
#include "kernels/fp4_common.h"
#include "probe_util.h"

#if FT_X86
#include <x86intrin.h>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the merge source of their unmasked forms,
// which -W(maybe-)uninitialized reports where they inline; the tests build this file with -Werror.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

using ft::fp4::kQ8GroupBytes;
using ft::fp4::kQ8StepBytes;
using ft::fp4::q8_step_offset;

constexpr int kK = 2048, kGroups = kK / 512, kSteps = kK / 128, kRows = 20;
constexpr int kRowBytes = kK / 2, kScaleBytes = kK / 32;
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e2m1(unsigned n) { return (n & 8 ? -1.0 : 1.0) * kE2m1[n & 7]; }

enum Variant { kFull, kNoRowSums, kNoGroupScales, kNoScalePermute, kNoneOfThe3, kProductsOnly };

// The copy: kRows rows of W (kRowBytes each) and S (kScaleBytes each) against x's q8 record (kQ8 step
// records and dx lanes, fp4_common.h). out[r]: row r's result where V computes one; returns a sum of
// what V computed, so that nothing is dropped.
template <Variant V>
FT_TARGET_AVX512_BF16 __attribute__((noinline)) float rows(const uint8_t* W, const uint8_t* S, const uint8_t* x,
                                                             float* out) {
  // 12 + 2 * e2m1 for the 16 codes, every 16 bytes (VPERMB reads 6 index bits; the upper 2 are the
  // other nibble's and select a copy).
  alignas(64) uint8_t table[64];
  for (int i = 0; i < 64; ++i) table[i] = static_cast<uint8_t>(12 + 2 * e2m1(i & 15));
  const __m512i lut = _mm512_load_si512(table);
  const __m512i quarter = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
  const __m512i idx[4] = {quarter, _mm512_add_epi32(quarter, _mm512_set1_epi32(4)),
                          _mm512_add_epi32(quarter, _mm512_set1_epi32(8)),
                          _mm512_add_epi32(quarter, _mm512_set1_epi32(12))};
  __m512 total = _mm512_setzero_ps();
  __m512i itotal = _mm512_setzero_si512();
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* w = W + r * kRowBytes;
    const uint8_t* s = S + r * kScaleBytes;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), sx = _mm512_setzero_ps();
    __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int t = 0; t < kSteps; ++t) {
      const int u = t % 4;
      const uint8_t* rec = x + q8_step_offset(t);
      if (u == 0 && V != kProductsOnly) {
        const __m512 dx = _mm512_loadu_ps(x + t / 4 * kQ8GroupBytes + 4 * kQ8StepBytes);
        if (V == kNoGroupScales || V == kNoneOfThe3) {
          sx = dx;
        } else {
          const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 4 * t)));
          sx = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(e, 23)), dx);
        }
      }
      const __m512i wv = _mm512_loadu_si512(w + 64 * t);
      const __m512i lo = _mm512_permutexvar_epi8(wv, lut);
      const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(wv, 4), lut);
      const __m512i xl = _mm512_loadu_si512(rec), xh = _mm512_loadu_si512(rec + 64);
      if (V == kProductsOnly) {
        __m512i& acc = u % 2 ? i1 : i0;
        acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, lo, xl), hi, xh);
        continue;
      }
      const __m512i d =
          _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_loadu_si512(rec + 128), lo, xl), hi, xh);
      const __m512 scale = V == kNoScalePermute || V == kNoneOfThe3 ? sx : _mm512_permutexvar_ps(idx[u], sx);
      __m512& acc = u % 2 ? a1 : a0;
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc);
    }
    if (V == kProductsOnly) {
      itotal = _mm512_add_epi32(itotal, _mm512_add_epi32(i0, i1));
    } else if (V == kNoRowSums || V == kNoneOfThe3) {
      total = _mm512_add_ps(total, _mm512_add_ps(a0, a1));
    } else {
      out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
  }
  if (V == kProductsOnly) return static_cast<float>(_mm512_reduce_add_epi32(itotal));
  if (V == kNoRowSums || V == kNoneOfThe3) return _mm512_reduce_add_ps(total);
  float sum = 0.f;
  for (int r = 0; r < kRows; ++r) sum += out[r];
  return sum;
}

float package_rows(const uint8_t* W, const uint8_t* S, const uint8_t* x, float* out) {
  ft::fp4::q8_dot_rows_one_vector(W, S, kRows, x, kK, out, 0, ft::fp4::Q8Rows::fastest);
  return out[0];
}

// Core cycles per TSC tick: the fastest of 200 windows of 100k dependent adds (one a cycle).
double clock_per_tick() {
  double best = 1e30;
  uint64_t v = 1;
  for (int i = 0; i < 200; ++i) {
    const uint64_t t0 = __rdtsc();
    for (int j = 0; j < 100000; ++j) asm volatile("add $1, %0" : "+r"(v));
    best = std::min(best, static_cast<double>(__rdtsc() - t0));
  }
  return 100000.0 / best;
}

// TSC ticks per step of fn over the rows: the best of `timings` timings of 20 calls.
template <class Fn>
double ticks_per_step(Fn fn, const uint8_t* W, const uint8_t* S, const uint8_t* x, float* out, int timings) {
  double best = 1e30;
  volatile float sink = 0.f;
  for (int i = 0; i < timings; ++i) {
    const uint64_t t0 = __rdtsc();
    for (int k = 0; k < 20; ++k) sink = sink + fn(W, S, x, out);
    best = std::min(best, static_cast<double>(__rdtsc() - t0));
  }
  return best / (20.0 * kRows * kSteps);
}

void report(const char* name, double ticks, double clock) {
  std::printf("step %s: %.2f cycles (%.2f TSC ticks)\n", name, ticks * clock, ticks);
}

}  // namespace

int main(int argc, char** argv) {
  const int timings = argc > 1 ? std::atoi(argv[1]) : 200;
  if (timings < 1) {
    std::fprintf(stderr, "q8_step_probe: timings must be a positive integer, got '%s'\n", argv[1]);
    return 2;
  }
  if (ft::cpu_best_isa() < ft::Isa::avx512_bf16) {
    std::fprintf(stderr, "q8_step_probe: this CPU has no avx512_bf16 tier (the kernel's)\n");
    return 2;
  }
  // Every buffer at a cache line, as the executor's banks and x's records are (a 64-byte load that
  // crosses a line costs Zen 4 ~1.6 of one that does not).
  uint8_t* W = probe::huge_alloc(kRows * kRowBytes, "q8_step_probe");
  uint8_t* S = probe::huge_alloc(kRows * kScaleBytes, "q8_step_probe");
  std::mt19937_64 rng(1);
  probe::fill_rows(rng, W, kRows * kRowBytes, S, kRows * kScaleBytes);
  std::vector<float> xf;
  std::vector<uint8_t> rec;
  const auto* x = static_cast<const uint8_t*>(probe::make_x(rng, kK, xf, rec));

  // The package kernel against float64 on the record's own values (code * dx: exact in float64), and
  // the copy against the package kernel bit for bit.
  std::vector<float> out(kRows), copy(kRows);
  package_rows(W, S, x, out.data());
  rows<kFull>(W, S, x, copy.data());
  double worst = 0.0, bound = 0.0;
  bool same = true;
  for (int r = 0; r < kRows; ++r) {
    double ref = 0.0, mag = 0.0;
    for (int i = 0; i < kK; ++i) {
      const int t = i / 128, j = i % 128;
      const uint8_t* step = x + q8_step_offset(t);
      const auto code = static_cast<int8_t>(step[j % 2 ? 64 + j / 2 : j / 2]);
      float half_dx;  // the record keeps dx / 2 in lane 4 (t % 4) of its group's lanes
      std::memcpy(&half_dx, x + t / 4 * kQ8GroupBytes + 4 * kQ8StepBytes + 16 * (t % 4), sizeof half_dx);
      const uint8_t byte = W[r * kRowBytes + i / 2];
      const double p = e2m1(i % 2 ? byte >> 4 : byte & 15) * std::ldexp(1.0, S[r * kScaleBytes + i / 32] - 127) *
                       code * 2.0 * half_dx;
      ref += p;
      mag += std::fabs(p);
    }
    worst = std::max(worst, std::fabs(out[r] - ref));
    bound = std::max(bound, 0x1p-18 * mag);  // fp32 sums of int32-exact block partials
    same = same && std::memcmp(&out[r], &copy[r], sizeof(float)) == 0;
  }
  const double clock = clock_per_tick();
  std::printf("clock %.3f\n", clock);
  std::printf("check: max error %.3g (bound %.3g), copy %s\n", worst, bound, same ? "bit-identical" : "DIFFERS");
  if (!(worst <= bound) || !same) {
    std::printf("MISMATCH\n");
    return 1;
  }
  float* o = copy.data();
  report("kernel", ticks_per_step(package_rows, W, S, x, out.data(), timings), clock);
  report("full", ticks_per_step(rows<kFull>, W, S, x, o, timings), clock);
  report("no_row_sums", ticks_per_step(rows<kNoRowSums>, W, S, x, o, timings), clock);
  report("no_group_scales", ticks_per_step(rows<kNoGroupScales>, W, S, x, o, timings), clock);
  report("no_scale_permute", ticks_per_step(rows<kNoScalePermute>, W, S, x, o, timings), clock);
  report("none_of_the_3", ticks_per_step(rows<kNoneOfThe3>, W, S, x, o, timings), clock);
  report("products_only", ticks_per_step(rows<kProductsOnly>, W, S, x, o, timings), clock);
  std::free(W);
  std::free(S);
  return 0;
}

#else
int main() {
  std::fprintf(stderr, "q8_step_probe: not x86-64 (the kernel is AVX-512)\n");
  return 2;
}
#endif
