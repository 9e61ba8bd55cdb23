// ds_fp4: DeepSeek-style FP4 experts. e2m1 weights (two per byte, low nibble first) with one e8m0
// scale per 32 elements and no global scale; the activations are round-tripped through fp8 e4m3fn
// before each GEMM, with one power-of-two scale per block of `act_block` elements (fp4_common.h,
// fp8_round_trip): x before gate/up (prep_input), the activated intermediate before down
// (prep_inter). The round-tripped values are q * 2^k with a 4-bit significand, exact in bf16 and as
// integers in units of 2^-9 of their scale, so the kernels lose nothing by holding them as bf16,
// int16 or int8 digit planes. Kernels (ds_fp4_kernels.h, choose_kernels): q8 by default from the
// avx2 tier up, W4A8: the round-tripped x and h rounded once more to int8 codes, against mxfp4's
// int8 kernels (fp4_kernels.cpp: VNNI, codes per step of 128, in avx512_bf16; VPMADDUBSW, codes per
// block of 32, in avx2 and avx512), the fastest in every tier measured; fp32 in scalar. By name the
// exact ones: in avx512_bf16 AMX tiles (ds_fp4_amx.cpp) for calls of 4 or more vectors and int8
// digit planes (VPDPBUSD, ds_fp4_kernels.cpp) for the rest, the int8 kernels alone, VDPBF16PS; from
// avx2 up int16 (VPMADDWD, ds_fp4_avx2.cpp in avx2 and avx512) and fp32.
//
// Banks (E experts, H hidden, I intermediate; H and I multiples of 32):
//   w13        [E, 2I, H/2]  u8   gate rows 0..I-1, then up rows I..2I-1 (not interleaved)
//   w13_scale  [E, 2I, H/32] u8   e8m0
//   w2         [E, H, I/2]   u8
//   w2_scale   [E, H, I/32]  u8   e8m0
// Options: act_block (required) 32 or 128. Router weights on the output only.
#include <algorithm>
#include <string>

#include "amx_tiles.h"
#include "ds_fp4_kernels.h"
#include "fp4_common.h"
#include "format.h"
#include "stream_prefetch.h"

namespace ft {

namespace {

class DsFp4Format final : public MoeFormat {
 public:
  DsFp4Format(const MoeParams& p, FormatArgs& args) : p_(p) {
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    const double ab = args.require_option("act_block", "elements per fp8 activation scale block: 32 or 128");
    if (ab != 32 && ab != 128) {
      throw Error(args.context() + ": option act_block=" + std::to_string(ab) + " must be 32 or 128");
    }
    act_block_ = static_cast<int>(ab);
    if (p.router_weight_on_input) {
      throw Error(args.context() +
                  ": router_weight_on_input=True is not supported by ds_fp4 (router weights apply on the output)");
    }
    if (H % 32 != 0 || I % 32 != 0) {
      throw Error(args.context() + ": hidden=" + std::to_string(H) + " and intermediate=" + std::to_string(I) +
                  " must be multiples of 32 (the fp4 block size)");
    }
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H / 2}, DType::u8));
    s13_ = static_cast<const uint8_t*>(args.require_bank("w13_scale", {E, 2 * I, H / 32}, DType::u8));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I / 2}, DType::u8));
    s2_ = static_cast<const uint8_t*>(args.require_bank("w2_scale", {E, H, I / 32}, DType::u8));
  }

  // prep_inter takes whole blocks of 128: a multiple of act_block (32 or 128) and the step of the
  // prepared vectors (fp4_common.h).
  int pass1_rows() const override { return 64; }  // as nvfp4's
  std::string kernels() const override { return dsfp4::kernels_name(kernels_); }
  int prep_rows() const override { return kPrepRows; }
  int pass2_rows() const override { return kPass2Rows; }

  void prep_input(const TaskInput& in) override {
    // A task of one token makes only calls of one vector but for routes repeated on an expert, which
    // the step records take as well: q8 prepares its group records for larger tasks only.
    groups_ = in.num_tokens > 1;
    const int H = p_.hidden;
    const size_t stride = x_stride();
    xprep_.resize(stride * in.num_tokens);
    for (int t = 0; t < in.num_tokens; ++t) {
      round_trip_prep(x_, in.x_f32 + static_cast<size_t>(t) * H, H, 0, H, xprep_.data() + t * stride);
    }
  }

  void gate_up(const TaskInput& /*in*/, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int n = i1 - i0;
    const void* x = xprep_.data() + t * x_stride();
    const size_t g0 = static_cast<size_t>(e) * 2 * I + i0, u0 = g0 + I;
    gate_up_slices(n, H / 2, 1, [&](int r, int c, bool is_up) {  // gate and up in turns (stream_prefetch.h)
      const size_t row = (is_up ? u0 : g0) + r;
      dot_rows(x_, w13_ + row * (H / 2), s13_ + row * (H / 32), c, &x, 1, p_.hidden, (is_up ? up : gate) + r, n);
    });
    if (in_scale != 1.f) {
      for (int i = 0; i < n; ++i) gate[i] *= in_scale, up[i] *= in_scale;
    }
  }

  void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0, int i1,
                      float* gate, float* up, int stride) const override {
    if (n == 1) {
      gate_up(in, e, tokens[0], i0, i1, in_scales[0], gate, up);
      return;
    }
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = i1 - i0;
    const size_t xstride = x_stride();
    const void* xs[kMaxTokensPerCall];
    for (int j = 0; j < n; ++j) xs[j] = xprep_.data() + tokens[j] * xstride;
    const size_t g0 = static_cast<size_t>(e) * 2 * I + i0, u0 = g0 + I;
    dot_rows(x_, w13_ + g0 * (H / 2), s13_ + g0 * (H / 32), rows, xs, n, p_.hidden, gate, stride);
    dot_rows(x_, w13_ + u0 * (H / 2), s13_ + u0 * (H / 32), rows, xs, n, p_.hidden, up, stride);
    for (int j = 0; j < n; ++j) {
      if (in_scales[j] == 1.f) continue;
      for (int i = 0; i < rows; ++i) gate[j * stride + i] *= in_scales[j], up[j * stride + i] *= in_scales[j];
    }
  }

  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    return gate_up_down_streams(pass2, w13_, p_.hidden / 2, w2_, p_.intermediate / 2, p_.intermediate, p_.hidden, e,
                                r0, r1, out);
  }

  size_t inter_prep_bytes() const override { return vec_bytes(h_, p_.intermediate); }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
    round_trip_prep(h_, h + i0, p_.intermediate, i0, i1, prepped);
  }

  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const size_t row0 = static_cast<size_t>(e) * H + h0;
    const void* hs[kMaxTokensPerCall];
    for (int j = 0; j < n; ++j) hs[j] = routes[j].h_prepped;
    dot_rows(h_, w2_ + row0 * (I / 2), s2_ + row0 * (I / 32), h1 - h0, hs, n, p_.intermediate, out, stride);
  }

 private:
  // The prepared vectors of x and of h: a layout of ds_fp4_kernels.h for calls of fewer than
  // `large_from` vectors, and (large_from > 0) a second one after it for the larger calls: the bf16
  // layout of the AMX tiles, or the fp32 layout where the int16 kernels of the avx2 tier lose to the
  // fp32 ones (their per-vector work is larger, the decode cheaper).
  enum class Layout { fp32, bf16, int16, int8, q8, q8a };
  struct Plan {
    Layout small;
    Layout large;
    int large_from;  // 0: one layout
  };
  // int8: x and h in int8 digit planes (VPDPBUSD; 12 operations per 64 bytes of weights with two
  // planes, 15 with three, against ~25 for the fp32 kernels).
  // int16: x in int16 records (avx512_bf16: VPDPWSSD, ~19 operations per 64 bytes (VPERMW is two
  // uops); avx2: VPMADDWD, ~22 per 32 bytes against ~40). h is too in the avx2 tier, but in the fp32
  // layout in avx512_bf16: about 90% of h's steps need the records' low part (h spans more than 11
  // binades of its block's largest element; x 4-8%), which made the Xeon's down rows slower than its
  // fp32 kernels, while on Zen 3 the int16 down rows of one vector still beat the avx2 fp32 kernels.
  // There the avx2 int16 kernels of 3+ vectors take two rows side by side (ds_fp4_avx2.cpp): for x
  // they beat the fp32 kernels at every vector count (8 vectors of H = 2048: 38 against 57 TSC ticks
  // per 64 weights), so x takes no fp32 layout; for h, whose records fit L1 and nearly all carry the
  // low part, the fp32 kernels stay from 2 vectors (docs/benchmarks.md, sixteenth session).
  static Plan plan(dsfp4::Kernels k, Isa isa, bool x, int amx_min) {
    switch (k) {
      case dsfp4::Kernels::fp32: return {Layout::fp32, Layout::fp32, 0};
      case dsfp4::Kernels::bf16: return {Layout::bf16, Layout::bf16, 0};
      case dsfp4::Kernels::int8: return {Layout::int8, Layout::int8, 0};
      case dsfp4::Kernels::amx: return {Layout::int8, Layout::bf16, amx_min};
      case dsfp4::Kernels::q8: {
        const Layout L = isa == Isa::avx512_bf16 ? Layout::q8 : Layout::q8a;
        return {L, L, 0};
      }
      case dsfp4::Kernels::int16: break;
    }
    if (isa == Isa::avx512_bf16) return {x ? Layout::int16 : Layout::fp32, Layout::fp32, 0};
    return {Layout::int16, Layout::fp32, x ? 0 : 2};
  }
  size_t layout_bytes(Layout L, int K) const {
    switch (L) {
      case Layout::fp32: return fp4::vec_bytes(p_.isa, K);
      case Layout::bf16: return dsfp4::vec_bytes(K);
      case Layout::int16: return dsfp4::int16_vec_bytes(K);
      case Layout::int8: return dsfp4::int8_vec_bytes(K);
      case Layout::q8: return fp4::q8_vec_bytes(K) + fp4::q8g_vec_bytes(K);
      case Layout::q8a: return fp4::q8a_vec_bytes(K);
    }
    return 0;
  }
  // Bytes from one token's prepared x to the next (common.h's vec_stride).
  size_t x_stride() const { return vec_stride(vec_bytes(x_, p_.hidden)); }
  size_t vec_bytes(const Plan& P, int K) const {
    return layout_bytes(P.small, K) + (P.large_from ? layout_bytes(P.large, K) : 0);
  }
  // The fp8 round trip of elements [i0, i1) of a vector of K, given as v[i - i0], into the prepared
  // vector `out` of plan P.
  void round_trip_prep(const Plan& P, const float* v, int K, int i0, int i1, void* out) const {
    char* second = P.large_from ? static_cast<char*>(out) + layout_bytes(P.small, K) : nullptr;
    if (P.small == Layout::bf16) {
      dsfp4::fp8_prep(v, i0, i1, act_block_, nullptr, out);
      return;
    }
    if (P.small == Layout::int8) {
      dsfp4::int8_prep(v, i0, i1, K, act_block_, out, second);  // second: the tiles' bf16 layout (amx)
      return;
    }
    if (P.small == Layout::int16) {
      if (p_.isa == Isa::avx512_bf16) {
        dsfp4::fp8_prep(v, i0, i1, act_block_, out, second);  // second: the tiles' bf16 layout (amx)
      } else {
        dsfp4::avx2_int16_prep(p_.isa, v, i0, i1, act_block_, out, second);  // second: fp32, larger calls
      }
      return;
    }
    float q[kPrepRows];  // i1 - i0 <= kPrepRows in prep_inter; prep_input goes 128 at a time
    for (int g = i0; g < i1; g += kPrepRows) {
      const int n = std::min(kPrepRows, i1 - g);
      dsfp4::fp8_round_trip(p_.isa, v + (g - i0), n, act_block_, q);
      if (P.small == Layout::q8) {  // step records, then (tasks of several tokens) group records
        fp4::q8_prep_vec(q, g, g + n, K, out);
        if (groups_) fp4::q8g_prep_vec(q, g, g + n, K, static_cast<char*>(out) + fp4::q8_vec_bytes(K));
        continue;
      }
      if (P.small == Layout::q8a) {
        fp4::q8a_prep_vec(q, g, g + n, out);
        continue;
      }
      fp4::prep_vec(p_.isa, q, g, g + n, out);
      if (second && P.large == Layout::bf16) dsfp4::bf16_layout(q, g, g + n, second);
    }
  }
  // out[j * os + r] = W[r] . xs[j], j < n, for vectors of plan P.
  void dot_rows(const Plan& P, const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                float* out, int os) const {
    if (P.large_from && n >= P.large_from) {
      const void* xl[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) xl[j] = static_cast<const char*>(xs[j]) + layout_bytes(P.small, K);
      if (P.large == Layout::bf16) {
        dsfp4::amx_dot_rows_multi(W, S, nrows, xl, n, K, out, os, pf_);
      } else {
        dot_rows(P.large, W, S, nrows, xl, n, K, out, os);
      }
      return;
    }
    dot_rows(P.small, W, S, nrows, xs, n, K, out, os);
  }
  void dot_rows(Layout L, const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K,
                float* out, int os) const {
    switch (L) {
      case Layout::int16:
        if (p_.isa == Isa::avx512_bf16) {
          dsfp4::int16_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_);
        } else {
          dsfp4::avx2_int16_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_);
        }
        return;
      case Layout::bf16: dsfp4::dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_); return;
      case Layout::int8: dsfp4::int8_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_); return;
      case Layout::q8:
        if (n == 1 || !groups_) {
          fp4::q8_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_, p_.multirow_explicit);
        } else {
          const void* xg[kMaxTokensPerCall];
          for (int j = 0; j < n; ++j) xg[j] = static_cast<const char*>(xs[j]) + fp4::q8_vec_bytes(K);
          fp4::q8g_dot_rows_multi(W, S, nrows, xg, n, K, out, os, pf_);
        }
        return;
      case Layout::q8a: fp4::q8a_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_); return;
      case Layout::fp32: fp4::dot_rows_multi(p_.isa, W, S, nrows, xs, n, K, out, os, pf_); return;
    }
  }

  static constexpr int kPrepRows = 128;
  static constexpr int kPass2Rows = 64;  // down rows per unit: one stream of 64 rows per route

  MoeParams p_;
  int pf_ = p_.prefetch;  // after p_ (declaration order)
  dsfp4::Kernels kernels_ = dsfp4::choose_kernels(p_.isa);
  int amx_min_ = kernels_ == dsfp4::Kernels::amx ? amx::min_vectors() : 0;
  Plan x_ = plan(kernels_, p_.isa, true, amx_min_), h_ = plan(kernels_, p_.isa, false, amx_min_);
  int act_block_ = 128;
  const uint8_t* w13_;
  const uint8_t* s13_;
  const uint8_t* w2_;
  const uint8_t* s2_;
  AlignedBuffer<uint8_t> xprep_;  // [T] round-tripped, prepared tokens
  bool groups_ = true;            // q8: this task's vectors have group records (prep_input)
};

std::unique_ptr<MoeFormat> make_ds_fp4_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<DsFp4Format>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("ds_fp4", &make_ds_fp4_format);

}  // namespace ft
