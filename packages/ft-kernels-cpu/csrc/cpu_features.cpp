// Run-time ISA tier detection (CPUID + XGETBV) and the FT_CPU_MOE_ISA override.
#include <cstdlib>
#include <string>

#include "common.h"

#if FT_X86
#include <cpuid.h>
#endif
#if FT_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ft {

static const char* const kIsaNames[kNumIsa] = {"scalar", "avx2", "avx512", "avx512_bf16"};

const char* isa_name(Isa isa) { return kIsaNames[static_cast<int>(isa)]; }

Isa isa_from_name(const std::string& name, const char* what) {
  for (int i = 0; i < kNumIsa; ++i) {
    if (name == kIsaNames[i]) return static_cast<Isa>(i);
  }
  throw Error(std::string(what) + "='" + name +
              "' is not an ISA tier; expected one of scalar, avx2, avx512, avx512_bf16");
}

#if FT_X86
static uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Isa cpu_best_isa() {
#if FT_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::scalar;
  const bool osxsave = c & (1u << 27);
  const bool fma = c & (1u << 12);
  const bool f16c = c & (1u << 29);
  if (!osxsave) return Isa::scalar;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::scalar;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
             avx512vl = b & (1u << 31);
  const bool avx512vnni = c & (1u << 11), avx512vbmi = c & (1u << 1), gfni = c & (1u << 8);
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool avx512bf16 = a1 & (1u << 5);

  if (!(ymm_state && avx2 && fma && f16c)) return Isa::scalar;
  if (!(zmm_state && avx512f && avx512dq && avx512bw && avx512vl)) return Isa::avx2;
  // The top tier may use AVX512-BF16, AVX512-VNNI, AVX512-VBMI and GFNI: every CPU with the first
  // has the second; Sapphire Rapids and later and Zen 4 and later have all four, Cooper Lake (BF16
  // without VBMI or GFNI) runs the avx512 tier.
  if (!(avx512bf16 && avx512vnni && avx512vbmi && gfni)) return Isa::avx512;
  return Isa::avx512_bf16;
#else
  return Isa::scalar;
#endif
}

bool cpu_is_intel() {
#if FT_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
#else
  return false;
#endif
}

bool cpu_is_amd_zen5_or_later() {
#if FT_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  if (!(b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u)) return false;  // "Auth" "enti" "cAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const unsigned base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
  return (base == 0xf ? base + ext : base) >= 0x1a;
#else
  return false;
#endif
}

bool cpu_amx_bf16() {
#if FT_X86 && defined(__linux__)
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
    if (!amx_bf16 || !amx_tile) return false;
    if ((read_xcr0() & 0x60000u) != 0x60000u) return false;  // XTILECFG and XTILEDATA state
    // Tile data is off by default for Linux processes; without the permission the first tile
    // instruction raises SIGILL.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

Isa resolve_isa(const std::string& requested) { return resolve_isa(requested, cpu_best_isa()); }

Isa resolve_isa(const std::string& requested, Isa best) {
  std::string name = requested;
  const char* what = "isa";
  if (name.empty()) {
    const char* env = std::getenv("FT_CPU_MOE_ISA");
    if (env == nullptr || *env == '\0') return best;
    name = env;
    what = "FT_CPU_MOE_ISA";
  }
  const Isa isa = isa_from_name(name, what);
  if (static_cast<int>(isa) > static_cast<int>(best)) {
    throw Error(std::string(what) + "='" + name + "' asks for a tier this CPU lacks; its best tier is '" +
                isa_name(best) + "' (a request can only lower the tier)");
  }
  return isa;
}

}  // namespace ft
