// Shared pieces of the CPU MoE kernels: ISA tiers, bf16 conversion, aligned scratch, errors.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define FT_X86 1
#include <immintrin.h>
#else
#define FT_X86 0
#endif

// Each kernel tier is compiled with its own target attribute; nothing in the wheel assumes more
// than the baseline ISA of the build target.
#if FT_X86
#define FT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
// The top tier: AVX512-BF16 (VDPBF16PS), AVX512-VNNI (VPDPBUSD, for int8-activation paths),
// AVX512-VBMI (VPERMB: nibble lookups without masking) and GFNI (GF2P8AFFINEQB: the high nibbles of
// bytes in one instruction).
#define FT_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi,gfni,fma")))

// FT_IN_REGISTER(v): the vector variable v (just loaded) is used from a register from here on. GCC
// otherwise folds one of a loaded vector's uses back into its instruction as a memory operand
// (`vpsrlw $4, (w)` beside the VPERMB of the register loaded from w), so a step's weights were read
// from L1 twice. On Zen 4, whose core loads one 512-bit vector a cycle, mxfp4's one-vector rows of
// K = 2048 ran from L1 at 31.7 GB/s with the second load and 36.1 without it where the bank starts 16
// bytes past a cache line (as numpy's arrays do), 36.7 and 37.5 where it starts on one
// (tools/row_stream_probe.cpp; docs/benchmarks.md, thirty-fourth session). An empty asm statement:
// no instruction.
#define FT_IN_REGISTER(v) asm("" : "+v"(v))
#endif

namespace ft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Ordered lowest to highest; a higher tier may use every instruction of a lower one.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };
constexpr int kNumIsa = 4;

const char* isa_name(Isa isa);
Isa isa_from_name(const std::string& name, const char* what);
// Highest tier the CPU and OS support (CPUID + XGETBV).
Isa cpu_best_isa();
// True on GenuineIntel CPUs (some tuning defaults differ by vendor: bf16.cpp, fp4_kernels.cpp,
// ds_fp4_kernels.cpp).
bool cpu_is_intel();
// True on AMD CPUs of family 0x1A (Zen 5) or later ("AuthenticAMD", CPUID leaf 1's family with its
// extended family): defaults measured on Zen 5 (executor.cpp).
bool cpu_is_amd_zen5_or_later();
// True when AMX-TILE and AMX-BF16 can run in this process: CPUID, the OS's XCR0 tile state and, on
// Linux, the permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked for once here).
bool cpu_amx_bf16();
// Tier to use: `requested` if not empty, else $FT_CPU_MOE_ISA if set, else the best one. A request
// above what the CPU supports raises.
Isa resolve_isa(const std::string& requested);
// The same rule against a given best tier (what resolve_isa uses; exposed for tests).
Isa resolve_isa(const std::string& requested, Isa best);

// x rounded to the nearest integer, ties to even, for |x| <= 2^22: adding 1.5 * 2^23 leaves no
// fraction bits, so the default rounding mode does the rounding, and subtracting it back is exact
// (NaN stays NaN). std::nearbyint is a libm call that saves and restores the floating-point
// environment: ~10 ns an element on the GPU machine's Xeon, where it made the activation prep of
// mxfp4 and ds_fp4 cost 17-21 us of a decode step.
inline float round_even_small(float x) {
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23
  return (x + kShift) - kShift;
}

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Bytes from one prepared vector (token or route) to the next: `bytes` rounded up to an odd number of
// 64-byte lines, so that the same offset of up to 64 vectors falls in as many L1 sets. Records of
// 4 KiB a vector (H = 2048 in int8 pairs) put one step's records of 8 vectors in one set of Zen 3's
// 8-way 32 KiB L1d, whose 16 lines did not fit it: mxfp4's batch-8 pass 1 from L3 took 771 us a step
// with that stride and 556 with 4 KiB + 64 (docs/benchmarks.md, fifteenth session).
inline size_t vec_stride(size_t bytes) { return ((bytes + 63) / 64 | 1) * 64; }

// Which pages a buffer asks Linux for: whatever the THP policy gives (any), transparent huge pages
// (madvise MADV_HUGEPAGE, 2 MiB aligned), or 4 KiB pages (MADV_NOHUGEPAGE).
enum class Pages { any, huge, small };
// madvise(p, bytes, MADV_HUGEPAGE / MADV_NOHUGEPAGE) before the first touch; throws where the system
// has no transparent huge pages.
inline void advise_pages(void* p, size_t bytes, Pages pages) {
  if (pages == Pages::any) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  const int advice = pages == Pages::huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE;
  if (madvise(p, bytes, advice) != 0) {
    throw Error(std::string("madvise(") + (pages == Pages::huge ? "MADV_HUGEPAGE" : "MADV_NOHUGEPAGE") +
                ") failed (" + std::strerror(errno) + "): this kernel offers no transparent huge pages");
  }
#else
  (void)p;
  (void)bytes;
  throw Error("choosing huge or small pages needs Linux's madvise(MADV_HUGEPAGE / MADV_NOHUGEPAGE)");
#endif
}

// Frees an AlignedBuffer's memory: std::free, or munmap of the mapping it was placed in (pages chosen).
struct AlignedFree {
  void* map = nullptr;  // the mapping's first byte, where the buffer has one
  size_t map_bytes = 0;
  void operator()(void* p) const {
#if defined(__linux__)
    if (map != nullptr) {
      munmap(map, map_bytes);
      return;
    }
#endif
    std::free(p);
  }
};

#if FT_X86
// Sum of the 8 lanes of an AVX register (a fixed order: results do not depend on the caller).
FT_TARGET_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Largest of the 8 lanes of an AVX register holding no NaN.
FT_TARGET_AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
#endif

// 64-byte aligned, zero-initialised scratch of `count` elements of T. resize(count, Pages::huge) places
// it on transparent huge pages instead (2 MiB aligned, whole 2 MiB pages, asked for before the first
// touch; whether the kernel grants them follows its THP policy and free memory), Pages::small on 4 KiB
// pages.
template <typename T>
class AlignedBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { resize(count); }
  void resize(size_t count, Pages pages = Pages::any) {
    if (count <= count_ && pages == pages_) return;
    if (pages == Pages::any) {
      const size_t bytes = std::max<size_t>((count * sizeof(T) + 63) / 64 * 64, 64);
      void* p = std::aligned_alloc(64, bytes);
      if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes of scratch");
      std::memset(p, 0, bytes);
      ptr_ = std::unique_ptr<void, AlignedFree>(p, AlignedFree{});
    } else {
      // a mapping of its own, asked for its pages before any is touched (memory reused from the
      // allocator could already sit on pages of the other kind)
      const size_t bytes = std::max<size_t>((count * sizeof(T) + kHugePage - 1) / kHugePage * kHugePage, kHugePage);
#if defined(__linux__)
      const size_t map_bytes = bytes + kHugePage;
      void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw Error("out of memory mapping " + std::to_string(map_bytes) + " bytes of scratch");
      const uintptr_t a = reinterpret_cast<uintptr_t>(m);
      void* p = reinterpret_cast<void*>((a + kHugePage - 1) / kHugePage * kHugePage);
      std::unique_ptr<void, AlignedFree> owner(p, AlignedFree{m, map_bytes});
      advise_pages(p, bytes, pages);
      std::memset(p, 0, bytes);
      ptr_ = std::move(owner);
#else
      (void)bytes;
      advise_pages(nullptr, 0, pages);  // throws: no way to choose pages here
#endif
    }
    count_ = count;
    pages_ = pages;
  }
  Pages pages() const { return pages_; }
  T* data() { return static_cast<T*>(ptr_.get()); }
  const T* data() const { return static_cast<const T*>(ptr_.get()); }
  size_t size() const { return count_; }

 private:
  std::unique_ptr<void, AlignedFree> ptr_;
  size_t count_ = 0;
  Pages pages_ = Pages::any;
};

// Per-thread objects of the kernels (scratch buffers, the stream chain), each made on the heap at its
// first use on a thread and freed when the thread ends, behind one thread-local vector of owners: the
// module's whole TLS block takes glibc's static TLS reserve for libraries loaded at run time (512 bytes,
// shared with other libraries; stream_prefetch.h), and a thread-local of each such type had made it 424
// bytes with the GPU machine's toolchain (docs/benchmarks.md, thirty-seventh session). T is a type of
// its user's own (one object per thread and type). get() is called once per kernel call, not per row:
// the avx2 tier's pairs kernels, which take their scratch from it every call, ran a qwen3-30b-a3b step
// from cache in the same time either way (one Zen 4 core, 4 alternating rounds: q4_0 127.6 / 127.6 us,
// mxfp4 124.9 / 124.5).
class ThreadObjects {
 public:
  template <class T>
  static T& get() {
    static const size_t slot = next_slot();
    std::vector<Owner>& owners = thread_owners();
    if (__builtin_expect(slot >= owners.size(), 0)) owners.resize(slot + 1);
    Owner& o = owners[slot];
    if (__builtin_expect(!o, 0)) o = Owner(new T(), Deleter{[](void* p) { delete static_cast<T*>(p); }});
    return *static_cast<T*>(o.get());
  }

 private:
  struct Deleter {
    void (*destroy)(void*) = nullptr;
    void operator()(void* p) const { destroy(p); }
  };
  using Owner = std::unique_ptr<void, Deleter>;
  static size_t next_slot() {
    static std::atomic<size_t> next{0};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  static std::vector<Owner>& thread_owners() {
    static thread_local std::vector<Owner> owners;
    return owners;
  }
};

// One scratch buffer per thread for the kernels that derive per-call tables from x (avx2_pairs.h). A
// kernel uses it within one call and calls no other kernel meanwhile.
struct ThreadScratch {
  AlignedBuffer<uint8_t> bytes;
};
inline AlignedBuffer<uint8_t>& thread_scratch() { return ThreadObjects::get<ThreadScratch>().bytes; }

}  // namespace ft
