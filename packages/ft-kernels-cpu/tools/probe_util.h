// What the developer probes in this folder share (not part of the package): a clock, medians, and a
// plain read of a buffer to set a kernel's stream against.
#pragma once

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

namespace probe {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// 64-byte loads summed in 4 chains (a line per load, whatever the offset), so that none is dropped.
FT_TARGET_AVX512 inline uint64_t plain_read(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 192));
  }
  for (; i + 64 <= n; i += 64) a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

// `bytes` in whole 2 MiB units, asking for transparent huge pages as numpy does for the executor's
// large banks (a hint: refused where THP is off, and then ignored). Exits with status 2 (after a
// message naming `who`) where the memory is not there.
inline uint8_t* huge_alloc(size_t bytes, const char* who) {
  const size_t huge = size_t{1} << 21;
  const size_t cap = (bytes + huge - 1) / huge * huge;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(huge, cap));
  if (!p) {
    std::fprintf(stderr, "%s: cannot allocate %zu bytes\n", who, cap);
    std::exit(2);
  }
  madvise(p, cap, MADV_HUGEPAGE);
  return p;
}

// The mxfp4 rows the probes stream: random e2m1 bytes in W, e8m0 scales 2^-6 .. 2^0 in S.
inline void fill_rows(std::mt19937_64& rng, uint8_t* W, size_t wbytes, uint8_t* S, size_t sbytes) {
  for (size_t i = 0; i < wbytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(W + i, &v, std::min<size_t>(8, wbytes - i));
  }
  for (size_t i = 0; i < sbytes; ++i) S[i] = static_cast<uint8_t>(121 + rng() % 7);
}

// x: K values ~ N(0, 1); returns its int8 step record (fp4::q8_prep_vec), 64-byte aligned in rec.
inline const void* make_x(std::mt19937_64& rng, int K, std::vector<float>& x, std::vector<uint8_t>& rec) {
  x.resize(K);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& v : x) v = normal(rng);
  rec.assign(ft::fp4::q8_vec_bytes(K) + 64, 0);
  void* xr = rec.data() + (-reinterpret_cast<uintptr_t>(rec.data()) % 64);
  ft::fp4::q8_prep_vec(x.data(), 0, K, K, xr);
  return xr;
}

}  // namespace probe
