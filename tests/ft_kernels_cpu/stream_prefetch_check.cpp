// The request pattern of StreamPrefetch::ahead_block (packages/ft-kernels-cpu/csrc/kernels/
// stream_prefetch.h), compiled and run by test_stream_prefetch.py. A stream is read in blocks of N
// bytes with ahead_block<N> at each block's start, as the ggml kernels do, alone or chained to a
// successor (StreamChain); every request is traced (FT_PREFETCH_TRACE) and checked against the
// contract, computed here from the addresses alone. After the block at off:
//   - every line of the stream that starts below off + dist has been requested into the far level
//     (L2 with two levels, else L1), with two levels every line in [near, off + near) into L1 (the
//     stream's first `dist` bytes come from the constructor's burst, into the far level only); a
//     last partial line may go without a request (no block follows the last);
//   - none at or past off + N + dist (off + N + near into L1), none more than twice a level (64 / N + 2
//     times for blocks shorter than a line), nothing outside the stream and its successor;
//   - chained: the successor's lines that lie wholly below off + dist - end have been requested into
//     the far level, none into L1; the successor's own StreamPrefetch then skips its warm head (it
//     requests nothing below dist - 512 - 64), and every whole line of the successor has been
//     requested.
// Prints one line per violation ("FAIL ...") and one "ok ..." line per case.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace {
std::vector<std::pair<const char*, bool>> g_requests;
}
#define FT_PREFETCH_TRACE(q, into_l2) g_requests.emplace_back((q), (into_l2))
#include "kernels/stream_prefetch.h"

namespace {

int g_failures = 0;

void fail(const char* what, long a, long b, const char* ctx) {
  if (++g_failures <= 40) std::printf("FAIL %s: %ld vs %ld (%s)\n", what, a, b, ctx);
}

// Requests per line of a stream, far level and L1.
struct Counts {
  std::vector<int> far, l1;
  explicit Counts(size_t bytes) : far((bytes + 63) / 64), l1((bytes + 63) / 64) {}
};

// Moves g_requests into the counts of s (or of the successor t); `off` the block just read, for the
// early-request bound; clears g_requests.
void collect(const char* s, size_t bytes, const char* t, size_t tbytes, int dist, int near, long off, int N,
             Counts& cs, Counts& ct, const char* ctx) {
  for (const auto& [q, into_l2] : g_requests) {
    const bool is_far = near > 0 ? into_l2 : true;
    if (q >= s && q < s + bytes) {
      const long line = (q - s) / 64;
      (is_far ? cs.far : cs.l1)[line] += 1;
      const long lead = is_far ? dist : near;
      if (line * 64 >= off + N + lead) fail("line requested too early", line, off, ctx);
    } else if (t && q >= t && q < t + tbytes) {
      const long line = (q - t) / 64;
      if (!is_far) fail("successor line requested into L1", line, off, ctx);
      ct.far[line] += 1;
      if (off >= 0 && line * 64 >= off + N + dist - static_cast<long>(bytes)) {
        fail("successor line requested too early", line, off, ctx);
      }
    } else {
      fail("request outside the streams", static_cast<long>(reinterpret_cast<uintptr_t>(q) % 100000), 0, ctx);
    }
  }
  g_requests.clear();
}

template <int N>
void run_case(size_t bytes, int dist, int near, size_t succ_bytes) {
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "ahead_block<%d> bytes %zu dist %d near %d succ %zu", N, bytes, dist, near,
                succ_bytes);
  static std::vector<char> buf(1 << 22);
  const char* s = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  const char* t = succ_bytes ? s + ((bytes + 4095) / 4096 + 1) * 4096 : nullptr;
  const int before = g_failures;
  ft::t_prefetch_near = near;
  ft::thread_chain().start(false);
  ft::thread_chain().linked = 0;
  if (t) {
    ft::thread_chain().add(s, bytes);
    ft::thread_chain().add(t, succ_bytes);
  }
  g_requests.clear();
  Counts cs(bytes), ct(succ_bytes);
  {
    const ft::StreamPrefetch<> pf(s, bytes, dist);
    const int nr = pf.near;
    collect(s, bytes, t, succ_bytes, dist, nr, -1, N, cs, ct, ctx);  // the burst
    const long whole = static_cast<long>(bytes / 64);
    for (size_t off = 0; off < bytes; off += N) {
      const long o = static_cast<long>(off);
      pf.ahead_block<N>(s + off);
      collect(s, bytes, t, succ_bytes, dist, nr, o, N, cs, ct, ctx);
      for (long l = 0; l < std::min<long>((o + dist + 63) / 64, whole); ++l) {
        if (cs.far[l] == 0) fail("far line not requested in time", l, o, ctx);
      }
      if (nr > 0) {
        for (long l = nr / 64; l < std::min<long>((o + nr + 63) / 64, whole); ++l) {
          if (cs.l1[l] == 0) fail("L1 line not requested in time", l, o, ctx);
        }
      }
      if (t) {
        const long past = o + dist - static_cast<long>(bytes);  // lead past the end, bytes
        for (long l = 0; (l + 1) * 64 <= past && l < static_cast<long>(succ_bytes / 64); ++l) {
          if (ct.far[l] == 0) fail("successor line not requested in time", l, past, ctx);
        }
      }
    }
    constexpr int kMost = N >= 64 ? 2 : 64 / N + 2;  // blocks shorter than a line: one request each
    for (size_t l = 0; l < cs.far.size(); ++l) {
      if (cs.far[l] > kMost || cs.l1[l] > kMost) fail("line requested too often", static_cast<long>(l), cs.far[l], ctx);
    }
  }
  if (t) {
    if (ft::thread_chain().linked != 1) fail("the stream did not link to its successor", ft::thread_chain().linked, 1, ctx);
    // The successor's own prefetch: its warm head skips what the predecessor requested, less 512 bytes.
    Counts c2(succ_bytes), none(1);
    const ft::StreamPrefetch<> pf2(t, succ_bytes, dist);
    for (const auto& [q, into_l2] : g_requests) {
      const long line = (q - t) / 64;
      if (line * 64 < dist - 512 - 64) fail("successor re-requested its warm head", line, dist, ctx);
    }
    collect(t, succ_bytes, nullptr, 0, dist, pf2.near, -1, 0, c2, none, ctx);
    for (size_t off = 0; off < succ_bytes; off += N) {
      pf2.ahead_block<N>(t + off);
      collect(t, succ_bytes, nullptr, 0, dist, pf2.near, static_cast<long>(off), N, c2, none, ctx);
    }
    for (size_t l = 0; l < succ_bytes / 64; ++l) {
      if (ct.far[l] + c2.far[l] == 0) fail("successor line never requested", static_cast<long>(l), 0, ctx);
    }
  }
  if (g_failures == before) std::printf("ok %s\n", ctx);
}

}  // namespace

int main() {
  const size_t sizes[] = {64 * 1152, 2048 * 432 + 100, 3000, 130, 64};
  for (size_t bytes : sizes) {
    for (int dist : {512, 8192}) {
      for (int near : {0, 1024}) {
        for (size_t succ : {size_t{0}, size_t{40000}}) {
          run_case<18>(bytes, dist, near, succ);
          run_case<68>(bytes, dist, near, succ);
          run_case<72>(bytes, dist, near, succ);
          run_case<210>(bytes, dist, near, succ);
          run_case<576>(bytes, dist, near, succ);
        }
      }
    }
  }
  std::printf("failures %d\n", g_failures);
  return g_failures ? 1 : 0;
}
