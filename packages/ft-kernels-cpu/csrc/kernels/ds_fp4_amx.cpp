// ds_fp4 row kernels on AMX tiles (ds_fp4_kernels.h): AMX-BF16 TDPBF16PS, the e2m1 codes decoded
// to bf16 with AVX-512.
//
// A group is 16 weight rows. For each step of 128 elements (64 bytes of a row) every row is decoded
// as the bf16 kernels do (3 VPSRLW + 4 VPERMW: vector j, word m = element 4m + j of the step), with
// the row's e8m0 scales folded into the bf16 exponents, and the 4 vectors go to 4 A tiles (16 rows x
// 32 bf16). x is the prepared vector of those kernels, so tile B of vector j is its 32 words as 16
// pairs: one token reads them in place (a column of 4 bytes a row), 2..8 tokens side by side, copied
// into pairs of 8 tokens (a column of 32 bytes). C_j (16 rows x tokens, fp32) takes TDPBF16PS(A_j,
// B_j) for every step; the four C tiles are added once per group. The vector work of a row step is
// 12 operations (3 shifts, 5 VPERMW, 4 VPSUBUSW) for any number of tokens up to 8, against ~25 for
// the fp32 kernels plus 9 per extra vector; what costs here is the tiles. On the GPU machine's Xeon
// one core ran a step from L3 at 3.9 GB/s of weights (the fp32 kernels 9-10): 5.6 with the decoding
// left out and 10.7 with the tile instructions left out, so the tile loads and TDPBF16PS (~500
// cycles per 16 rows and step) bound it, for any number of tokens. Hence ds_fp4.cpp uses these for
// calls of 4 or more vectors only (batch 8 sharing its experts: 2x faster than the fp32 kernels).
//
// Scales folded exactly: the lookup table holds bf16(v) + 125 * 2^7 (v != 0; 0 for both zero codes),
// and a block of scale byte s subtracts (252 - s) * 2^7, unsigned and saturating: the exponent field
// becomes that of v * 2^(s - 127), and a zero code stays 0. That is exact for s in [2, 252] (the
// value stays a normal bf16); a group of rows with any other scale byte runs the bf16 kernels. The
// products are exact (4 significant bits of x times 2 of w), so only the fp32 sums differ from
// the fp32 kernels: C adds pairs of products in an order of its own, as VDPBF16PS does. AMX reads
// bf16 denormals as zero; x and the folded weights here are normal or zero.
#include <algorithm>
#include <cstring>

#include "amx_tiles.h"
#include "ds_fp4_kernels.h"
#include "fp4_avx512.h"
#include "fp4_common.h"
#include "stream_prefetch.h"

namespace ft {
namespace dsfp4 {

#if FT_X86

namespace {

using namespace amx;

// (252 - s) * 2^7 for the scales of 16 rows, a row of nbp words each (nbp a multiple of 32, zeros
// past nb). False if a scale byte is outside [2, 252].
FT_TARGET_AVX512_BF16 bool fold_scales(const uint8_t* S, int nb, int nbp, uint16_t* d) {
  __m256i lo = _mm256_set1_epi8(static_cast<char>(0x80)), hi = lo;
  for (int r = 0; r < kGroup; ++r) {
    const uint8_t* s = S + static_cast<size_t>(r) * nb;
    for (int b = 0; b < nbp; b += 32) {
      const int m = std::min(32, nb - b);
      const __mmask32 k = m >= 32 ? ~0u : m > 0 ? (1u << m) - 1u : 0u;
      // Bytes past nb read as 252: in range, and a subtrahend of 0 against the zero codes there.
      const __m256i v = _mm256_mask_loadu_epi8(_mm256_set1_epi8(static_cast<char>(252)), k, s + b);
      lo = _mm256_min_epu8(lo, v);
      hi = _mm256_max_epu8(hi, v);
      const __m512i w = _mm512_sub_epi16(_mm512_set1_epi16(252), _mm512_cvtepu8_epi16(v));
      _mm512_storeu_si512(d + static_cast<size_t>(r) * nbp + b, _mm512_slli_epi16(w, 7));
    }
  }
  const bool low_ok = _mm256_cmplt_epu8_mask(lo, _mm256_set1_epi8(2)) == 0;
  const bool high_ok = _mm256_cmpgt_epu8_mask(hi, _mm256_set1_epi8(static_cast<char>(252))) == 0;
  return low_ok && high_ok;
}

struct Scratch {
  AlignedBuffer<uint16_t> fold;   // kGroup rows of folded scales
  AlignedBuffer<uint32_t> b;      // packed B tiles (2..8 tokens)
  AlignedBuffer<uint16_t> a;      // two sets of 4 A tiles
};

// Rows [0, 16 * groups) of the call: C_j += A_j(step) x B_j(step) over the steps of each group.
FT_TARGET_AVX512_BF16 void amx_groups(const uint8_t* W, const uint8_t* S, int groups, const void* const* xs, int n,
                                      int K, float* out, int os, int prefetch, Scratch& sc) {
  const int nb = K / 32, steps = (nb + 3) / 4, nbp = (nb + 31) / 32 * 32;
  const size_t R = static_cast<size_t>(K) / 2;  // bytes per row
  const int cols = n == 1 ? 1 : kWide;
  const BTiles bt = b_tiles(xs, n, steps, sc.b);
  sc.fold.resize(static_cast<size_t>(kGroup) * nbp + 32);
  sc.a.resize(2 * 4 * kGroup * 32);
  uint16_t* fold = sc.fold.data();

  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    const float v = fp4::kE2m1[i & 15];
    table[i] = v == 0.f ? 0 : static_cast<uint16_t>(f32_to_bf16(v) + (125u << 7));
  }
  const __m512i lut = _mm512_load_si512(table);
  const __m512i spread = _mm512_srli_epi16(
      _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8,
                       7, 6, 5, 4, 3, 2, 1, 0),
      3);  // word m <- folded scale m / 8 (block m / 8 of the step)

  // Prefetch by columns (one step of the 16 rows of a group), `ahead` columns ahead of the one read.
  const int ahead = prefetch > 0 ? std::max(1, prefetch / (kGroup * 64)) : 0;
  const long columns = static_cast<long>(groups) * steps;
  auto prefetch_column = [&](long col) {
    if (col >= columns) return;
    const long g = col / steps, c = col % steps;
    const char* p = reinterpret_cast<const char*>(W) + static_cast<size_t>(g) * kGroup * R + 64 * c;
    for (int r = 0; r < kGroup; ++r) prefetch_line<PrefetchHint::L2>(p + r * R);
  };
  for (long col = 0; col < ahead; ++col) prefetch_column(col);

  load_config(cols);
  alignas(64) float cbuf[4][kGroup * kWide];
  for (int g = 0; g < groups; ++g) {
    const uint8_t* Wg = W + static_cast<size_t>(g) * kGroup * R;
    const uint8_t* Sg = S + static_cast<size_t>(g) * kGroup * nb;
    float* og = out + g * kGroup;
    if (prefetch > 0 && g + 1 < groups) {
      const char* ns = reinterpret_cast<const char*>(Sg + static_cast<size_t>(kGroup) * nb);
      for (int o = 0; o < kGroup * nb; o += 64) prefetch_line<PrefetchHint::L2>(ns + o);
    }
    if (!fold_scales(Sg, nb, nbp, fold)) {
      // A scale the fold cannot take: these 16 rows run the bf16 kernels (same prepared x).
      dot_rows_multi(Wg, Sg, kGroup, xs, n, K, og, os, 0);
      continue;
    }
    zero_c();
    for (int c = 0; c < steps; ++c) {
      if (ahead) prefetch_column(static_cast<long>(g) * steps + c + ahead);
      const int blocks = std::min(4, nb - 4 * c);
      uint16_t* ab = sc.a.data() + (c & 1) * 4 * kGroup * 32;
      for (int r = 0; r < kGroup; ++r) {
        const __m512i wv = fp4::load_blocks(Wg + r * R + 64 * c, blocks);
        const __m512i d = _mm512_permutexvar_epi16(
            spread, _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(fold + r * nbp + 4 * c))));
        const __m512i v0 = _mm512_subs_epu16(_mm512_permutexvar_epi16(wv, lut), d);
        const __m512i v1 = _mm512_subs_epu16(_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), lut), d);
        const __m512i v2 = _mm512_subs_epu16(_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 8), lut), d);
        const __m512i v3 = _mm512_subs_epu16(_mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 12), lut), d);
        store_a_row(ab, r, v0, v1, v2, v3);
      }
      multiply_step(ab, bt, c);
    }
    store_c(cbuf, cols);
    if (n == 1) {
      const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(cbuf[0]), _mm512_load_ps(cbuf[1])),
                                     _mm512_add_ps(_mm512_load_ps(cbuf[2]), _mm512_load_ps(cbuf[3])));
      _mm512_storeu_ps(og, s);
    } else {
      // cbuf[q][r * 8 + t]: row r, token t.
      for (int i = 0; i < kGroup * kWide; i += 16) {
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(cbuf[0] + i), _mm512_load_ps(cbuf[1] + i)),
                                       _mm512_add_ps(_mm512_load_ps(cbuf[2] + i), _mm512_load_ps(cbuf[3] + i)));
        _mm512_store_ps(cbuf[0] + i, s);
      }
      store_tokens(cbuf[0], n, og, os);
    }
  }
  tile_release();
}

}  // namespace

void amx_dot_rows_multi(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                        float* out, int os, int prefetch) {
  if (nrows <= 0 || n <= 0) return;
  n = std::min(n, kWide);
  Scratch& scratch = ThreadObjects::get<Scratch>();
  const int groups = nrows / kGroup;
  if (groups > 0) amx_groups(W, S, groups, xs, n, K, out, os, prefetch, scratch);
  const int done = groups * kGroup;
  if (done < nrows) {
    dot_rows_multi(W + static_cast<size_t>(done) * (K / 2), S + static_cast<size_t>(done) * (K / 32), nrows - done,
                   xs, n, K, out + done, os, prefetch);
  }
}

#else

void amx_dot_rows_multi(const uint8_t*, const uint8_t*, int, const void* const*, int, int, float*, int, int) {
  throw Error("ds_fp4 AMX kernels need x86");
}

#endif  // FT_X86

}  // namespace dsfp4
}  // namespace ft
