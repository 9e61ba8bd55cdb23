// AMX-BF16 tile helpers shared by the row kernels that use tiles (ds_fp4_amx.cpp, fp8_block.cpp):
// the tile instructions, the tile layout of those kernels and the packing of 2..8 prepared vectors
// into B tiles.
//
// Tiles: 0..3 the C tiles (16 rows x tokens, fp32), 4 and 5 the A tiles (16 weight rows x 32 bf16,
// used alternately), 6 and 7 the B tiles (16 pairs of bf16 x tokens, alternately). One token's B tile
// is 32 consecutive words of its prepared vector read in place (rows of 4 bytes); 2..8 tokens are
// packed 8 to a row (pack_tokens; absent tokens zero).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "common.h"

namespace ft {
namespace amx {

// Vectors per call from which the kernels that have tiles use them: $FT_CPU_MOE_AMX_MIN (1..8;
// default 4: on the GPU machine's Xeon the tiles cost the same for 1 to 8 vectors, twice the vector
// kernels for one). Read when a layer is made.
inline int min_vectors() {
  const char* e = std::getenv("FT_CPU_MOE_AMX_MIN");
  if (e == nullptr || *e == '\0') return 4;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (*end != '\0' || v < 1 || v > 8) {
    throw Error(std::string("FT_CPU_MOE_AMX_MIN='") + e + "' must be an integer from 1 to 8 (vectors per call)");
  }
  return static_cast<int>(v);
}

// A format's kernel choice from $env_name, read when a layer is made: "auto" when unset, else one of
// `names` (the format's vector kernels and "amx", each with the lowest tier that runs it), whose error
// lists `expected`. amx also needs a CPU and OS that run AMX-BF16 tiles; asking for kernels where they
// cannot run raises.
struct KernelName {
  const char* name;
  Isa tier;
};
inline std::string kernel_choice(const char* env_name, Isa isa, std::initializer_list<KernelName> names,
                                 const char* expected) {
  const char* e = std::getenv(env_name);
  const std::string v = e && *e ? e : "auto";
  const KernelName* known = nullptr;
  for (const KernelName& n : names) known = v == n.name ? &n : known;
  const std::string var = std::string(env_name) + "='" + v + "'";
  if (!known && v != "auto") throw Error(var + " is unknown; expected " + expected);
  if (known && isa < known->tier) {
    throw Error(var + " needs the " + isa_name(known->tier) + " tier; this layer runs tier '" + isa_name(isa) + "'");
  }
  if (v == "amx" && !cpu_amx_bf16()) throw Error(var + ": this CPU or OS does not run AMX-BF16 tiles");
  return v;
}

#if FT_X86

constexpr int kGroup = 16;  // weight rows per A tile
constexpr int kWide = 8;    // tokens per B row when more than one (pairs of bf16, zero-padded)

// The tile instructions, written out: GCC's intrinsics for TILELOADD carry no memory clobber, so
// the compiler could sink or drop the stores of the A tiles that the load reads.
template <int T>
inline void tile_load(const void* base, long stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void tile_store(void* base, long stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void tile_zero() {
  asm volatile("tilezero %%tmm%c0" ::"i"(T));
}
template <int C, int A, int B>
inline void tile_dp() {
  asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
}
inline void tile_release() { asm volatile("tilerelease" ::: "memory"); }

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

inline void load_config(int cols) {  // cols: tokens per B row (1 or kWide)
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? 64 : 4 * cols);
  }
  asm volatile("ldtilecfg %0" ::"m"(c));
}

// B tiles for 2..8 tokens: every 32-word piece cj (cj = 0 .. 4 * steps - 1) of the prepared vectors,
// word pairs (2k, 2k+1) of each token side by side, 8 tokens a row (absent tokens 0). out: 16 rows x
// 8 dwords per piece, pieces in order.
FT_TARGET_AVX512_BF16 inline void pack_tokens(const void* const* xs, int n, int steps, uint32_t* out) {
  const __m512i zero = _mm512_setzero_si512();
  for (int cj = 0; cj < 4 * steps; ++cj) {
    __m512i a[kWide];
    for (int t = 0; t < kWide; ++t) {
      a[t] = t < n ? _mm512_loadu_si512(static_cast<const uint32_t*>(xs[t]) + 16 * cj) : zero;
    }
    // 8 x 16 dwords -> 16 x 8: dword pairs, then qwords, then 128-bit lanes.
    __m512i p[8], q[8];
    for (int t = 0; t < 8; t += 2) {
      p[t] = _mm512_unpacklo_epi32(a[t], a[t + 1]);      // lane l: t[4l] t+1[4l] t[4l+1] t+1[4l+1]
      p[t + 1] = _mm512_unpackhi_epi32(a[t], a[t + 1]);  // lane l: ... 4l+2, 4l+3
    }
    for (int h = 0; h < 2; ++h) {  // tokens 4h .. 4h+3
      const __m512i* u = p + 4 * h;
      q[4 * h + 0] = _mm512_unpacklo_epi64(u[0], u[2]);  // lane l: tokens 4h..4h+3 at k = 4l
      q[4 * h + 1] = _mm512_unpackhi_epi64(u[0], u[2]);  // k = 4l + 1
      q[4 * h + 2] = _mm512_unpacklo_epi64(u[1], u[3]);  // k = 4l + 2
      q[4 * h + 3] = _mm512_unpackhi_epi64(u[1], u[3]);  // k = 4l + 3
    }
    // Row k = 4l + s is lane l of q[s] (tokens 0-3) then of q[4 + s] (tokens 4-7); output vector
    // o (rows 2o, 2o + 1) takes k = 4l + s, 4l + s + 1 with l = o / 2, s = 2 (o % 2).
    uint32_t* dst = out + static_cast<size_t>(cj) * 16 * kWide;
    for (int s = 0; s < 4; s += 2) {
      // For l = 0..3: [q[s] lane l, q[4+s] lane l, q[s+1] lane l, q[5+s] lane l].
      const __m512i x0 = _mm512_shuffle_i32x4(q[s], q[4 + s], 0x44);          // s:l0 l1, 4+s:l0 l1
      const __m512i x1 = _mm512_shuffle_i32x4(q[s], q[4 + s], 0xee);          // l2 l3
      const __m512i y0 = _mm512_shuffle_i32x4(q[s + 1], q[5 + s], 0x44);
      const __m512i y1 = _mm512_shuffle_i32x4(q[s + 1], q[5 + s], 0xee);
      // x0 = [s l0, s l1, 4+s l0, 4+s l1], y0 likewise for s+1.
      const __m512i o0 = _mm512_shuffle_i32x4(x0, y0, 0x88);  // [s l0, 4+s l0, s+1 l0, 5+s l0]
      const __m512i o1 = _mm512_shuffle_i32x4(x0, y0, 0xdd);  // l1
      const __m512i o2 = _mm512_shuffle_i32x4(x1, y1, 0x88);  // l2
      const __m512i o3 = _mm512_shuffle_i32x4(x1, y1, 0xdd);  // l3
      // l selects rows 4l + s, 4l + s + 1: output vector 2l + s / 2.
      _mm512_storeu_si512(dst + 16 * (0 + s / 2), o0);
      _mm512_storeu_si512(dst + 16 * (2 + s / 2), o1);
      _mm512_storeu_si512(dst + 16 * (4 + s / 2), o2);
      _mm512_storeu_si512(dst + 16 * (6 + s / 2), o3);
    }
  }
}

// Where the B tiles of a call's vectors are: piece cj's tile at base + cj * step, rows `stride` bytes
// apart. One vector: its prepared words in place; 2..8: packed into buf by pack_tokens.
struct BTiles {
  const char* base;
  long stride;
  size_t step;
};

FT_TARGET_AVX512_BF16 inline BTiles b_tiles(const void* const* xs, int n, int steps, AlignedBuffer<uint32_t>& buf) {
  if (n == 1) return {static_cast<const char*>(xs[0]), 4, 64};
  buf.resize(static_cast<size_t>(steps) * 4 * 16 * kWide);
  pack_tokens(xs, n, steps, buf.data());
  return {reinterpret_cast<const char*>(buf.data()), 4 * kWide, 16 * 4 * kWide};
}

// Row r of the 4 A tiles of a step (ab: 4 tiles of 16 rows x 32 words, one after the other).
FT_TARGET_AVX512_BF16 inline void store_a_row(uint16_t* ab, int r, __m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  _mm512_store_si512(ab + 0 * kGroup * 32 + r * 32, v0);
  _mm512_store_si512(ab + 1 * kGroup * 32 + r * 32, v1);
  _mm512_store_si512(ab + 2 * kGroup * 32 + r * 32, v2);
  _mm512_store_si512(ab + 3 * kGroup * 32 + r * 32, v3);
}

// C_j += A_j x B_j for the 4 pieces of step c: A tiles at ab, B tiles from b.
inline void multiply_step(const uint16_t* ab, const BTiles& b, int c) {
  const char* bc = b.base + static_cast<size_t>(4 * c) * b.step;
  tile_load<4>(ab + 0 * kGroup * 32, 64);
  tile_load<6>(bc, b.stride);
  tile_dp<0, 4, 6>();
  tile_load<5>(ab + 1 * kGroup * 32, 64);
  tile_load<7>(bc + b.step, b.stride);
  tile_dp<1, 5, 7>();
  tile_load<4>(ab + 2 * kGroup * 32, 64);
  tile_load<6>(bc + 2 * b.step, b.stride);
  tile_dp<2, 4, 6>();
  tile_load<5>(ab + 3 * kGroup * 32, 64);
  tile_load<7>(bc + 3 * b.step, b.stride);
  tile_dp<3, 5, 7>();
}

inline void zero_c() {
  tile_zero<0>();
  tile_zero<1>();
  tile_zero<2>();
  tile_zero<3>();
}

// The 4 C tiles into cbuf[j] (16 rows x cols fp32, rows 4 * cols bytes apart).
inline void store_c(float (*cbuf)[kGroup * kWide], int cols) {
  const long cs = 4L * cols;
  tile_store<0>(cbuf[0], cs);
  tile_store<1>(cbuf[1], cs);
  tile_store<2>(cbuf[2], cs);
  tile_store<3>(cbuf[3], cs);
}

// A group's results for n tokens from its 16 x 8 values flat[r * 8 + t]: out[t * os + r].
FT_TARGET_AVX512_BF16 inline void store_tokens(const float* flat, int n, float* out, int os) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(kWide));
  for (int t = 0; t < n; ++t) {
    const __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(t)), flat, 4);
    _mm512_storeu_ps(out + static_cast<size_t>(t) * os, v);
  }
}

#endif  // FT_X86

}  // namespace amx
}  // namespace ft
