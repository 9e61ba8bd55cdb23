// Software prefetch of a weight stream, shared by every format's row kernels.
//
// The rows of one kernel call are one stream (contiguous when the row stride equals the row bytes),
// read in address order. Lines are requested `dist` bytes ahead of the read position, never past the
// end of the stream (prefetches never fault, but stay inside the stream anyway); the stream's first
// `dist` bytes are requested at once, since the hardware prefetchers have nothing to follow yet at
// the start of a stream (and those of Intel cores stop at 4 KiB pages). dist = 0 disables
// (MoeParams::prefetch, MoeFormat::prefetch_bytes).
//
// Two levels (t_prefetch_near > 0): the line `dist` ahead goes to L2 whatever the stream's hint, and
// the line t_prefetch_near ahead to L1. An L1 prefetch holds one of a core's few L1 fill buffers until
// its line arrives from DRAM; on a 2-core Xeon whose cores each read DRAM at ~15 GB/s, 8 KiB of them
// in flight left a core that also decodes streaming at about the sum of its compute and memory time,
// and two levels took batch 1 from ~0.6 to 0.77-0.81 of the read bandwidth (fp8_block, q4_0, gguf).
// On the GPU machine's 16-core Xeon they helped at 2 threads, and at 8 and 16 threads cost the
// quantized formats up to 0.05 while bf16 gained. The executor picks per layer
// (FT_CPU_MOE_PREFETCH_L1, MoeFormat::two_level_prefetch_any_pool, MoeExecutor's
// layer_prefetch_l1_bytes; docs/benchmarks.md, tenth session).
//
// Chains (StreamChain, set by the executor for the units a worker runs unless FT_CPU_MOE_CHAIN=0): a
// worker's weight streams, unit after unit, are one stream to the memory system. A stream that is an entry of the chain, whole
// (its begin and end), goes on requesting lines past its end into the next entry at the same distance,
// and that entry skips the burst of its first `dist` bytes, which its predecessor requested. Without
// it each stream starts from DRAM's latency and its last `dist` bytes drain the core's requests; on
// the GPU machine's Xeon a probe of 16 threads reading 32-128 KiB units with ~16 cycles of compute per
// line went from 0.81-0.91 to 0.87-0.96 of the read bandwidth (tools/stream_probe.cpp, `t0-cont`).
//
// StreamPrefetch is stateless and passed by const reference into the kernels: ahead(p) once per
// 64-byte line read at p (bf16, fp8_block, nvfp4, mxfp4, ds_fp4), or ahead_block<N>(p) once per
// block of N bytes read at p (ggml's types: 4 blocks of Q4_0 or MXFP4, a super-block of Q4_K or Q6_K,
// 4 rows' worth, fp16 runs). A stateful cursor that requested only the lines not requested yet was
// removed in the twentieth session: its refill branch, taken at a cadence set by the block size, was
// mispredicted often enough to cost q4_0's avx2 rows 15-30% of their time from cache on Zen 3
// (docs/benchmarks.md).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common.h"

namespace ft {

// Which cache a software prefetch fills. L1 (_MM_HINT_T0) unless a format measured better with L2
// (_MM_HINT_T1; the FP4 formats, see fp4_kernels.cpp). Off x86 both are __builtin_prefetch's default.
enum class PrefetchHint { L1, L2 };

// Every helper that issues a prefetch is always inlined into its kernel. GCC counts a prefetch as no
// side effect, so a helper left out of line whose only effect is a prefetch (ahead_by, say) was found
// "pure" by its pure-const analysis and every call of it deleted as dead code: until the twenty-ninth
// session (probably from the twentieth's stateless StreamPrefetch) the row kernels of the ggml types,
// q4_0, nvfp4, fp8_block and others issued no prefetch in their loops at all, only the bursts of the
// constructor (GCC 12 at -O2/-O3; docs/benchmarks.md, twenty-ninth session).
// tests/ft_kernels_cpu/test_stream_prefetch.py compiles a call of each helper out of line and checks
// that the prefetch instructions are there.
#define FT_PREFETCH_INLINE inline __attribute__((always_inline))

// FT_PREFETCH_TRACE(address, into_l2), when defined before this header, sees every request (the
// tests' check of the request pattern: tests/ft_kernels_cpu/test_stream_prefetch.py).
template <PrefetchHint Hint = PrefetchHint::L1>
FT_PREFETCH_INLINE void prefetch_line(const char* q) {
#ifdef FT_PREFETCH_TRACE
  FT_PREFETCH_TRACE(q, Hint == PrefetchHint::L2);
#endif
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

// The executor's settings for the kernels a thread runs (below) are read at every kernel call, so they
// take the initial-exec TLS model: a load at a fixed offset from the thread pointer. In the general
// model of a shared library every read was a call of __tls_get_addr, 6% of a q4_0 decode step in
// cache on the 2-core Zen 5 (docs/benchmarks.md, twenty-eighth session). With it the module's whole
// TLS block must fit the static TLS space that glibc keeps for libraries loaded at run time (512
// bytes by default), so the module's thread-locals are words and pointers, and its other per-thread
// objects live on the heap (ThreadObjects, common.h); tests/ft_kernels_cpu/test_abi_and_errors.py
// keeps the block under 384 bytes.
#define FT_KERNEL_TLS thread_local __attribute__((tls_model("initial-exec")))

// The L1 distance of the two-level scheme for the kernels this thread runs, bytes (0: one level).
// The executor sets it for every unit it runs; only streams prefetching further ahead use it.
inline FT_KERNEL_TLS int t_prefetch_near = 0;
inline int near_distance(int dist) { return t_prefetch_near > 0 && dist > t_prefetch_near ? t_prefetch_near : 0; }

// The least bytes a row must have for the kernels of the avx512_bf16 tier to read several rows side
// by side, sharing x's loads: 4 rows in one-vector calls (q4_0 and ggml's types, nvfp4), 2 rows in
// calls of several vectors (q4_0, nvfp4, fp8_block's bf16 kernels; ds_fp4's bf16 kernels from twice
// these bytes); shorter rows are read one at a time. On a 2-core Zen 5
// several streams of short rows came from DRAM slower than one (qwen3-30b-a3b's down rows of 432-630
// bytes with 2 threads: gguf's Q6_K rows 311 against 266 us a step, q4_0's pass 2 at batch 8 581
// against 421), while rows of 1152 bytes gained (q4_0's gate/up rows, one vector: 428 against 464 us;
// docs/benchmarks.md, twenty-second session). The executor sets it for every unit it runs
// (MoeExecutor::multirow_min_bytes, $FT_CPU_MOE_MULTIROW_BYTES); outside the executor the default holds.
// Calls of one vector and calls of several have a bound each (the 4-row and the 2-row kernels).
constexpr int kMultirowMinBytes = 1024;
inline FT_KERNEL_TLS int t_multirow_min_bytes = kMultirowMinBytes;          // calls of one vector
inline FT_KERNEL_TLS int t_multirow_several_min_bytes = kMultirowMinBytes;  // calls of several
inline bool multirow(size_t row_bytes, int vectors) {
  return row_bytes >= static_cast<size_t>(vectors > 1 ? t_multirow_several_min_bytes : t_multirow_min_bytes);
}

// Gate and up rows in slices (MoeExecutor::gate_up_slice_bytes, $FT_CPU_MOE_GATE_UP_SLICE). The pass-1
// calls of one vector of the formats that keep gate and up rows apart (bf16, fp8_block, nvfp4, ds_fp4,
// q4_0, gguf) read their gate rows and their up rows in turns of about this many bytes each, so that a
// core has two weight streams, rows apart by the intermediate size, in flight at once; 0 reads all the
// call's gate rows, then all its up rows. On a 2-core Zen 5 one core read two interleaved streams of
// rows faster than one from DRAM, in turns of up to 4 KiB (turns of 8 KiB and more: as one stream), and
// only when they lay far enough apart (docs/benchmarks.md, twenty-seventh session). gguf's Q4_0 and
// K-quant gate/up rows (so q4_0's) take turns at their finest wherever this is above 0, and wherever
// their rows are too short for multirow: gate row r and up row r side by side in one call
// (TypeInfo::q8_gate_up, twenty-eighth and twenty-ninth sessions). The executor sets it
// for every unit it runs; outside the executor it is 0.
inline FT_KERNEL_TLS int t_gate_up_slice_bytes = 0;

// Rows [0, rows) of a gate block and of its up block, each row_bytes long, against `vectors` vectors,
// as f(r0, n, up): for one vector in slices of as many whole rows as t_gate_up_slice_bytes holds,
// gate slice then up slice; for several, or where it holds none (0, or rows longer than that), all
// gate rows, then all up rows.
template <class F>
inline void gate_up_slices(int rows, size_t row_bytes, int vectors, F&& f) {
  const size_t turn = static_cast<size_t>(t_gate_up_slice_bytes);
  const int slice = vectors == 1 && turn >= row_bytes ? static_cast<int>(turn / row_bytes) : rows;
  if (slice >= rows) {
    f(0, rows, false);
    f(0, rows, true);
    return;
  }
  for (int r = 0; r < rows; r += slice) {
    const int n = std::min(slice, rows - r);
    f(r, n, false);
    f(r, n, true);
  }
}

// Bytes from the first row of a call to the end of its last: nrows rows of row_bytes, ld bytes apart.
inline size_t rows_stream_bytes(size_t ld, int nrows, size_t row_bytes) {
  return nrows > 0 ? static_cast<size_t>(nrows - 1) * ld + row_bytes : 0;
}

// The weight streams of the unit a worker runs, then those of the unit it runs next, in the order its
// kernels read them (MoeFormat::unit_streams; empty outside the executor's units).
struct StreamChain {
  static constexpr int kMax = 16;
  int n = 0;
  const char* begin[kMax];
  const char* end[kMax];
  // The head of the entry that the stream running now will prefetch into: the first stream
  // constructed with this begin skips its burst.
  const char* warm_head = nullptr;
  uint64_t linked = 0;  // streams linked to a successor since the executor last collected them
  // A unit's chain: its streams and its successor's. warm_head stays when the unit was claimed
  // during the previous one (whose last stream requested this unit's head), else it is reset.
  void start(bool head_requested) {
    n = 0;
    if (!head_requested) warm_head = nullptr;
  }
  void add(const void* p, size_t bytes) {
    if (n < kMax && bytes) {
      begin[n] = static_cast<const char*>(p);
      end[n] = begin[n] + bytes;
      ++n;
    }
  }
};
// This thread's chain: on the heap (ThreadObjects, common.h), made at its first use and freed when the
// thread ends; the pointer to it is an initial-exec word, read at every stream.
inline FT_KERNEL_TLS StreamChain* t_chain_ptr = nullptr;
inline StreamChain& thread_chain() {
  StreamChain* c = t_chain_ptr;
  if (__builtin_expect(c == nullptr, 0)) c = t_chain_ptr = &ThreadObjects::get<StreamChain>();
  return *c;
}

// Links the stream [b, e) into this thread's chain: its successor (*sb, *se; null when none) and
// whether its predecessor is requesting its head (then it skips the burst of its first bytes).
inline bool chain_link(const char* b, const char* e, const char** sb, const char** se) {
  StreamChain& c = thread_chain();
  // Only inside a chained unit (n > 0): a head left from another job's units never skips a burst.
  const bool warm = c.n > 0 && c.warm_head != nullptr && c.warm_head == b;
  *sb = *se = nullptr;
  if (warm) c.warm_head = nullptr;
  for (int i = 0; i + 1 < c.n; ++i) {
    if (c.begin[i] == b && c.end[i] == e) {
      *sb = c.begin[i + 1];
      *se = c.end[i + 1];
      c.warm_head = *sb;
      ++c.linked;
      break;
    }
  }
  return warm;
}

// Bytes at the end of a warm head's first `dist` that a predecessor may not have reached (its last
// request lies up to a read block short of its end): requested again by the successor.
constexpr size_t kWarmSlack = 512;

template <PrefetchHint Hint = PrefetchHint::L1>
struct StreamPrefetch {
  const char* end = nullptr;  // one past the last byte of the stream
  int dist = 0;               // bytes ahead; 0 disables
  int near = 0;               // two-level: the L1 prefetch's distance (0: one level)
  const char* succ = nullptr;      // the next stream of this thread's chain (thread_chain()), or null
  const char* succ_end = nullptr;

  StreamPrefetch() = default;
  // The stream [begin, begin + bytes); its first `dist` bytes are requested here, unless its
  // predecessor in the chain requests them. A stream shorter than `dist` also requests its
  // successor's first dist - bytes here: its own reads reach only that far into the successor, which
  // skips its head.
  StreamPrefetch(const void* begin, size_t bytes, int d)
      : end(static_cast<const char*>(begin) + bytes),
        dist(d),
        near(near_distance(d)) {
    if (!dist) return;
    const char* q = static_cast<const char*>(begin);
    if (chain_link(q, end, &succ, &succ_end)) q += dist > static_cast<int>(kWarmSlack) ? dist - kWarmSlack : 0;
    for (const char* e = std::min(end, static_cast<const char*>(begin) + dist); q < e; q += 64) far_line<Hint>(q);
    if (succ && bytes < static_cast<size_t>(dist)) {
      for (const char *s = succ, *e = std::min(succ_end, succ + (dist - bytes)); s < e; s += 64) far_line<Hint>(s);
    }
  }
  // Called once per 64-byte line read at `p`: requests the line `dist` bytes ahead, within the stream
  // (and, two-level, the line `near` ahead into L1). H: the cache of the far line, the stream's own by
  // default (a kernel may override it); two-level, the far line always goes to L2.
  template <PrefetchHint H = Hint>
  FT_PREFETCH_INLINE void ahead(const void* p) const {
    ahead_by<H>(p, dist);
  }
  // The same with the far line `lead` bytes ahead in place of dist (lead >= dist): for kernels that
  // read several rows side by side, whose own rows would otherwise lie within dist of each other.
  template <PrefetchHint H = Hint>
  FT_PREFETCH_INLINE void ahead_by(const void* p, size_t lead) const {
    const char* q = static_cast<const char*>(p) + lead;
    if (q < end) {
      far_line<H>(q);
    } else if (succ) {  // past the end: the chain's next stream, as far ahead
      const char* s = succ + (q - end);
      if (s < succ_end) far_line<H>(s);
    }
    if (near) {
      const char* n = static_cast<const char*>(p) + near;
      if (n < end) prefetch_line<PrefetchHint::L1>(n);
    }
  }
  // A block of N bytes read at p, for kernels whose blocks are not whole lines (ggml's blocks, 18 to
  // 840 bytes a call): ceil(N / 64) requests at p, p + 64, ..., each moved `dist` ahead. With the
  // blocks read back to back, every line of the stream is requested (some twice; a last partial
  // line may not be), the same number of requests a block: no branch on how the lines fall.
  template <int N>
  FT_PREFETCH_INLINE void ahead_block(const void* p) const {
    const char* q = static_cast<const char*>(p);
    for (int o = 0; o < N; o += 64) ahead(q + o);
  }
  // Every line of [p, p + n) moved `dist` ahead.
  FT_PREFETCH_INLINE void ahead_range(const void* p, size_t n) const {
    if (!dist) return;
    const char* q = static_cast<const char*>(p);
    for (size_t o = 0; o < n; o += 64) ahead(q + o);
  }

 private:
  template <PrefetchHint H>
  FT_PREFETCH_INLINE void far_line(const char* q) const {
    if (near) {
      prefetch_line<PrefetchHint::L2>(q);
    } else {
      prefetch_line<H>(q);
    }
  }
};

}  // namespace ft
