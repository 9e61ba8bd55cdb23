// How fast one core streams real rows through a real row kernel, next to a plain read of the same
// bytes, and what a bank that starts off a cache line costs. The kernel is mxfp4's one-vector row
// kernel of the avx512_bf16 tier (fp4::q8_dot_rows_multi: e2m1 nibbles and e8m0 scales per 32, x as
// int8 steps of 128). A developer tool (not part of the package): it answers "how close to the read
// bandwidth does one core's decode run, from DRAM, L2 and L1, at each bank offset", without the
// executor around it.
//
//   cd packages/ft-kernels-cpu
//   g++ -O2 -std=c++17 -I csrc -o /tmp/row_stream_probe tools/row_stream_probe.cpp
//       csrc/kernels/fp4_kernels.cpp csrc/kernels/int8_codes.cpp csrc/cpu_features.cpp  (one line)
//   /tmp/row_stream_probe [MiB of rows, default 1024] [K, default 2048] [rows per call, default 256]
//                         [order: seq (default) or shuffled]
//
// The rows lie back to back (K / 2 bytes each, their scales in an array of their own) and are read in
// calls of `rows per call`, as the executor's units read an expert's rows, with the kernels' own
// software prefetch (8 KiB ahead, fp4_kernels.cpp): in address order (`seq`), or with the calls in a
// fixed random order (`shuffled`), as a step's units jump from expert to expert. For each bank offset (0, 16, 32, 48 bytes past a
// cache line; numpy's large arrays start at 16) one line: GB/s of weight and scale bytes from DRAM
// (median of 5 passes over the whole buffer), the plain read of the same bytes (median of 5, 64-byte
// loads), their ratio, GB/s from L2 (the first 256 KiB of rows, again and again) and from L1 (the
// first 24 KiB in one call without software prefetch, the best of 200 timings of 20 calls). Every row's
// result is checked against a float64 dot product of the decoded weights and x, within the int8
// rounding of x (half a step of each 128 elements' amax / 127, times the weights' magnitudes) plus
// fp32 slack; the exit status is 1 if any is off ("MISMATCH") or differs between offsets.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "common.h"
#include "kernels/fp4_common.h"
#include "probe_util.h"

namespace {

using probe::Clock;
using probe::median;
using probe::plain_read;
using probe::seconds_since;

constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e2m1(unsigned nibble) { return (nibble & 8 ? -1.0 : 1.0) * kE2m1[nibble & 7]; }

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 1024;
  const int K = argc > 2 ? std::atoi(argv[2]) : 2048;
  const int per_call = argc > 3 ? std::atoi(argv[3]) : 256;
  const std::string order = argc > 4 ? argv[4] : "seq";
  if (mib < 1 || K < 128 || K % 128 != 0 || per_call < 1 || (order != "seq" && order != "shuffled")) {
    std::fprintf(stderr,
                 "usage: row_stream_probe [MiB >= 1] [K, a multiple of 128] [rows per call >= 1] [seq|shuffled]\n");
    return 2;
  }
  if (ft::cpu_best_isa() < ft::Isa::avx512_bf16) {
    std::fprintf(stderr, "row_stream_probe: this CPU has no avx512_bf16 tier (the kernel's)\n");
    return 2;
  }
  const size_t row_bytes = K / 2, srow = K / 32;
  const size_t rows = std::max<size_t>(per_call, (static_cast<size_t>(mib) << 20) / row_bytes);
  const size_t wbytes = rows * row_bytes, sbytes = rows * srow;
  // One buffer each, a page ahead of room, so that the data can sit at any offset past a cache line.
  // In 2 MiB units, asking for transparent huge pages as numpy does for the executor's banks (large
  // arrays): on 4 KiB pages one Zen 5 core's kernel read 28-30 GB/s of rows of K = 2048 from DRAM, on
  // huge pages 31.6-33.5, the plain read 39-43 either way (docs/benchmarks.md, twenty-fifth session).
  uint8_t* wbuf = probe::huge_alloc(wbytes + 4096, "row_stream_probe");
  uint8_t* sbuf = probe::huge_alloc(sbytes + 4096, "row_stream_probe");
  std::mt19937_64 rng(1);
  probe::fill_rows(rng, wbuf, wbytes, sbuf, sbytes);
  std::vector<float> x;
  std::vector<uint8_t> rec;
  const void* xs[1] = {probe::make_x(rng, K, x, rec)};

  // The float64 reference of the first rows (up to 512), with the int8 rounding bound of x.
  const size_t checked = std::min<size_t>(rows, 512);
  std::vector<double> ref(checked), bound(checked);
  std::vector<double> half_step(K / 128);
  for (int st = 0; st < K / 128; ++st) {
    double amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[128 * st + i])));
    half_step[st] = amax / 127 / 2;
  }
  for (size_t r = 0; r < checked; ++r) {
    double sum = 0, err = 0, mag = 0;
    for (int i = 0; i < K; ++i) {
      const uint8_t byte = wbuf[r * row_bytes + i / 2];
      const double w = e2m1(i % 2 ? byte >> 4 : byte & 15) * std::ldexp(1.0, sbuf[r * srow + i / 32] - 127);
      sum += w * x[i];
      err += std::fabs(w) * half_step[i / 128];
      mag += std::fabs(w * x[i]);
    }
    ref[r] = sum;
    bound[r] = err + 0x1p-18 * mag + 1e-30;
  }

  std::vector<float> out(rows), first(checked);
  bool bad = false;
  const int offsets[] = {0, 16, 32, 48};
  size_t at = 0;  // where the data lies now: wbuf + at, sbuf + at
  // The first row of every call over the whole buffer, in the order the calls run.
  std::vector<size_t> starts;
  for (size_t r = 0; r < rows; r += per_call) starts.push_back(r);
  if (order == "shuffled") std::shuffle(starts.begin(), starts.end(), rng);
  std::printf("row_stream_probe: %.0f MiB of rows of K = %d (%zu bytes + %zu of scales), calls of %d rows (%s)\n",
              (wbytes + sbytes) / 1048576.0, K, row_bytes, srow, per_call, order.c_str());
  for (int off : offsets) {
    // The same bytes at `off` past a cache line (weights and scales alike).
    uint8_t* W = wbuf + 64 + off;
    uint8_t* S = sbuf + 64 + off;
    std::memmove(W, wbuf + at, wbytes);
    std::memmove(S, sbuf + at, sbytes);
    at = 64 + off;
    auto call = [&](size_t r, size_t nrows) {
      const int n = static_cast<int>(std::min<size_t>(per_call, nrows - r));
      ft::fp4::q8_dot_rows_multi(W + r * row_bytes, S + r * srow, n, xs, 1, K, out.data() + r, 0, 8192);
    };
    // The first nrows rows in address order (L2 rounds, the checked rows); all of them in `starts` order.
    auto run = [&](size_t nrows) {
      for (size_t r = 0; r < nrows; r += per_call) call(r, nrows);
    };
    auto run_all = [&] {
      for (size_t r : starts) call(r, rows);
    };
    std::vector<double> kern, plain, l2;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 5; ++pass) {
      auto t0 = Clock::now();
      sink = sink ^ plain_read(W, wbytes) ^ plain_read(S, sbytes);
      plain.push_back((wbytes + sbytes) / seconds_since(t0) / 1e9);
      t0 = Clock::now();
      run_all();
      kern.push_back((wbytes + sbytes) / seconds_since(t0) / 1e9);
    }
    const size_t l2_rows = std::min<size_t>(rows, (256 << 10) / row_bytes);
    for (int pass = 0; pass < 5; ++pass) {
      const auto t0 = Clock::now();
      for (int rep = 0; rep < 64; ++rep) run(l2_rows);
      l2.push_back(64.0 * l2_rows * (row_bytes + srow) / seconds_since(t0) / 1e9);
    }
    // From L1: the first 24 KiB of rows (at least one) in one call without software prefetch, 20 calls
    // a timing, the best of 200: the kernel's own pace with its operands in L1.
    const size_t l1_rows = std::max<size_t>(1, std::min<size_t>(rows, (24 << 10) / row_bytes));
    double l1_best = 0;
    for (int rep = 0; rep < 200; ++rep) {
      const auto t0 = Clock::now();
      for (int c = 0; c < 20; ++c) {
        ft::fp4::q8_dot_rows_multi(W, S, static_cast<int>(l1_rows), xs, 1, K, out.data(), 0, 0);
      }
      l1_best = std::max(l1_best, 20.0 * l1_rows * (row_bytes + srow) / seconds_since(t0) / 1e9);
    }
    run(checked);
    for (size_t r = 0; r < checked; ++r) {
      if (!(std::fabs(out[r] - ref[r]) <= bound[r])) {
        std::printf("MISMATCH offset %d row %zu: %.9g against %.9g (bound %.3g)\n", off, r, out[r], ref[r], bound[r]);
        bad = true;
        break;
      }
      if (off != 0 && std::memcmp(&out[r], &first[r], sizeof(float)) != 0) {
        std::printf("MISMATCH offset %d row %zu: %.9g, at offset 0 %.9g\n", off, r, out[r], first[r]);
        bad = true;
        break;
      }
    }
    if (off == 0) std::copy(out.begin(), out.begin() + checked, first.begin());
    const double k = median(kern), p = median(plain);
    std::printf("offset %2d: kernel %6.1f GB/s  plain read %6.1f GB/s  ratio %.3f  from L2 %6.1f GB/s  "
                "from L1 %6.1f GB/s\n",
                off, k, p, k / p, median(l2), l1_best);
    std::fflush(stdout);
  }
  std::free(wbuf);
  std::free(sbuf);
  return bad ? 1 : 0;
}
