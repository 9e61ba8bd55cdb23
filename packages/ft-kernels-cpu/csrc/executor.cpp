#include "executor.h"

#include "kernels/stream_prefetch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <cstdlib>

namespace ft {

namespace {
constexpr int kMaxTopK = 64;
constexpr int kMaxBlockRows = 256;
}  // namespace

// A counter of its own cache line: the units of different groups and blocks update theirs at once.
struct alignas(64) Counter {
  std::atomic<int> v{0};
  int fetch_add(int n, std::memory_order o) { return v.fetch_add(n, o); }
  int load(std::memory_order o) const { return v.load(o); }
  void store(int n, std::memory_order o) { v.store(n, o); }
};

// One run of one layer, reused across runs (vectors keep their capacity).
struct MoeJob final : PoolJob {
  const MoeExecutor::Layer* layer = nullptr;
  TaskInput in;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  uint16_t* y = nullptr;
  int T = 0, k = 0, H = 0, I = 0;
  bool on_input = false;

  // Pass 1 work: routes grouped by expert (first-appearance order), each group split in row blocks.
  std::vector<int> group_of_expert;  // [E] -> group or -1; reset after every run
  std::vector<int> group_expert, group_begin, members;
  std::vector<int> member_next;  // scratch for the grouping
  int rows1 = 16, nblk1 = 0;
  uint32_t n1 = 0;
  // Pass 2 work: units (group, block of rows2 output rows), groups in the same order as pass 1. A
  // unit writes its routes' values into `vals` (by member position); the unit that completes a
  // block (the last of the G groups to finish it) sums each token's routes into y. The last group's
  // blocks come in `split2` parts (4 or 2: units of rows2 / split2 rows): the last units a run hands
  // out are then shorter, and so is the wait of the workers that finish before them (the run's tail).
  int rows2 = 16, nblk2 = 0, split2 = 1;
  std::vector<int> member_of_route;  // [T * k] -> position in `members`, or -1
  float* vals = nullptr;             // [routed][vals_stride]
  int vals_stride = 0;
  std::unique_ptr<Counter[]> group_done;  // pass-1 units done per group
  std::unique_ptr<Counter[]> block_done;  // groups done per pass-2 block
  size_t group_done_size = 0, block_done_size = 0;

  float* inter = nullptr;
  size_t inter_stride = 0;
  uint8_t* prep = nullptr;
  size_t prep_stride = 0;
  // Pass-1 rows done per (group, prep block); the unit that completes a block prepares it.
  std::unique_ptr<Counter[]> prep_done;
  size_t prep_done_size = 0;
  int prep_rows = 16, nprep = 0;
  float* scratch = nullptr;
  size_t scratch_stride = 0;

  // The layer's L1 distances (Layer::prefetch_l1) by calls' vector count, at v - 1: set for each call
  // (stream_prefetch.h's t_prefetch_near).
  const int* prefetch_near = nullptr;
  int multirow_min_bytes = kMultirowMinBytes;  // MoeExecutor::multirow_min_bytes (stream_prefetch.h's multirow)
  int multirow_several_min_bytes = kMultirowMinBytes;  // MoeExecutor::multirow_several_min_bytes
  int gate_up_slice_bytes = 0;  // MoeExecutor::gate_up_slice_bytes (stream_prefetch.h's gate_up_slices)
  bool chain = false;     // chain each worker's weight streams across its units (MoeExecutor::chain_streams)
  struct alignas(64) Links {
    uint64_t v = 0;
  };
  std::unique_ptr<Links[]> links;  // per worker: streams chained to a successor (PoolProfile::chain_links)

  void run_unit(uint32_t u, uint32_t next, bool claimed_ahead, int worker) override {
    t_multirow_min_bytes = multirow_min_bytes;
    t_multirow_several_min_bytes = multirow_several_min_bytes;
    t_gate_up_slice_bytes = gate_up_slice_bytes;
    if (chain) {
      // This unit's weight streams, then the next one's: each stream's prefetch runs on into the next
      StreamChain& c = thread_chain();
      c.start(claimed_ahead);
      add_streams(u, c);
      if (next != kNoUnit) add_streams(next, c);
    }
    run_unit_rows(u, worker);
    if (chain) {
      StreamChain& c = thread_chain();
      c.n = 0;  // warm_head stays: the next unit's head, when it was claimed (start() above)
      links[worker].v += c.linked;
      c.linked = 0;
    }
  }

  bool claim_ahead() const override { return chain; }
  // Under the pool's ranges (WorkerPool::Claims), the last group's units of each pass come after the
  // workers' ranges, in order: its pass-1 units run while the workers' ranges finish, so the groups
  // of the ranges are complete before most workers reach pass 2 (each range's last unit completes a
  // group, and with the last group in the ranges too a worker's first pass-2 units waited for another
  // worker's last pass-1 unit: 6-15 us a step on the GPU machine's Xeon, docs/benchmarks.md,
  // twenty-fifth session); its pass-2 units (split2 parts of each block) are the run's short tail.
  uint32_t tail_units(int pass) const override {
    const uint32_t G = static_cast<uint32_t>(group_expert.size());
    if (G < 2) return 0;
    return pass == 0 ? static_cast<uint32_t>(nblk1) : static_cast<uint32_t>(split2 * nblk2);
  }

  void run_unit_rows(uint32_t u, int worker) {
    float* s = scratch + worker * scratch_stride;
    if (u < n1) {
      const int g = static_cast<int>(u) / nblk1;
      pass1(g, static_cast<int>(u) % nblk1, s);
      // release: the pass-2 units of the group see this unit's h rows (and the prep it may have done)
      group_done[g].fetch_add(1, std::memory_order_release);
    } else {
      int g, b, part;
      pass2_unit(u - n1, &g, &b, &part);
      pass2(g, b, part, s);
    }
  }

  // Pass-2 unit u2 -> (group, block, part of the block: 0 unless the group is the last one).
  void pass2_unit(uint32_t u2, int* g, int* b, int* part) const {
    const uint32_t full = static_cast<uint32_t>(group_expert.size() - 1) * nblk2;
    if (u2 < full) {
      *g = static_cast<int>(u2 / nblk2);
      *b = static_cast<int>(u2 % nblk2);
      *part = 0;
    } else {
      *g = static_cast<int>(group_expert.size()) - 1;
      *b = static_cast<int>((u2 - full) / split2);
      *part = static_cast<int>((u2 - full) % split2);
    }
  }

  // Output rows [*h0, *h1) of part `part` of block b of group g (pass 2).
  void pass2_rows(int g, int b, int part, int* h0, int* h1) const {
    const int parts = g == static_cast<int>(group_expert.size()) - 1 ? split2 : 1;
    const int b0 = b * rows2, b1 = std::min(H, b0 + rows2);  // the block
    *h0 = std::min(b1, b0 + part * (rows2 / parts));  // this unit's rows of it
    *h1 = part == parts - 1 ? b1 : std::min(b1, *h0 + rows2 / parts);
  }

  // Unit u's weight streams (MoeFormat::unit_streams) appended to c.
  void add_streams(uint32_t u, StreamChain& c) const {
    int g, r0, r1;
    const bool p2 = u >= n1;
    if (!p2) {
      g = static_cast<int>(u) / nblk1;
      r0 = (static_cast<int>(u) % nblk1) * rows1;
      r1 = std::min(I, r0 + rows1);
    } else {
      int b, part;
      pass2_unit(u - n1, &g, &b, &part);
      pass2_rows(g, b, part, &r0, &r1);
    }
    if (r1 <= r0) return;
    MoeFormat::ByteRange r[MoeFormat::kMaxUnitStreams];
    const int n = std::min(layer->fmt->unit_streams(p2, group_expert[g], r0, r1, r), MoeFormat::kMaxUnitStreams);
    for (int i = 0; i < n; ++i) c.add(r[i].begin, r[i].bytes);
  }

  // A group's down rows need only that group's intermediate: no barrier across all of pass 1.
  bool pass2_ready(uint32_t u2) const override {
    int g, b, part;
    pass2_unit(u2, &g, &b, &part);
    return group_done[g].load(std::memory_order_acquire) == nblk1;
  }

  void pass1(int g, int b, float* s) {
    const MoeFormat& fmt = *layer->fmt;
    const int i0 = b * rows1, i1 = std::min(I, i0 + rows1), n = i1 - i0;
    constexpr int kChunk = MoeFormat::kMaxTokensPerCall;
    float* gate = s;
    float* up = s + kChunk * kMaxBlockRows;
    const int e = group_expert[g];
    int tokens[kChunk];
    float scales[kChunk];
    for (int m0 = group_begin[g]; m0 < group_begin[g + 1]; m0 += kChunk) {
      const int cnt = std::min(kChunk, group_begin[g + 1] - m0);
      for (int j = 0; j < cnt; ++j) {
        const int route = members[m0 + j];
        tokens[j] = route / k;
        scales[j] = on_input ? weights[route] : 1.f;
      }
      t_prefetch_near = prefetch_near[cnt - 1];
      fmt.gate_up_tokens(in, e, tokens, scales, cnt, i0, i1, gate, up, kMaxBlockRows);
      for (int j = 0; j < cnt; ++j) {
        const int route = members[m0 + j];
        float* h = inter + route * inter_stride;
        apply_activation(layer->act, gate + j * kMaxBlockRows, up + j * kMaxBlockRows, n, h + i0);
      }
    }
    if (!prep) return;
    // Units never straddle a prep block (prep_rows is a multiple of rows1). acq_rel: the unit that
    // completes the block sees the h rows the other units of the block wrote.
    const int p = i0 / prep_rows, p0 = p * prep_rows, p1 = std::min(I, p0 + prep_rows);
    if (prep_done[static_cast<size_t>(g) * nprep + p].fetch_add(n, std::memory_order_acq_rel) + n != p1 - p0) return;
    for (int m = group_begin[g]; m < group_begin[g + 1]; ++m) {
      const int route = members[m];
      fmt.prep_inter(inter + route * inter_stride, p0, p1, prep + route * prep_stride);
    }
  }

  RouteRef route_ref(int route) const {
    return RouteRef{ids[route], inter + route * inter_stride,
                    prep ? prep + route * prep_stride : nullptr};
  }

  void pass2(int g, int b, int part, float* s) {
    const MoeFormat& fmt = *layer->fmt;
    const int G = static_cast<int>(group_expert.size());
    const int b0 = b * rows2, b1 = std::min(H, b0 + rows2);  // the block
    int h0, h1;
    pass2_rows(g, b, part, &h0, &h1);
    // The group's rows once for all of its routes (in chunks), into their members' rows of `vals`.
    constexpr int kChunk = MoeFormat::kMaxTokensPerCall;
    RouteRef refs[kChunk];
    for (int m0 = group_begin[g]; h1 > h0 && m0 < group_begin[g + 1]; m0 += kChunk) {
      const int cnt = std::min(kChunk, group_begin[g + 1] - m0);
      for (int j = 0; j < cnt; ++j) refs[j] = route_ref(members[m0 + j]);
      t_prefetch_near = prefetch_near[cnt - 1];
      fmt.down_rows(group_expert[g], h0, h1, refs, cnt, vals + static_cast<size_t>(m0) * vals_stride + h0,
                    vals_stride);
    }
    // acq_rel: the unit that completes the block sees every group's values of it.
    if (block_done[b].fetch_add(1, std::memory_order_acq_rel) + 1 != G - 1 + split2) return;
    const int rows = b1 - b0;
    // Each token's routes summed in route order.
    for (int t = 0; t < T; ++t) {
      bool any = false;
      std::fill(s, s + rows, 0.f);
      for (int r = 0; r < k; ++r) {
        const int route = t * k + r;
        if (ids[route] < 0) continue;
        any = true;
        const float w = on_input ? 1.f : weights[route];
        const float* v = vals + static_cast<size_t>(member_of_route[route]) * vals_stride + b0;
        for (int j = 0; j < rows; ++j) s[j] += w * v[j];
      }
      if (!any) continue;
      uint16_t* yt = y + static_cast<size_t>(t) * H;
      for (int j = b0; j < b1; ++j) yt[j] = f32_to_bf16(s[j - b0]);
    }
  }
};

namespace {

struct ReadJob final : PoolJob {
  const uint8_t* data = nullptr;
  size_t chunk = 0;
  Isa isa = Isa::scalar;
  uint64_t* sinks = nullptr;  // one per worker, 64 bytes apart
  void run_unit(uint32_t u, uint32_t next, bool claimed_ahead, int worker) override;
  bool pass2_ready(uint32_t /*u2*/) const override { return true; }  // runs pass 1 only
};

}  // namespace

uint64_t read_checksum(Isa isa, const uint8_t* p, size_t bytes);  // read_bandwidth.cpp

void ReadJob::run_unit(uint32_t u, uint32_t /*next*/, bool /*claimed_ahead*/, int worker) {
  sinks[worker * 8] ^= read_checksum(isa, data + static_cast<size_t>(u) * chunk, chunk);
}

static int default_threads() {
  const int cores = static_cast<int>(physical_core_cpus().size());
  // Leave one core to the thread that drives the GPU (or the coordinator): a pool spinning on every
  // core next to another spinning thread runs an order of magnitude slower.
  return std::max(1, cores - 1);
}

// Software prefetch distance of the weight streams, as measured with the bench (docs/benchmarks.md).
// On the Xeon of the GPU machine the hardware prefetchers, which stop at every 4 KiB page, left the
// kernels at 0.64-0.68 of the read bandwidth; 8 KiB ahead lifted them to 0.85-0.89 (16 KiB: 0.85,
// 4 KiB: 0.85). On a 2-core Zen 4 the quantized formats gained too (q4_0 and gguf 19-21 -> 25-29
// GB/s of weights, with the two levels below; thirteenth session). A format may use less: bf16
// keeps to the hardware prefetchers on AMD, where a software prefetch cost its rows 5-10% on Zen 5
// and Zen 4 (MoeFormat::prefetch_bytes).
static int default_prefetch() { return cpu_is_amd_zen5_or_later() ? 0 : 8192; }

// The L1 distance of the two-level prefetch (stream_prefetch.h), by pool size, as measured with the
// bench (docs/benchmarks.md, tenth and thirteenth sessions). 2-core Xeon, 2 threads: 1 KiB (0.5 and
// 2 KiB the same within the noise) took the quantized formats' batch 1 from ~0.6 to 0.77-0.81 of the
// read bandwidth and bf16 from 0.87 to 0.95; 2-core Zen 4, 2 threads: fp8_block 24-26 -> 28 GB/s,
// nvfp4 21-23 -> 24-25, q4_0 and gguf as above (0.5 and 2 KiB again the same within the noise). The
// GPU machine's 16-core Xeon: at 2 threads bf16 and fp8_block gained 0.03-0.05 and q4_0 / gguf stayed
// within the noise; at 8 threads bf16 gained 0.1 while q4_0, gguf and fp8_block lost 0.02-0.05; at 16
// threads bf16 stayed and the quantized formats lost 0.01-0.05. So two levels for pools of up to 4
// threads, one above, except for formats that ask for them at any pool size (bf16 on Intel: 0.87 ->
// 0.93 at 15 threads, 0.89 -> 0.91 at 16). Larger pools on AMD were not measured.
// Pools of 1 or 2 threads take 2048 since the thirty-ninth session: on a 2-core Xeon (Emerald
// Rapids, 2 threads) 2048 against 1024 raised every format's batch-1 ratio, by a median of 0.012
// (mxfp4) to 0.042 (ds_fp4) over 6 alternating rounds, each format ahead in 4-6 of them (q4_0 and
// nvfp4 in 3 of 4 more), and on the 2-core Zen 4 it was 1-3% faster in the slow mode (thirty-eighth
// session). On the GPU machine's Xeon, in disturbed VMs, 2048 was 0.005-0.028 lower at 4 threads
// (ahead in 1-2 of 4 rounds) and mixed at 16 (-0.043 to +0.032), so larger pools keep 1024.
constexpr int kTwoLevelMaxThreads = 4;
constexpr int kFarL1MaxThreads = 2;
static int default_prefetch_l1(int threads, bool any_pool) {
  if (threads <= kFarL1MaxThreads) return 2048;
  return any_pool || threads <= kTwoLevelMaxThreads ? 1024 : 0;
}

static bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// A prefetch distance in bytes: a multiple of 64 in [0, 65536]. `what` names its source in errors.
static int checked_prefetch(const char* what, long v) {
  if (v < 0 || v > 65536 || v % 64 != 0) {
    throw Error(std::string(what) + "=" + std::to_string(v) + " must be a multiple of 64 in [0, 65536]");
  }
  return static_cast<int>(v);
}

// The distance in the environment variable `name`, or `fallback` when it is unset or empty.
static int env_prefetch(const char* name, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (end == env || *end != '\0') {
    throw Error(std::string(name) + "='" + env + "' is not an integer number of bytes in [0, 65536]");
  }
  return checked_prefetch(name, v);
}

// prefetch_bytes, else $FT_CPU_MOE_PREFETCH, else the default.
static int resolve_prefetch(int requested) {
  if (requested >= 0) return checked_prefetch("prefetch_bytes", requested);
  return env_prefetch("FT_CPU_MOE_PREFETCH", default_prefetch());
}

// $FT_CPU_MOE_PREFETCH_L1 (0: one level), else the default for the pool's threads.
static int resolve_prefetch_l1(int threads) {
  return env_prefetch("FT_CPU_MOE_PREFETCH_L1", default_prefetch_l1(threads, false));
}

// $name as a number of bytes in [0, 1048576], else `fallback`; `meaning` ends the error message.
static int env_bytes(const char* name, int fallback, const char* meaning) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || v < 0 || v > (1 << 20)) {
    throw Error(std::string(name) + "='" + env + "' must be an integer number of bytes in [0, 1048576] (" + meaning +
                ")");
  }
  return static_cast<int>(v);
}

// $FT_CPU_MOE_MULTIROW_BYTES="ONE[,SEVERAL]": the least row bytes for which int8 kernels read several
// rows side by side (stream_prefetch.h's multirow) in calls of one vector (4 rows) and in calls of
// several (2 rows; SEVERAL defaults to ONE), integers in [0, 1048576] (0: always; above any row:
// never), else the vendor's defaults:
// - Intel: 0 and 0 (always). The GPU machine's Xeon took batch 8 sharing its experts from 452 to 682
//   us a step (q4_0) and 462 to 826 (nvfp4) with the 2-row kernels gated at 1024 bytes (16 threads;
//   docs/benchmarks.md, twenty-second session).
// - AMD: 2048 for one vector, so that rows of 1-2 KiB (q4_0's and gguf's Q4_K gate/up rows of 1152
//   bytes, nvfp4's of 1024) go one at a time and fp8_block's rows of 2 KiB keep their 2-row kernels.
//   On a 2-core Zen 4 the 4-row one-vector kernels ran q4_0's step in cache at 1206 us against 858 one
//   row at a time, gguf's 1738 against 1159 and nvfp4's 1527 against 970, and from DRAM (2 threads)
//   1106 / 1459 / 1091 against 759 / 728 / 760 (twenty-ninth session). nvfp4 overrides it where the
//   variable is unset (MoeParams::multirow_explicit; nvfp4.cpp's rows4_one_): re-measured in the
//   thirty-second session, its 4 rows beat its one row at a time on that Zen 4.
// - AMD's Zen 5 and later: 2048 for several vectors too; the int8 formats' 2-row kernels of several
//   vectors read rows of 1-2 KiB slower than one at a time there (2 threads, batch 8 sharing its
//   experts: q4_0 x0.904, nvfp4 x0.886; fp8_block's rows of 2 KiB x1.67 with theirs; twenty-seventh
//   session, without software prefetch, Zen 5's default).
// - Older AMD: 1024 for several vectors. On the 2-core Zen 4, with the kernels' software prefetch
//   working (twenty-ninth session), q4_0's 2-row kernels of 8 vectors took a step sharing its experts
//   from 2211 to 1759 us (they load each vector's x once for two rows; the one-row kernel is bound by
//   those loads); nvfp4 within its noise (1807 against 1766 in one A/B, 1774 against 1863 in
//   another); gguf's Q4_K rows have no 2-row kernel of several vectors.
// A knob for measuring it on a machine.
static void parse_multirow_bytes(int* one, int* several) {
  const bool zen5 = cpu_is_amd_zen5_or_later();
  *one = cpu_is_intel() ? 0 : 2 * kMultirowMinBytes;
  *several = cpu_is_intel() ? 0 : zen5 ? 2 * kMultirowMinBytes : kMultirowMinBytes;
  const char* env = std::getenv("FT_CPU_MOE_MULTIROW_BYTES");
  if (env == nullptr || *env == '\0') return;
  const std::string bad = std::string("FT_CPU_MOE_MULTIROW_BYTES='") + env +
                          "' must be 'ONE' or 'ONE,SEVERAL', integer numbers of bytes in [0, 1048576] (the least row "
                          "bytes for rows side by side in calls of one vector and of several)";
  char* end = nullptr;
  const long a = std::strtol(env, &end, 10);
  if (end == env || (*end != '\0' && *end != ',') || a < 0 || a > (1 << 20)) throw Error(bad);
  long b = a;
  if (*end == ',') {
    const char* second = end + 1;
    b = std::strtol(second, &end, 10);
    if (end == second || *end != '\0' || b < 0 || b > (1 << 20)) throw Error(bad);
  }
  *one = static_cast<int>(a);
  *several = static_cast<int>(b);
}

// $FT_CPU_MOE_GATE_UP_SLICE: the bytes of gate rows, then of up rows, that one-vector pass-1 calls read
// in turns (stream_prefetch.h's gate_up_slices), an integer in [0, 1048576] (0: all gate rows of a
// call, then all its up rows), else 2048 on AMD's Zen 5 and later (one core read two interleaved
// streams of rows from DRAM faster than one; docs/benchmarks.md, twenty-seventh session) and 0 elsewhere.
static int parse_gate_up_slice_bytes() {
  return env_bytes("FT_CPU_MOE_GATE_UP_SLICE", cpu_is_amd_zen5_or_later() ? 2048 : 0,
                   "gate and up rows read in turns of that many bytes; 0: all gate rows, then all up rows");
}

// $FT_CPU_MOE_UNIT_ROWS="P1,P2": rows per pass-1 / pass-2 unit for every layer instead of the
// formats' choices (0 keeps the run's choice: pass1_rows_for, pass2_rows_for); a tuning knob for
// measuring unit sizes on a machine.
static void parse_unit_rows(int* rows1, int* rows2) {
  const char* env = std::getenv("FT_CPU_MOE_UNIT_ROWS");
  *rows1 = *rows2 = 0;
  if (env == nullptr || *env == '\0') return;
  const std::string bad = std::string("FT_CPU_MOE_UNIT_ROWS='") + env +
                          "' must be two integers 'P1,P2' in [0, " + std::to_string(kMaxBlockRows) +
                          "] (rows per pass-1 and pass-2 unit; 0 keeps the format's)";
  char* end = nullptr;
  const long a = std::strtol(env, &end, 10);
  if (end == env || *end != ',') throw Error(bad);
  const char* second = end + 1;
  const long b = std::strtol(second, &end, 10);
  if (end == second || *end != '\0' || a < 0 || b < 0 || a > kMaxBlockRows || b > kMaxBlockRows) throw Error(bad);
  *rows1 = static_cast<int>(a);
  *rows2 = static_cast<int>(b);
}

// $FT_CPU_MOE_CHAIN: "1" (or unset) chains each worker's weight streams across its units
// (stream_prefetch.h's StreamChain; workers claim their next unit when they start one), "0" gives every
// kernel call's stream its own start. On by default: on the GPU machine's Xeon it shortened the time
// inside units by 0-13% (eighteenth session), and with it main's batch-1 ratios were at or above
// those without it for every format in one VM (docs/benchmarks.md, nineteenth session).
static bool parse_chain() {
  const char* env = std::getenv("FT_CPU_MOE_CHAIN");
  if (env == nullptr || *env == '\0' || std::string(env) == "1") return true;
  if (std::string(env) == "0") return false;
  throw Error(std::string("FT_CPU_MOE_CHAIN='") + env + "' must be 0 or 1 (chain the weight streams of a worker's units)");
}

// Rows per pass-1 unit for a run: the format's pass1_rows() (base), doubled while the doubled rows
// still divide the format's prep block and the run's G groups still give at least 8 units per thread.
// A decode step of Qwen3-30B-A3B (8 groups, intermediate 768) keeps the formats' 64 rows (96 units)
// from 12 threads up (the GPU machine's 15 and 16, where 64 rows beat 32 and 256: docs/benchmarks.md);
// on 2 threads it takes 256 rows (24 units) where the prep block allows (nvfp4, q4_0, gguf), else 128
// (mxfp4, ds_fp4): 3-7% off a step of the 2-core Zen 5 dev box (twenty-seventh session).
static int pass1_rows_for(int base, int prep_rows, int I, int groups, int threads) {
  int rows = base;
  while (rows * 2 <= kMaxBlockRows && prep_rows % (rows * 2) == 0 &&
         static_cast<long>(groups) * ((I + rows * 2 - 1) / (rows * 2)) >= 8L * threads) {
    rows *= 2;
  }
  return rows;
}

// Rows per pass-2 unit (one group's rows of one block): from kMaxBlockRows down to the format's
// pass2_rows(), halved while the run's G groups would give fewer than 8 units per thread. A decode
// step of Qwen3-30B-A3B (8 groups, 2048 rows) on 16 threads: 128 units of 128 rows, each one stream
// of one expert's rows. Unit sizes never change results.
static int pass2_rows_for(int base, int H, int groups, int threads) {
  int r = kMaxBlockRows;
  while (r / 2 >= std::max(1, base) && static_cast<long long>(groups) * ((H + r - 1) / r) < 8LL * threads) r /= 2;
  return r;
}

static int checked_threads(int num_threads) {
  if (num_threads == 0) return default_threads();
  if (num_threads < 0 || num_threads > 1024) {
    throw Error("num_threads must be in [1, 1024] (or 0 for the default), got " + std::to_string(num_threads));
  }
  return num_threads;
}

MoeExecutor::MoeExecutor(int hidden, int top_k, int max_tokens, int num_threads, const std::string& isa,
                         int prefetch_bytes)
    : hidden_(hidden), top_k_(top_k), max_tokens_(max_tokens), isa_(resolve_isa(isa)),
      prefetch_(resolve_prefetch(prefetch_bytes)),
      prefetch_explicit_(prefetch_bytes >= 0 || env_set("FT_CPU_MOE_PREFETCH")),
      pool_(checked_threads(num_threads)), job_(std::make_unique<MoeJob>()) {
  prefetch_l1_ = resolve_prefetch_l1(pool_.num_threads());
  prefetch_l1_explicit_ = env_set("FT_CPU_MOE_PREFETCH_L1");
  parse_unit_rows(&unit_rows1_, &unit_rows2_);
  chain_streams_ = parse_chain();
  parse_multirow_bytes(&multirow_min_bytes_, &multirow_several_min_bytes_);
  multirow_explicit_ = env_set("FT_CPU_MOE_MULTIROW_BYTES");
  gate_up_slice_bytes_ = parse_gate_up_slice_bytes();
  job_->links = std::make_unique<MoeJob::Links[]>(pool_.num_threads());
  if (hidden <= 0) throw Error("hidden must be > 0, got " + std::to_string(hidden));
  if (top_k <= 0 || top_k > kMaxTopK) {
    throw Error("top_k must be in [1, " + std::to_string(kMaxTopK) + "], got " + std::to_string(top_k));
  }
  if (max_tokens <= 0) throw Error("max_tokens must be > 0, got " + std::to_string(max_tokens));
  x_f32_.resize(static_cast<size_t>(max_tokens) * hidden);
  vals_.resize(static_cast<size_t>(max_tokens) * top_k * hidden);

  abi_.abi_version = FT_MOE_ABI_VERSION;
  abi_.struct_size = sizeof(ft_moe_executor_abi);
  abi_.self = this;
  abi_.run = [](void* self, const ft_moe_task* task) -> int {
    if (task == nullptr) return -1;
    return static_cast<MoeExecutor*>(self)->run_noexcept(*task);
  };
  abi_.last_error = [](void* self) -> const char* { return static_cast<MoeExecutor*>(self)->last_error(); };
  abi_.hidden = hidden;
  abi_.top_k = top_k;
  abi_.max_tokens = max_tokens;
  abi_.num_threads = pool_.num_threads();
}

MoeExecutor::~MoeExecutor() = default;

void MoeExecutor::add_layer(int layer, const std::string& format, int num_experts, int intermediate,
                            const std::string& activation, std::map<std::string, Bank> banks,
                            std::map<std::string, double> options, bool router_weight_on_input) {
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (layer < 0) throw Error("layer must be >= 0, got " + std::to_string(layer));
  if (layers_.count(layer)) throw Error("layer " + std::to_string(layer) + " was already added");
  if (num_experts <= 0) throw Error("num_experts must be > 0, got " + std::to_string(num_experts));
  if (intermediate <= 0) throw Error("intermediate must be > 0, got " + std::to_string(intermediate));

  Layer L;
  L.format_name = format;
  L.params.layer = layer;
  L.params.num_experts = num_experts;
  L.params.hidden = hidden_;
  L.params.intermediate = intermediate;
  L.params.top_k = top_k_;
  L.params.isa = isa_;
  L.params.router_weight_on_input = router_weight_on_input;
  L.params.prefetch = prefetch_;
  L.params.prefetch_explicit = prefetch_explicit_;
  L.params.multirow_explicit = multirow_explicit_;
  FormatArgs args("layer " + std::to_string(layer) + " (" + format + ")", std::move(banks), std::move(options));
  L.act.kind = activation_from_name(activation);
  if (L.act.kind == Activation::swigluoai) {
    L.act.alpha = static_cast<float>(args.option_or("alpha", 1.702));
    L.act.limit = static_cast<float>(args.option_or("limit", 7.0));
  } else if (L.act.kind == Activation::swiglu_clamp) {
    L.act.limit = static_cast<float>(args.require_option("limit", "clamp bound of swiglu_clamp"));
  }
  L.fmt = make_format(format, L.params, args);
  args.check_all_used();
  const int prep_rows = L.fmt->prep_rows();
  const int rows1 = unit_rows1_ ? unit_rows1_ : L.fmt->pass1_rows();
  const int rows2 = unit_rows2_ ? unit_rows2_ : L.fmt->pass2_rows();  // the least; run() picks per run
  if (rows1 < 1 || rows1 > kMaxBlockRows || rows2 < 1 || rows2 > kMaxBlockRows || prep_rows < 1) {
    throw Error(args.context() + ": pass block rows out of range");
  }
  if (L.fmt->inter_prep_bytes() && prep_rows % rows1 != 0) {
    throw Error(args.context() + ": " + std::to_string(rows1) + " rows per pass-1 unit" +
                (unit_rows1_ ? " (FT_CPU_MOE_UNIT_ROWS)" : "") + " must divide the format's prep block of " +
                std::to_string(prep_rows) + " rows");
  }
  L.rows1 = rows1;
  L.rows2 = rows2;
  L.rows2_fixed = unit_rows2_ != 0;
  L.prep_rows = prep_rows;
  for (int v = 1; v <= MoeFormat::kMaxTokensPerCall; ++v) L.prefetch[v - 1] = L.fmt->prefetch_bytes(L.params, v);
  // Unless the variable is set, a layer without software prefetch in any call has no L1 level.
  const bool none = std::all_of(std::begin(L.prefetch), std::end(L.prefetch), [](int d) { return d == 0; });
  for (int v = 1; v <= MoeFormat::kMaxTokensPerCall; ++v) {
    L.prefetch_l1[v - 1] = prefetch_l1_explicit_ ? prefetch_l1_
                           : none               ? 0
                                                : default_prefetch_l1(pool_.num_threads(),
                                                                      L.fmt->two_level_prefetch_any_pool(v));
  }

  // Grow scratch to cover this layer.
  const size_t routes = static_cast<size_t>(max_tokens_) * top_k_;
  inter_stride_ = std::max(inter_stride_, (static_cast<size_t>(intermediate) + 15) / 16 * 16);
  inter_.resize(routes * inter_stride_);
  prep_stride_ = std::max(prep_stride_, L.fmt->inter_prep_bytes() ? vec_stride(L.fmt->inter_prep_bytes()) : 0);
  if (prep_stride_) inter_prep_.resize(routes * prep_stride_);
  // Per worker: pass 1 gate and up rows of a token chunk; pass 2 one output block (within the same).
  const size_t pass1_floats = 2 * MoeFormat::kMaxTokensPerCall * kMaxBlockRows;
  worker_stride_ = std::max(worker_stride_, (pass1_floats + 15) / 16 * 16);
  worker_scratch_.resize(static_cast<size_t>(pool_.num_threads()) * worker_stride_);
  layers_.emplace(layer, std::move(L));
}

std::vector<int> MoeExecutor::layers() const {
  std::vector<int> out;
  for (const auto& kv : layers_) out.push_back(kv.first);
  return out;
}

const MoeExecutor::Layer& MoeExecutor::layer_at(int layer) const {
  auto it = layers_.find(layer);
  if (it == layers_.end()) throw Error("layer " + std::to_string(layer) + " has not been added");
  return it->second;
}

std::string MoeExecutor::layer_format(int layer) const { return layer_at(layer).format_name; }
std::string MoeExecutor::layer_kernels(int layer) const { return layer_at(layer).fmt->kernels(); }

// `vectors` as an index of a layer's per-vector-count settings (Layer::prefetch, prefetch_l1).
static int vector_index(int vectors) {
  if (vectors < 1 || vectors > MoeFormat::kMaxTokensPerCall) {
    throw Error("vectors must be in [1, " + std::to_string(MoeFormat::kMaxTokensPerCall) + "], got " +
                std::to_string(vectors));
  }
  return vectors - 1;
}
int MoeExecutor::layer_prefetch_bytes(int layer, int vectors) const {
  return layer_at(layer).prefetch[vector_index(vectors)];
}
int MoeExecutor::layer_prefetch_l1_bytes(int layer, int vectors) const {
  return layer_at(layer).prefetch_l1[vector_index(vectors)];
}

void MoeExecutor::run(const ft_moe_task& task) {
  std::lock_guard<std::mutex> lock(run_mutex_);
  run_locked(task);
}

int MoeExecutor::run_noexcept(const ft_moe_task& task) noexcept {
  try {
    std::lock_guard<std::mutex> lock(run_mutex_);
    last_error_.clear();
    try {
      run_locked(task);
      return 0;
    } catch (const std::exception& e) {
      last_error_ = e.what();
    }
  } catch (...) {
  }
  return -1;
}

void MoeExecutor::run_locked(const ft_moe_task& task) {
  auto it = layers_.find(task.layer);
  if (it == layers_.end()) throw Error("layer " + std::to_string(task.layer) + " has not been added");
  const Layer& L = it->second;
  const int T = task.num_tokens, k = top_k_, H = hidden_;
  if (T < 0 || T > max_tokens_) {
    throw Error("num_tokens=" + std::to_string(T) + " is out of range; this executor was built for max_tokens=" +
                std::to_string(max_tokens_));
  }
  if (T == 0) return;
  if (!task.x || !task.ids || !task.weights || !task.y) throw Error("task has a null x/ids/weights/y pointer");
  const int E = L.params.num_experts;
  int routed = 0;
  for (int i = 0; i < T * k; ++i) {
    const int e = task.ids[i];
    if (e >= E) {
      throw Error("ids[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "]=" + std::to_string(e) +
                  " is out of range for layer " + std::to_string(task.layer) + " with " + std::to_string(E) +
                  " experts");
    }
    routed += e >= 0;
  }
  uint16_t* y = static_cast<uint16_t*>(task.y);
  if (routed == 0) {  // nothing to compute: do not wake the pool
    std::memset(y, 0, sizeof(uint16_t) * static_cast<size_t>(T) * H);
    return;
  }

  MoeJob& job = *job_;
  job.layer = &L;
  job.ids = task.ids;
  job.weights = task.weights;
  job.y = y;
  job.T = T;
  job.k = k;
  job.H = H;
  job.I = L.params.intermediate;
  job.on_input = L.params.router_weight_on_input;
  job.rows1 = L.rows1;
  job.prefetch_near = L.prefetch_l1;
  job.multirow_min_bytes = multirow_min_bytes_;
  job.multirow_several_min_bytes = multirow_several_min_bytes_;
  job.gate_up_slice_bytes = gate_up_slice_bytes_;
  job.chain = chain_streams_ && L.prefetch[0] > 0;
  job.prep_rows = L.prep_rows;

  const uint16_t* x = static_cast<const uint16_t*>(task.x);
  float* xf = x_f32_.data();
  for (size_t i = 0, n = static_cast<size_t>(T) * H; i < n; ++i) xf[i] = bf16_to_f32(x[i]);
  job.in = TaskInput{T, x, xf};
  L.fmt->prep_input(job.in);

  // Group routes by expert, in order of first appearance; members keep token order.
  if (job.group_of_expert.size() < static_cast<size_t>(E)) job.group_of_expert.assign(E, -1);
  job.group_expert.clear();
  job.group_begin.clear();
  job.members.clear();
  for (int i = 0; i < T * k; ++i) {
    const int e = task.ids[i];
    if (e < 0) continue;
    int& g = job.group_of_expert[e];
    if (g < 0) {
      g = static_cast<int>(job.group_expert.size());
      job.group_expert.push_back(e);
    }
  }
  const int G = static_cast<int>(job.group_expert.size());
  job.group_begin.assign(G + 1, 0);
  for (int i = 0; i < T * k; ++i) {
    if (task.ids[i] >= 0) ++job.group_begin[job.group_of_expert[task.ids[i]] + 1];
  }
  for (int g = 0; g < G; ++g) job.group_begin[g + 1] += job.group_begin[g];
  job.members.resize(routed);
  job.member_next.assign(job.group_begin.begin(), job.group_begin.end() - 1);
  job.member_of_route.assign(static_cast<size_t>(T) * k, -1);
  for (int i = 0; i < T * k; ++i) {
    if (task.ids[i] < 0) continue;
    const int m = job.member_next[job.group_of_expert[task.ids[i]]]++;
    job.members[m] = i;
    job.member_of_route[i] = m;
  }
  for (int g = 0; g < G; ++g) job.group_of_expert[job.group_expert[g]] = -1;

  // Tokens without routes are zero; pass 2 skips them.
  for (int t = 0; t < T; ++t) {
    bool any = false;
    for (int r = 0; r < k; ++r) any |= task.ids[t * k + r] >= 0;
    if (!any) std::memset(y + static_cast<size_t>(t) * H, 0, sizeof(uint16_t) * H);
  }

  job.inter = inter_.data();
  job.inter_stride = inter_stride_;
  job.prep = L.fmt->inter_prep_bytes() ? inter_prep_.data() : nullptr;
  job.prep_stride = prep_stride_;
  job.scratch = worker_scratch_.data();
  job.scratch_stride = worker_stride_;
  if (!unit_rows1_) job.rows1 = pass1_rows_for(L.rows1, L.prep_rows, job.I, G, pool_.num_threads());
  job.nblk1 = (job.I + job.rows1 - 1) / job.rows1;
  if (job.prep) {
    job.nprep = (job.I + job.prep_rows - 1) / job.prep_rows;
    const size_t need = static_cast<size_t>(G) * job.nprep;
    if (job.prep_done_size < need) {
      job.prep_done = std::make_unique<Counter[]>(need);
      job.prep_done_size = need;
    }
    // Published to the workers by the pool's release of the job.
    for (size_t i = 0; i < need; ++i) job.prep_done[i].store(0, std::memory_order_relaxed);
  }
  job.n1 = static_cast<uint32_t>(G) * job.nblk1;
  job.rows2 = L.rows2_fixed ? L.rows2 : pass2_rows_for(L.rows2, H, G, pool_.num_threads());
  job.nblk2 = (H + job.rows2 - 1) / job.rows2;
  // Quarters of the last group's blocks, else halves, where they keep to the format's unit rows
  // (pass2_rows), or to 32 rows where the blocks are above those (there are units enough, and the
  // parts are only the run's tail): quarters took q4_0's tail on 16 threads of the GPU machine's Xeon
  // from 3.2-5.8 to 1.8-2.3 us a step in one VM (docs/benchmarks.md, nineteenth session); the 32-row
  // floor gives the formats of 64-row units (mxfp4, nvfp4, ds_fp4) quarters of 128-row blocks too.
  job.split2 = 1;
  const int part_rows = job.rows2 > L.rows2 ? std::min(L.rows2, 32) : L.rows2;
  for (int parts : {4, 2}) {
    if (!L.rows2_fixed && job.rows2 % (parts * part_rows) == 0) {
      job.split2 = parts;
      break;
    }
  }
  job.vals = vals_.data();
  job.vals_stride = H;
  if (job.group_done_size < static_cast<size_t>(G)) {
    job.group_done = std::make_unique<Counter[]>(G);
    job.group_done_size = G;
  }
  if (job.block_done_size < static_cast<size_t>(job.nblk2)) {
    job.block_done = std::make_unique<Counter[]>(job.nblk2);
    job.block_done_size = job.nblk2;
  }
  // Published to the workers by the pool's release of the job.
  for (int g = 0; g < G; ++g) job.group_done[g].store(0, std::memory_order_relaxed);
  for (int b = 0; b < job.nblk2; ++b) job.block_done[b].store(0, std::memory_order_relaxed);
  const uint32_t n2 = static_cast<uint32_t>(G - 1 + job.split2) * job.nblk2;
  pool_.run(job.n1, n2, &job);
}

PoolProfile MoeExecutor::pool_profile() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  PoolProfile p = pool_.profile();
  for (int w = 0; w < pool_.num_threads(); ++w) p.chain_links += job_->links[w].v;
  return p;
}

void MoeExecutor::reset_pool_profile() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  pool_.reset_profile();
  for (int w = 0; w < pool_.num_threads(); ++w) job_->links[w].v = 0;
}

double MoeExecutor::read_bandwidth_gbs(size_t bytes, int passes, bool huge_pages) {
  if (passes < 1) throw Error("passes must be >= 1");
  const size_t chunk = 256 * 1024;
  const size_t chunks = std::max<size_t>(1, bytes / chunk);
  std::lock_guard<std::mutex> lock(run_mutex_);
  const Pages pages = huge_pages ? Pages::huge : Pages::small;
  if (bw_buffer_.size() < chunks * chunk || bw_buffer_.pages() != pages) {
    bw_buffer_.resize(chunks * chunk, pages);
    uint8_t* p = bw_buffer_.data();
    for (size_t i = 0; i < chunks * chunk; i += 64) p[i] = static_cast<uint8_t>(i >> 6);
  }
  AlignedBuffer<uint64_t> sinks(static_cast<size_t>(pool_.num_threads()) * 8);
  ReadJob job;
  job.data = bw_buffer_.data();
  job.chunk = chunk;
  job.isa = isa_;
  job.sinks = sinks.data();
  pool_.run(static_cast<uint32_t>(chunks), 0, &job);  // warm: fault in, wake workers
  const auto t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < passes; ++p) pool_.run(static_cast<uint32_t>(chunks), 0, &job);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile uint64_t sink = 0;
  for (int w = 0; w < pool_.num_threads(); ++w) sink = sink ^ sinks.data()[w * 8];
  (void)sink;
  return static_cast<double>(chunks * chunk) * passes / secs / 1e9;
}

}  // namespace ft
