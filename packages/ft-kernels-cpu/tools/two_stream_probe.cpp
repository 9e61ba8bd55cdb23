// How fast one core streams rows through a real row kernel when it reads them as several streams in
// turns, next to a plain read of the same bytes. The kernel is mxfp4's one-vector row kernel of the
// avx512_bf16 tier (fp4::q8_dot_rows_multi), as in row_stream_probe.cpp. A developer tool (not part of
// the package): it answers "does a core read two far-apart streams of rows, in short turns, faster
// than one, and what does the kernels' software prefetch do to that", the question behind
// FT_CPU_MOE_GATE_UP_SLICE and the Zen 5 prefetch default (docs/benchmarks.md, twenty-seventh session).
//
//   cd packages/ft-kernels-cpu
//   g++ -O2 -std=c++17 -I csrc -o /tmp/two_stream_probe tools/two_stream_probe.cpp
//       csrc/kernels/fp4_kernels.cpp csrc/kernels/int8_codes.cpp csrc/cpu_features.cpp  (one line)
//   /tmp/two_stream_probe [streams 1-4, default 2] [rows per turn, default 2] [prefetch bytes, default 0]
//                         [MiB of rows, default 1024] [K, default 2048]
//
// The rows lie back to back (K / 2 bytes each, their scales in an array of their own, both on huge
// pages where the kernel grants them). The buffer is cut into `streams` equal parts, which lie
// hundreds of MiB apart; the kernel reads row i of part 0 (a turn of `rows per turn` rows), then of
// part 1, ..., then the next turn of part 0, and so on, each turn one kernel call with the given
// software prefetch distance. Five passes over the buffer, each next to a plain read of the same bytes
// (64-byte loads): medians of GB/s and of their ratio. Every row's result must equal, bit for bit,
// that of one stream in address order without prefetch (the order of rows never changes a row's
// sum); the exit status is 1 if one differs ("MISMATCH").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
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

}  // namespace

int main(int argc, char** argv) {
  const int streams = argc > 1 ? std::atoi(argv[1]) : 2;
  const int turn = argc > 2 ? std::atoi(argv[2]) : 2;
  const int prefetch = argc > 3 ? std::atoi(argv[3]) : 0;
  const long mib = argc > 4 ? std::atol(argv[4]) : 1024;
  const int K = argc > 5 ? std::atoi(argv[5]) : 2048;
  if (streams < 1 || streams > 4 || turn < 1 || prefetch < 0 || prefetch % 64 != 0 || mib < 1 || K < 128 ||
      K % 128 != 0) {
    std::fprintf(stderr,
                 "usage: two_stream_probe [streams 1-4] [rows per turn >= 1] [prefetch bytes, a multiple of 64] "
                 "[MiB >= 1] [K, a multiple of 128]\n");
    return 2;
  }
  if (ft::cpu_best_isa() < ft::Isa::avx512_bf16) {
    std::fprintf(stderr, "two_stream_probe: this CPU has no avx512_bf16 tier (the kernel's)\n");
    return 2;
  }
  const size_t row_bytes = K / 2, srow = K / 32;
  // Whole turns in every part.
  const size_t per = std::max<size_t>(turn, (static_cast<size_t>(mib) << 20) / row_bytes / streams / turn * turn);
  const size_t rows = per * streams, wbytes = rows * row_bytes, sbytes = rows * srow;
  uint8_t* W = probe::huge_alloc(wbytes, "two_stream_probe");
  uint8_t* S = probe::huge_alloc(sbytes, "two_stream_probe");
  std::mt19937_64 rng(1);
  probe::fill_rows(rng, W, wbytes, S, sbytes);
  std::vector<float> x;
  std::vector<uint8_t> rec;
  const void* xs[1] = {probe::make_x(rng, K, x, rec)};

  // The reference: one stream in address order, no prefetch.
  std::vector<float> want(rows), out(rows);
  ft::fp4::q8_dot_rows_multi(W, S, static_cast<int>(rows), xs, 1, K, want.data(), 0, 0);

  auto pass = [&] {
    for (size_t r = 0; r < per; r += turn) {
      for (int s = 0; s < streams; ++s) {
        const size_t row = s * per + r;
        ft::fp4::q8_dot_rows_multi(W + row * row_bytes, S + row * srow, turn, xs, 1, K, out.data() + row, 0,
                                   prefetch);
      }
    }
  };
  std::vector<double> kern, plain, ratio;
  volatile uint64_t sink = 0;
  for (int p = 0; p < 5; ++p) {
    auto t0 = Clock::now();
    sink = sink ^ plain_read(W, wbytes) ^ plain_read(S, sbytes);
    const double pr = (wbytes + sbytes) / seconds_since(t0) / 1e9;
    t0 = Clock::now();
    pass();
    const double k = (wbytes + sbytes) / seconds_since(t0) / 1e9;
    kern.push_back(k);
    plain.push_back(pr);
    ratio.push_back(k / pr);
  }
  if (std::memcmp(out.data(), want.data(), rows * sizeof(float)) != 0) {
    for (size_t r = 0; r < rows; ++r) {
      if (std::memcmp(&out[r], &want[r], sizeof(float)) != 0) {
        std::printf("MISMATCH row %zu: %.9g against %.9g in address order\n", r, out[r], want[r]);
        break;
      }
    }
    return 1;
  }
  std::printf("two_stream_probe: %.0f MiB of rows of K = %d (%zu + %zu bytes), %d stream(s) %.0f MiB apart, turns "
              "of %d rows (%zu bytes), prefetch %d: kernel %.1f GB/s, plain read %.1f GB/s, ratio %.3f\n",
              (wbytes + sbytes) / 1048576.0, K, row_bytes, srow, streams, per * row_bytes / 1048576.0, turn,
              turn * row_bytes, prefetch, median(kern), median(plain), median(ratio));
  return 0;
}
