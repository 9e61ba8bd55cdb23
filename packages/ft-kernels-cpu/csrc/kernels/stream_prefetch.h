// Software prefetch of a weight stream, shared by every format's row kernels.
//
// The rows of one kernel call are one stream (contiguous when the row stride equals the row bytes),
// read in address order. Lines are requested `dist` bytes ahead of the read position, never past the
// end of the stream (prefetches never fault, but stay inside the stream anyway); the stream's first
// `dist` bytes are requested at once, since the hardware prefetchers have nothing to follow yet at
// the start of a stream (and those of Intel cores stop at 4 KiB pages). dist = 0 disables
// (MoeParams::prefetch; each format picks its distance, see prefetch_distance in fp8nv_common.h and
// fp4_common.h).
//
// Two ways to walk a stream:
//   StreamPrefetch        stateless, passed by const reference into the kernels: ahead(p) once per
//                         64-byte line read at p (bf16, fp8_block, nvfp4, mxfp4, ds_fp4).
//   StreamPrefetchCursor  remembers the last line requested: advance(p) requests every line up to
//                         p + dist not requested yet, for streams read in blocks that are not whole
//                         lines (ggml blocks of 18, 34, 144, 210 bytes, ...).
#pragma once

#include <algorithm>
#include <cstddef>

#include "common.h"

namespace ft {

// Which cache a software prefetch fills. L1 (_MM_HINT_T0) unless a format measured better with L2
// (_MM_HINT_T1; the FP4 formats, see fp4_kernels.cpp). Off x86 both are __builtin_prefetch's default.
enum class PrefetchHint { L1, L2 };

template <PrefetchHint Hint = PrefetchHint::L1>
inline void prefetch_line(const char* q) {
#if FT_X86
  if constexpr (Hint == PrefetchHint::L2) {
    _mm_prefetch(q, _MM_HINT_T1);
  } else {
    _mm_prefetch(q, _MM_HINT_T0);
  }
#else
  __builtin_prefetch(q);
#endif
}

// Bytes from the first row of a call to the end of its last: nrows rows of row_bytes, ld bytes apart.
inline size_t rows_stream_bytes(size_t ld, int nrows, size_t row_bytes) {
  return nrows > 0 ? static_cast<size_t>(nrows - 1) * ld + row_bytes : 0;
}

template <PrefetchHint Hint = PrefetchHint::L1>
struct StreamPrefetch {
  const char* end = nullptr;  // one past the last byte of the stream
  int dist = 0;               // bytes ahead; 0 disables

  StreamPrefetch() = default;
  // The stream [begin, begin + bytes); its first `dist` bytes are requested here.
  StreamPrefetch(const void* begin, size_t bytes, int d) : end(static_cast<const char*>(begin) + bytes), dist(d) {
    if (!dist) return;
    const char* q = static_cast<const char*>(begin);
    for (const char* e = std::min(end, q + dist); q < e; q += 64) prefetch_line<Hint>(q);
  }
  // Called once per 64-byte line read at `p`: requests the line `dist` bytes ahead, within the stream.
  // H: the cache to fill, the stream's own by default (a kernel may override it).
  template <PrefetchHint H = Hint>
  void ahead(const void* p) const {
    const char* q = static_cast<const char*>(p) + dist;
    if (q < end) prefetch_line<H>(q);
  }
  // Every line of [p, p + n) moved `dist` ahead.
  void ahead_range(const void* p, size_t n) const {
    if (!dist) return;
    const char* q = static_cast<const char*>(p);
    for (size_t o = 0; o < n; o += 64) ahead(q + o);
  }
};

struct StreamPrefetchCursor {
  const char* next;  // first line not requested yet
  const char* end;   // one past the last byte of the stream
  int dist;          // bytes ahead; 0 disables (callers skip advance())

  // The stream [begin, begin + bytes); nothing is requested before the first advance(), which asks
  // for the stream's first `dist` bytes (and more) at once.
  StreamPrefetchCursor(const void* begin, size_t bytes, int d)
      : next(static_cast<const char*>(begin)), end(static_cast<const char*>(begin) + bytes), dist(d) {}
  // Reading at `p`: requests every line not requested yet up to p + dist, within the stream.
  void advance(const void* p) {
    const char* lim = std::min(end, static_cast<const char*>(p) + dist);
    for (; next < lim; next += 64) prefetch_line(next);
  }
};

}  // namespace ft
