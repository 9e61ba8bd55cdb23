// The request patterns of StreamPrefetchCursor and StreamPrefetch::ahead_block
// (packages/ft-kernels-cpu/csrc/kernels/stream_prefetch.h), compiled and run by
// test_stream_prefetch.py. A stream is read in blocks of `step` bytes and the cursor advanced at
// each block's start; every request is traced (FT_PREFETCH_TRACE) and checked against the
// contract, computed here from the addresses alone (ahead_block's: at run_block_case):
//   - after advance(p), every line of the stream that starts below p + dist has been requested into
//     the far level (L2 with two levels, else L1), and with two levels every line below p + near into
//     L1; no line at or past p + lead + 256 + 64 is (the cursor asks for 256 bytes at a time);
//   - each line of the stream is requested exactly once per level, in address order, and nothing
//     outside the stream and its chained successor; at most one advance per 256 bytes read (and
//     level) requests anything;
//   - chained: the lines of the successor below p + dist - end are requested into the far level, and
//     the successor's own cursor skips the lines its predecessor requested (but the last 512 bytes of
//     its first `dist`), then every line of the successor has been requested once or twice.
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

struct Level {
  std::vector<int> count;  // requests per line of [base, base + lines * 64)
  long last = -1;          // line index of the last request, for the order check
};

// Lines of [base, base + bytes) requested into the level `l2` since `from`, counted into lv; requests
// outside any of the given streams fail.
void collect(size_t from, bool l2, const char* a, size_t abytes, Level& la, const char* b, size_t bbytes, Level& lb,
             const char* ctx) {
  for (size_t i = from; i < g_requests.size(); ++i) {
    const auto [q, into_l2] = g_requests[i];
    if (into_l2 != l2) continue;
    Level* lv = nullptr;
    long line = 0;
    if (q >= a && q < a + abytes) {
      lv = &la, line = (q - a) / 64;
    } else if (b && q >= b && q < b + bbytes) {
      lv = &lb, line = (q - b) / 64;
    } else {
      fail("request outside the streams", static_cast<long>(reinterpret_cast<uintptr_t>(q) % 100000), 0, ctx);
      continue;
    }
    ++lv->count[line];
    if (line <= lv->last) fail("request out of address order", line, lv->last, ctx);
    lv->last = line;
  }
}

// Reads [s, s + bytes) in blocks of `step`, advancing `c` at each block; checks the leads after each
// advance (the successor's too when it is given).
void read_stream(ft::StreamPrefetchCursor& c, const char* s, size_t bytes, int step, int dist, int near,
                 const char* succ, size_t succ_bytes, Level& far, Level& nearl, Level& sfar, const char* ctx) {
  long busy = 0;  // advances that requested something
  for (size_t off = 0; off < bytes; off += step) {
    const size_t mark = g_requests.size();
    c.advance(s + off);
    busy += g_requests.size() > mark;
    Level dummy_near{std::vector<int>(succ_bytes / 64 + 2), -1};
    collect(mark, near > 0, s, bytes, far, succ, succ_bytes, sfar, ctx);
    if (near > 0) collect(mark, false, s, bytes, nearl, succ, succ_bytes, dummy_near, ctx);
    // Far lead: every line starting below off + dist (within the stream) requested, none past the bound.
    const long need = std::min<long>((static_cast<long>(off) + dist + 63) / 64, static_cast<long>(far.count.size()));
    for (long l = far.last + 1; l < need; ++l) fail("far line not requested in time", l, static_cast<long>(off), ctx);
    if (far.last >= 0 && far.last * 64 >= static_cast<long>(off) + dist + 256 + 64) {
      fail("far line requested too early", far.last, static_cast<long>(off), ctx);
    }
    if (near > 0) {
      const long need_n =
          std::min<long>((static_cast<long>(off) + near + 63) / 64, static_cast<long>(nearl.count.size()));
      for (long l = nearl.last + 1; l < need_n; ++l) fail("L1 line not requested in time", l, static_cast<long>(off), ctx);
      if (nearl.last >= 0 && nearl.last * 64 >= static_cast<long>(off) + near + 256 + 64) {
        fail("L1 line requested too early", nearl.last, static_cast<long>(off), ctx);
      }
    }
    if (succ) {
      const long past = static_cast<long>(off) + dist - static_cast<long>(bytes);  // bytes of lead past the end
      const long need_s = std::min<long>(past > 0 ? (past + 63) / 64 : 0, static_cast<long>(sfar.count.size()));
      for (long l = sfar.last + 1; l < need_s; ++l) fail("successor line not requested in time", l, past, ctx);
      if (dummy_near.last >= 0) fail("successor line requested into L1", dummy_near.last, 0, ctx);
    }
  }
  // 256 bytes at a time: one busy advance per 256 bytes of lead gained (per level), and the first.
  const long advances = static_cast<long>((bytes + step - 1) / step);
  const long bound = 2 + (near > 0 ? 2 : 1) * ((static_cast<long>(bytes) + 255) / 256 + 1);
  if (busy > std::min(advances, bound)) fail("advances that requested lines", busy, bound, ctx);
}

void check_once(const Level& lv, const char* what, const char* ctx) {
  for (size_t l = 0; l < lv.count.size(); ++l) {
    if (lv.count[l] != 1) fail(what, static_cast<long>(l), lv.count[l], ctx);
  }
}

// One stream alone, then the same stream chained to a successor.
void run_case(size_t bytes, int step, int dist, int near, size_t succ_bytes) {
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "bytes %zu step %d dist %d near %d succ %zu", bytes, step, dist, near, succ_bytes);
  static std::vector<char> buf(1 << 22);
  char* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  const char* s = base;
  const char* succ = base + ((bytes + 4095) / 4096 + 1) * 4096;
  const size_t lines = (bytes + 63) / 64, slines = (succ_bytes + 63) / 64;
  const int before = g_failures;
  ft::t_prefetch_near = near;
  {  // alone
    g_requests.clear();
    ft::t_chain.start(false);  // an empty chain: no links
    ft::StreamPrefetchCursor c(s, bytes, dist);
    Level far{std::vector<int>(lines), -1}, nearl{std::vector<int>(lines), -1}, none{std::vector<int>(1), -1};
    read_stream(c, s, bytes, step, dist, near > 0 && near < dist ? near : 0, nullptr, 0, far, nearl, none, ctx);
    check_once(far, "far line not requested exactly once", ctx);
    if (near > 0 && near < dist) check_once(nearl, "L1 line not requested exactly once", ctx);
  }
  if (succ_bytes) {  // chained: s, then succ
    g_requests.clear();
    ft::t_chain.start(false);
    ft::t_chain.linked = 0;
    ft::t_chain.add(s, bytes);
    ft::t_chain.add(succ, succ_bytes);
    const int nr = near > 0 && near < dist ? near : 0;
    Level far{std::vector<int>(lines), -1}, nearl{std::vector<int>(lines), -1}, sfar{std::vector<int>(slines), -1};
    {
      ft::StreamPrefetchCursor c(s, bytes, dist);
      read_stream(c, s, bytes, step, dist, nr, succ, succ_bytes, far, nearl, sfar, ctx);
    }
    check_once(far, "chained: far line not requested exactly once", ctx);
    // The successor's cursor: its warm head skips what the predecessor requested, less 512 bytes.
    const size_t mark = g_requests.size();
    const uint64_t linked_before = ft::t_chain.linked;
    ft::StreamPrefetchCursor c2(succ, succ_bytes, dist);
    Level sfar2{std::vector<int>(slines), -1}, snear{std::vector<int>(slines), -1}, none{std::vector<int>(1), -1};
    for (size_t off = 0; off < succ_bytes; off += step) c2.advance(succ + off);
    collect(mark, nr > 0, succ, succ_bytes, sfar2, nullptr, 0, none, ctx);
    for (size_t l = 0; l < slines; ++l) {
      const int total = sfar.count[l] + sfar2.count[l];
      if (total < 1 || total > 2) fail("chained: successor line requested 0 or 3+ times", static_cast<long>(l), total, ctx);
      if (total == 2 && static_cast<long>(l) * 64 < dist - 512 - 64) {
        fail("chained: successor re-requested a line of its warm head", static_cast<long>(l), total, ctx);
      }
    }
    if (ft::t_chain.linked != linked_before) fail("chained: the successor linked onward", 0, 0, ctx);
    if (linked_before == 0) fail("chained: the stream did not link", 0, 0, ctx);
  }
  if (g_failures == before) std::printf("ok %s\n", ctx);
}

// StreamPrefetch::ahead_block<N> at every block of a stream read in blocks of N: after the block at
// off, every line that starts below off + dist has been requested (two levels: into L2, and those in
// [near, off + near) into L1), none at or past off + N + dist (off + N + near); no line more than
// twice a level. (A last partial line of the stream may go without a request: the requests of a
// block lie 64 bytes apart from its start, and no block follows the last.)
template <int N>
void run_block_case(size_t bytes, int dist, int near) {
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "ahead_block<%d> bytes %zu dist %d near %d", N, bytes, dist, near);
  static std::vector<char> buf(1 << 22);
  const char* s = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  const size_t lines = (bytes + 63) / 64;
  const int before = g_failures;
  ft::t_prefetch_near = near;
  ft::t_chain.start(false);
  g_requests.clear();
  const ft::StreamPrefetch<> pf(s, bytes, dist);
  const int nr = pf.near;
  std::vector<int> far(lines), l1(lines);
  for (size_t off = 0; off < bytes; off += N) {
    pf.ahead_block<N>(s + off);
    for (const auto& [q, into_l2] : g_requests) {
      if (q < s || q >= s + bytes) {
        fail("request outside the stream", static_cast<long>(q - s), static_cast<long>(bytes), ctx);
        continue;
      }
      const long line = (q - s) / 64;
      const bool is_far = nr > 0 ? into_l2 : true;
      (is_far ? far : l1)[line] += 1;
      const long lead = is_far ? dist : nr;
      if ((q - s) / 64 * 64 >= static_cast<long>(off) + N + lead) fail("line requested too early", line, static_cast<long>(off), ctx);
    }
    g_requests.clear();
    auto covered = [&](const std::vector<int>& c, long from, long lead, const char* what) {
      const long need = std::min<long>((static_cast<long>(off) + lead + 63) / 64, static_cast<long>(bytes / 64));
      for (long l = from; l < need; ++l) {
        if (c[l] == 0) fail(what, l, static_cast<long>(off), ctx);
      }
    };
    // The far lines below the stream's first `dist` come from the constructor's burst (traced too);
    // its first `near` bytes have no L1 request (the burst goes to L2).
    covered(far, 0, dist, "far line not requested in time");
    if (nr > 0) covered(l1, nr / 64, nr, "L1 line not requested in time");
  }
  for (size_t l = 0; l < lines; ++l) {
    if (far[l] > 2 || l1[l] > 2) fail("line requested more than twice", static_cast<long>(l), far[l] + l1[l], ctx);
  }
  if (g_failures == before) std::printf("ok %s\n", ctx);
}

}  // namespace

int main() {
  const int steps[] = {34, 64, 72, 144, 210};
  const size_t sizes[] = {64 * 1152, 2048 * 432 + 100, 3000, 130, 64};
  for (int step : steps) {
    for (size_t bytes : sizes) {
      for (int dist : {512, 8192}) {
        for (int near : {0, 1024}) run_case(bytes, step, dist, near, bytes % 3 == 0 ? 5000 : 40000);
      }
    }
  }
  for (size_t bytes : sizes) {
    for (int dist : {512, 8192}) {
      for (int near : {0, 1024}) {
        run_block_case<68>(bytes, dist, near);
        run_block_case<72>(bytes, dist, near);
        run_block_case<210>(bytes, dist, near);
      }
    }
  }
  std::printf("failures %d\n", g_failures);
  return g_failures ? 1 : 0;
}
