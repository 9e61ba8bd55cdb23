// What the vCPUs of this machine are: their clock against the TSC (alone and with every vCPU busy),
// whether any two of them share a core (SMT siblings that a VM's topology hides), and how many 512-bit
// instructions of the kinds the int8 kernels run one of them retires a cycle. A developer tool (not
// part of the package); scripts/gpu-check runs it into machine.log, because the GPU machine's VMs
// differ: in session 33 one ran each vCPU at about twice the rate of the VMs of sessions 25-32, and
// the formats' ratios at 16 threads with it (docs/benchmarks.md, thirty-third session).
//
//   cd packages/ft-kernels-cpu
//   g++ -O2 -std=c++17 -pthread -o /tmp/vcpu_probe tools/vcpu_probe.cpp
//   /tmp/vcpu_probe [windows, default 200]
//
// Output, one fact a line:
//   vcpus N; cpu family F model M (CPUID's display values); tsc_ghz G
//   clock alone|busy cpu C: A / B   core cycles per TSC tick: a chain of dependent adds (one a cycle)
//                                   timed in windows of 100k; A from the fastest window (the clock),
//                                   B from the median one (below A: the vCPU did not run all the time)
//   smt cpu 0 + cpu K: R            VPADDD (any of the vector ALUs) on vCPU 0 beside the same loop on
//                                   vCPU K, over its rate alone: ~1 for separate cores, ~0.5 where the
//                                   two share one core (SMT siblings the VM does not show; the 2-core
//                                   dev box's two vCPUs did at times, their clock windows both at
//                                   half), in between where the host runs other work on them (AVX2
//                                   loop where there is no AVX-512)
//   rate OP: X                      512-bit OPs retired a cycle on vCPU 0, 12 independent chains
//                                   (AVX-512 VNNI, VBMI and GFNI CPUs only)
// Exit status 2 on a machine that is not x86-64.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the merge source of their unmasked forms,
// which -Wmaybe-uninitialized reports at every use; the tests build this file with -Werror.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <x86intrin.h>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// fn(i) on cpus[i], one thread each, all released together.
void on_cpus(const std::vector<int>& cpus, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back([&, i] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i], &set);
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
      ready.fetch_add(1);
      while (!go.load()) _mm_pause();
      fn(static_cast<int>(i));
    });
  }
  while (ready.load() < static_cast<int>(cpus.size())) _mm_pause();
  go.store(true);
  for (auto& t : threads) t.join();
}

constexpr int kWindowAdds = 100000;

// TSC ticks of each of n windows of kWindowAdds dependent adds.
std::vector<double> add_windows(int n) {
  std::vector<double> w(n);
  uint64_t x = 1;
  for (int i = 0; i < n; ++i) {
    const uint64_t t0 = __rdtsc();
    for (int j = 0; j < kWindowAdds; ++j) asm volatile("add $1, %0" : "+r"(x));
    w[i] = static_cast<double>(__rdtsc() - t0);
  }
  return w;
}

void print_clock(const char* what, int cpu, std::vector<double> w) {
  std::sort(w.begin(), w.end());
  std::printf("clock %s cpu %d: %.3f / %.3f\n", what, cpu, kWindowAdds / w.front(), kWindowAdds / w[w.size() / 2]);
}

// FT_PROBE_CHAINS(name, tgt, V, init, expr): double name(int iters), the ops a TSC tick of expr
// (in x, the chain's register) on 12 independent registers, the best of 30 timings of `iters` rounds.
// A macro, not a template over a lambda: a lambda does not take its caller's target attribute.
#define FT_PROBE_CHAINS(name, tgt, V, init, expr)                                                \
  __attribute__((target(tgt))) double name(int iters) {                                             \
    V a[12];                                                                                         \
    for (V& v : a) v = init;                                                                         \
    V a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5];                              \
    V a6 = a[6], a7 = a[7], a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];                          \
    double best = 1e30;                                                                              \
    for (int r = 0; r < 30; ++r) {                                                                   \
      const uint64_t t0 = __rdtsc();                                                                 \
      for (int it = 0; it < iters; ++it) {                                                           \
        { V& x = a0; x = expr; } { V& x = a1; x = expr; } { V& x = a2; x = expr; }                  \
        { V& x = a3; x = expr; } { V& x = a4; x = expr; } { V& x = a5; x = expr; }                  \
        { V& x = a6; x = expr; } { V& x = a7; x = expr; } { V& x = a8; x = expr; }                  \
        { V& x = a9; x = expr; } { V& x = a10; x = expr; } { V& x = a11; x = expr; }                \
        /* every chain live in a register: none folded away, none spilled */                        \
        asm volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));               \
        asm volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));             \
      }                                                                                              \
      best = std::min(best, static_cast<double>(__rdtsc() - t0));                                    \
    }                                                                                                \
    return 12.0 * iters / best;                                                                      \
  }

#define FT_AVX512 "avx512f,avx512bw,avx512vnni,avx512vbmi,gfni"
// Operands: b, c bytes 1..8; index vectors of 1s; floats normal (a denormal operand would time the
// microcode assists instead); fp16 1.0 pairs for the conversion.
#define B512 _mm512_set1_epi32(0x01020304)
#define C512 _mm512_set1_epi32(0x05060708)
#define ONES512 _mm512_set1_epi32(1)
#define F1 _mm512_set1_ps(1.f)
FT_PROBE_CHAINS(paddd_avx2, "avx2", __m256i, _mm256_set1_epi32(1), _mm256_add_epi32(x, _mm256_set1_epi32(3)))
FT_PROBE_CHAINS(paddd_avx512, FT_AVX512, __m512i, ONES512, _mm512_add_epi32(x, B512))
FT_PROBE_CHAINS(r_dpbusd, FT_AVX512, __m512i, B512, _mm512_dpbusd_epi32(x, B512, C512))
FT_PROBE_CHAINS(r_srlw, FT_AVX512, __m512i, B512, _mm512_srli_epi16(x, 1))
FT_PROBE_CHAINS(r_gfni, FT_AVX512, __m512i, B512, _mm512_gf2p8affine_epi64_epi8(x, C512, 0))
FT_PROBE_CHAINS(r_permb, FT_AVX512, __m512i, B512, _mm512_permutexvar_epi8(x, C512))
FT_PROBE_CHAINS(r_permt2d, FT_AVX512, __m512i, B512, _mm512_permutex2var_epi32(x, ONES512, C512))
FT_PROBE_CHAINS(r_permt2w, FT_AVX512, __m512i, B512, _mm512_permutex2var_epi16(x, ONES512, C512))
FT_PROBE_CHAINS(r_permps, FT_AVX512, __m512, F1, _mm512_permutexvar_ps(ONES512, x))
FT_PROBE_CHAINS(r_cvtph, FT_AVX512, __m512i, _mm512_set1_epi32(0x3c003c00),
                _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(x))))
FT_PROBE_CHAINS(r_cvtdq, FT_AVX512, __m512i, ONES512, _mm512_castps_si512(_mm512_cvtepi32_ps(x)))
FT_PROBE_CHAINS(r_fma, FT_AVX512, __m512, F1, _mm512_fmadd_ps(x, F1, _mm512_setzero_ps()))
FT_PROBE_CHAINS(r_maddubs, FT_AVX512, __m512i, B512, _mm512_maddubs_epi16(x, C512))
FT_PROBE_CHAINS(r_maddwd, FT_AVX512, __m512i, B512, _mm512_madd_epi16(x, C512))
FT_PROBE_CHAINS(r_dpwssd, FT_AVX512, __m512i, B512, _mm512_dpwssd_epi32(x, B512, C512))
FT_PROBE_CHAINS(r_packs, FT_AVX512, __m512i, B512, _mm512_packs_epi32(x, C512))

bool has_avx512_int8() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("gfni");
}

double paddd(int iters) { return has_avx512_int8() ? paddd_avx512(iters) : paddd_avx2(iters); }

// 512-bit ops a core cycle of each instruction the int8 kernels lean on.
void rates(double cycles_per_tick) {
  struct Row {
    const char* name;
    double (*f)(int);
  } rows[] = {{"vpdpbusd", r_dpbusd}, {"vpaddd", paddd_avx512}, {"vpsrlw", r_srlw},
              {"vgf2p8affineqb", r_gfni}, {"vpermb", r_permb}, {"vpermt2d", r_permt2d},
              {"vpermt2w", r_permt2w}, {"vpermps", r_permps}, {"vcvtph2ps", r_cvtph},
              {"vcvtdq2ps", r_cvtdq}, {"vfmadd", r_fma},
              {"vpmaddubsw", r_maddubs}, {"vpmaddwd", r_maddwd}, {"vpdpwssd", r_dpwssd},
              {"vpackssdw", r_packs}};
  for (const Row& r : rows) std::printf("rate %s: %.2f\n", r.name, r.f(2000) / cycles_per_tick);
}

}  // namespace

int main(int argc, char** argv) {
  const int windows = argc > 1 ? std::atoi(argv[1]) : 200;
  if (windows < 1) {
    std::fprintf(stderr, "vcpu_probe: windows must be >= 1, got '%s'\n", argv[1]);
    return 2;
  }
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty()) {
    std::fprintf(stderr, "vcpu_probe: sched_getaffinity failed\n");
    return 2;
  }
  std::printf("vcpus %zu\n", cpus.size());
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {  // display family and model, as /proc/cpuinfo gives them
    const unsigned family = (eax >> 8 & 0xf) + ((eax >> 8 & 0xf) == 0xf ? (eax >> 20 & 0xff) : 0);
    const unsigned model = (eax >> 4 & 0xf) | ((family == 6 || family >= 15) ? (eax >> 12 & 0xf0) : 0);
    std::printf("cpu family %u model %u\n", family, model);
  }
  {
    const auto c0 = Clock::now();
    const uint64_t t0 = __rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t t1 = __rdtsc();
    std::printf("tsc_ghz %.3f\n", (t1 - t0) / std::chrono::duration<double>(Clock::now() - c0).count() / 1e9);
  }
  double first = 0;
  for (size_t i = 0; i < cpus.size(); ++i) {
    std::vector<double> w;
    on_cpus({cpus[i]}, [&](int) { w = add_windows(windows); });
    if (i == 0) first = kWindowAdds / *std::min_element(w.begin(), w.end());
    print_clock("alone", cpus[i], w);
  }
  std::vector<std::vector<double>> busy(cpus.size());
  on_cpus(cpus, [&](int i) { busy[i] = add_windows(windows); });
  for (size_t i = 0; i < cpus.size(); ++i) print_clock("busy", cpus[i], busy[i]);

  const int iters = 20000;
  double alone = 0;
  on_cpus({cpus[0]}, [&](int) { alone = paddd(iters); });
  for (size_t k = 1; k < cpus.size(); ++k) {
    double mine = 0;
    on_cpus({cpus[0], cpus[k]}, [&](int i) {
      const double r = paddd(iters);
      if (i == 0) mine = r;
    });
    std::printf("smt cpu %d + cpu %d: %.2f\n", cpus[0], cpus[k], mine / alone);
  }
  if (has_avx512_int8()) on_cpus({cpus[0]}, [&](int) { rates(first); });
  return 0;
}

#else
int main() {
  std::fprintf(stderr, "vcpu_probe: x86-64 only\n");
  return 2;
}
#endif
