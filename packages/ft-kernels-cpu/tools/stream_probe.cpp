// How much compute per cache line a core can do while streaming weights from DRAM, and which software
// prefetch keeps the stream going. A developer tool (not part of the package): it answers "at what
// compute per 64-byte line does a 16-thread stream fall below the read bandwidth, and does prefetching
// into L1, into L2, every line or one line per page change that?", which sets what the MoE row kernels
// can afford per byte on a machine.
//
//   g++ -O2 -mavx512f -mavx512bw -pthread -o /tmp/stream_probe packages/ft-kernels-cpu/tools/stream_probe.cpp
//   /tmp/stream_probe [GiB, default 2] [threads, default all] [unit KiB list, default 256]
//
// Every thread takes units of `unit KiB` from a shared counter (as the executor's pool does), reads
// each line with one 64-byte load and then runs W FMAs on it in 4 chains (about W cycles per line;
// W = 0 is the plain read). The unit list (e.g. 256,64,32) runs every size in turn.
// Prefetch modes: none; T0 or T1 on every line D bytes ahead, each unit's first D bytes requested at
// its start (what the MoE kernels do); t0-cont: as T0, but a worker claims its next unit when its
// prefetch reaches the end of the current one and goes on prefetching into the next, so that a
// worker's units read as one stream (no burst at a unit's start but the first). One line per
// (unit, W, mode): GB/s (median of 9 passes) and the ratio to the plain read of 256 KiB units
// measured just before (the executor's read bandwidth uses 256 KiB chunks).
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

enum Mode { kNone, kT0, kT1, kPage, kCont };
const char* mode_name(Mode m) {
  switch (m) {
    case kNone: return "none";
    case kT0: return "t0-line";
    case kT1: return "t1-line";
    case kPage: return "t0-page";
    case kCont: return "t0-cont";
  }
  return "?";
}

// The compute on each line: one add, then W FMAs in 4 chains.
template <int W>
struct Lines {
  __m512 a0 = _mm512_set1_ps(1.f), a1 = a0, a2 = a0, a3 = a0;
  const __m512 c = _mm512_set1_ps(0.999f);
  void line(const char* q) {
    const __m512 v = _mm512_castsi512_ps(_mm512_load_si512(q));
    a0 = _mm512_add_ps(a0, v);
    for (int w = 0; w < W; w += 4) {
      a0 = _mm512_fmadd_ps(a0, c, v);
      a1 = _mm512_fmadd_ps(a1, c, v);
      a2 = _mm512_fmadd_ps(a2, c, v);
      a3 = _mm512_fmadd_ps(a3, c, v);
    }
  }
  float sum() const { return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); }
};

template <int W, Mode M>
__attribute__((noinline)) float stream_unit(const char* p, size_t n, int dist, const char* end) {
  Lines<W> acc;
  if (M != kNone) {  // the first `dist` bytes of the unit at once
    for (const char* q = p; q < std::min(p + dist, end); q += (M == kPage ? 4096 : 64)) {
      _mm_prefetch(q, M == kT1 ? _MM_HINT_T1 : _MM_HINT_T0);
    }
  }
  for (size_t o = 0; o < n; o += 64) {
    const char* q = p + o + dist;
    if (M == kT0 && q < end) _mm_prefetch(q, _MM_HINT_T0);
    if (M == kT1 && q < end) _mm_prefetch(q, _MM_HINT_T1);
    if (M == kPage && q < end && ((reinterpret_cast<uintptr_t>(q) & 4095) == 0)) _mm_prefetch(q, _MM_HINT_T0);
    acc.line(p + o);
  }
  return acc.sum();
}

using Fn = float (*)(const char*, size_t, int, const char*);

struct Shared;
uint64_t claim(Shared* s);
const char* unit_ptr(Shared* s, uint64_t u);

// kCont: the unit at p (n bytes) whose first `dist` bytes were requested by the previous unit unless
// `cold`; claims the next unit when the prefetch reaches p + n and requests its first lines from
// there on. Returns the next unit claimed (>= units: none).
template <int W>
__attribute__((noinline)) float stream_cont(Shared* s, const char* p, size_t n, int dist, bool cold, uint64_t* next) {
  Lines<W> acc;
  if (cold) {
    for (const char* q = p; q < p + std::min<size_t>(dist, n); q += 64) _mm_prefetch(q, _MM_HINT_T0);
  }
  const size_t split = n > static_cast<size_t>(dist) ? n - dist : 0;
  size_t o = 0;
  for (; o < split; o += 64) {
    _mm_prefetch(p + o + dist, _MM_HINT_T0);
    acc.line(p + o);
  }
  *next = claim(s);
  const char* q = unit_ptr(s, *next);
  for (; o < n; o += 64) {
    if (q) _mm_prefetch(q + (o - split), _MM_HINT_T0);
    acc.line(p + o);
  }
  return acc.sum();
}
using ContFn = float (*)(Shared*, const char*, size_t, int, bool, uint64_t*);

template <int W>
Fn pick_mode(Mode m) {
  switch (m) {
    case kNone: return stream_unit<W, kNone>;
    case kT0: return stream_unit<W, kT0>;
    case kT1: return stream_unit<W, kT1>;
    case kPage: return stream_unit<W, kPage>;
    case kCont: break;  // a kernel of its own (pick_cont)
  }
  return nullptr;
}

ContFn pick_cont(int w) {
  switch (w) {
    case 0: return stream_cont<0>;
    case 4: return stream_cont<4>;
    case 8: return stream_cont<8>;
    case 12: return stream_cont<12>;
    case 16: return stream_cont<16>;
    case 24: return stream_cont<24>;
    case 32: return stream_cont<32>;
  }
  return nullptr;
}

Fn pick(int w, Mode m) {
  switch (w) {
    case 0: return pick_mode<0>(m);
    case 4: return pick_mode<4>(m);
    case 8: return pick_mode<8>(m);
    case 12: return pick_mode<12>(m);
    case 16: return pick_mode<16>(m);
    case 24: return pick_mode<24>(m);
    case 32: return pick_mode<32>(m);
  }
  return nullptr;
}

struct Shared {
  const char* base = nullptr;
  size_t unit = 0, units = 0;
  std::atomic<uint64_t> next{0};
  std::atomic<int> go{0}, done{0};
  Fn fn = nullptr;
  ContFn cont = nullptr;  // set: kCont
  int dist = 0;
  std::atomic<int> stop{0};
};

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ + DAZ: a subnormal costs Intel cores a microcode assist
}

uint64_t claim(Shared* s) { return s->next.fetch_add(1); }
const char* unit_ptr(Shared* s, uint64_t u) { return u < s->units ? s->base + u * s->unit : nullptr; }

float take_units(Shared* s) {
  float sum = 0;
  if (s->cont) {
    uint64_t u = claim(s);
    bool cold = true;
    while (u < s->units) {
      uint64_t nx = 0;
      sum += s->cont(s, s->base + u * s->unit, s->unit, s->dist, cold, &nx);
      cold = false;
      u = nx;
    }
    return sum;
  }
  for (;;) {
    const uint64_t u = s->next.fetch_add(1);
    if (u >= s->units) return sum;
    const char* p = s->base + u * s->unit;
    sum += s->fn(p, s->unit, s->dist, p + s->unit);
  }
}

// Workers 1..n-1; the main thread is worker 0 (as in the executor's pool), so n threads use n cores.
void worker(Shared* s, int cpu) {
  pin(cpu);
  volatile float sink = 0;
  int seen = 0;
  for (;;) {
    int g;
    while ((g = s->go.load(std::memory_order_acquire)) == seen) {
      if (s->stop.load()) return;
      _mm_pause();
    }
    seen = g;
    sink = sink + take_units(s);
    s->done.fetch_add(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 2.0;
  int threads = argc > 2 ? std::atoi(argv[2]) : static_cast<int>(std::thread::hardware_concurrency());
  std::vector<size_t> unit_list;
  for (const char* a = argc > 3 ? argv[3] : "256"; *a;) {
    char* e = nullptr;
    const long kib = std::strtol(a, &e, 10);
    if (e == a || kib <= 0 || (kib & 3) != 0) {
      std::fprintf(stderr, "stream_probe: unit sizes must be positive multiples of 4 KiB, got '%s'\n", argv[3]);
      return 2;
    }
    unit_list.push_back(static_cast<size_t>(kib) * 1024);
    a = *e == ',' ? e + 1 : e;
  }
  const size_t bytes = static_cast<size_t>(gib * (1 << 30)) / (256 * 1024) * (256 * 1024);
  char* buf = static_cast<char*>(std::aligned_alloc(1 << 21, bytes));
  madvise(buf, bytes, MADV_HUGEPAGE);
  // Normal floats near 1 (the accumulators stay finite and normal; see also FTZ/DAZ in worker).
  float* f = reinterpret_cast<float*>(buf);
  for (size_t i = 0; i < bytes / 4; ++i) f[i] = 1.f + static_cast<float>(i & 255) * (1.f / 4096);

  Shared s;
  s.base = buf;
  std::vector<std::thread> pool;
  pin(0);
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, &s, t);
  volatile float sink = 0;
  auto pass = [&](Fn fn, ContFn cont, size_t unit, int dist) {
    s.unit = unit;
    s.units = bytes / unit;
    s.fn = fn;
    s.cont = cont;
    s.dist = dist;
    s.next.store(0);
    s.done.store(0);
    const auto t0 = std::chrono::steady_clock::now();
    s.go.fetch_add(1, std::memory_order_release);
    sink = sink + take_units(&s);
    while (s.done.load() < threads - 1) _mm_pause();
    return s.units * unit / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  auto median = [&](Fn fn, ContFn cont, size_t unit, int dist) {
    std::vector<double> v;
    pass(fn, cont, unit, dist);
    for (int i = 0; i < 9; ++i) v.push_back(pass(fn, cont, unit, dist));
    std::sort(v.begin(), v.end());
    return v[4];
  };
  std::printf("stream_probe: %.2f GiB, %d threads\n", bytes / double(1 << 30), threads);
  const Mode modes[] = {kNone, kT0, kT1, kCont};
  const int dist = 8192;
  for (size_t unit : unit_list) {
    for (int w : {0, 8, 16}) {
      const double ref = median(pick(0, kNone), nullptr, 256 * 1024, 0);
      for (Mode m : modes) {
        const double g = m == kCont ? median(nullptr, pick_cont(w), unit, dist)
                                    : median(pick(w, m), nullptr, unit, m == kNone ? 0 : dist);
        std::printf("{\"probe\": \"stream\", \"threads\": %d, \"unit_kib\": %zu, \"fma_per_line\": %d, "
                    "\"prefetch\": \"%s\", \"dist\": %d, \"gbs\": %.1f, \"read_gbs\": %.1f, \"ratio\": %.3f}\n",
                    threads, unit / 1024, w, mode_name(m), m == kNone ? 0 : dist, g, ref, g / ref);
        std::fflush(stdout);
      }
    }
  }
  s.stop.store(1);
  for (auto& t : pool) t.join();
  return 0;
}
