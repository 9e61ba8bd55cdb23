// Shared pieces of the CPU MoE kernels: ISA tiers, bf16 conversion, aligned scratch, errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
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

// 64-byte aligned, zero-initialised scratch of `count` elements of T.
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { resize(count); }
  void resize(size_t count) {
    if (count <= count_) return;
    size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes ? bytes : 64);
    if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes of scratch");
    std::memset(p, 0, bytes);
    ptr_.reset(p);
    count_ = count;
  }
  T* data() { return static_cast<T*>(ptr_.get()); }
  const T* data() const { return static_cast<const T*>(ptr_.get()); }
  size_t size() const { return count_; }

 private:
  std::unique_ptr<void, AlignedFree> ptr_;
  size_t count_ = 0;
};

// One scratch buffer per thread for the kernels that derive per-call tables from x (avx2_pairs.h):
// one thread-local for all of them, as the module's TLS block is kept small (stream_prefetch.h). A
// kernel uses it within one call and calls no other kernel meanwhile.
inline AlignedBuffer<uint8_t>& thread_scratch() {
  static thread_local AlignedBuffer<uint8_t> scratch;
  return scratch;
}

}  // namespace ft
