// mxfp4 expert weights in gpt-oss's checkpoint layout (OCP MX: e2m1 values, two per byte, low nibble
// first, one e8m0 scale per 32 elements). Kernels: fp4_kernels.cpp.
//
// Banks (E experts, H hidden, I intermediate; H and I multiples of 32):
//   w13        [E, 2I, H/32, 16] u8   gate_up_proj_blocks: rows INTERLEAVED, row 2i gate_i, 2i+1 up_i
//   w13_scale  [E, 2I, H/32]     u8   gate_up_proj_scales (e8m0)
//   w13_bias   [E, 2I]           bf16 optional, interleaved like the rows
//   w2         [E, H, I/32, 16]  u8   down_proj_blocks
//   w2_scale   [E, H, I/32]      u8   down_proj_scales (e8m0)
//   w2_bias    [E, H]            bf16 optional
// Router weights are applied on the output (gpt-oss); router_weight_on_input=True is refused.
#include <algorithm>
#include <string>

#include "amx_tiles.h"
#include "fp4_common.h"
#include "format.h"

namespace ft {

namespace {

class Mxfp4Format final : public MoeFormat {
 public:
  Mxfp4Format(const MoeParams& p, FormatArgs& args) : p_(p) {
    const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
    if (p.router_weight_on_input) {
      throw Error(args.context() +
                  ": router_weight_on_input=True is not supported by mxfp4 (gpt-oss applies the router "
                  "weights on the output)");
    }
    if (H % 32 != 0 || I % 32 != 0) {
      throw Error(args.context() + ": hidden=" + std::to_string(H) + " and intermediate=" + std::to_string(I) +
                  " must be multiples of 32 (the mxfp4 block size)");
    }
    w13_ = static_cast<const uint8_t*>(args.require_bank("w13", {E, 2 * I, H / 32, 16}, DType::u8));
    s13_ = static_cast<const uint8_t*>(args.require_bank("w13_scale", {E, 2 * I, H / 32}, DType::u8));
    b13_ = static_cast<const uint16_t*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::bf16));
    w2_ = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, I / 32, 16}, DType::u8));
    s2_ = static_cast<const uint8_t*>(args.require_bank("w2_scale", {E, H, I / 32}, DType::u8));
    b2_ = static_cast<const uint16_t*>(args.optional_bank("w2_bias", {E, H}, DType::bf16));
  }

  // prep_inter prepares whole steps of 128 of the intermediate (fp4_common.h).
  int pass1_rows() const override { return 64; }  // as nvfp4's
  // $FT_CPU_MOE_MXFP4_KERNELS's names in avx512_bf16; q8a in avx2, fp32 in avx512 and scalar.
  std::string kernels() const override { return q8_ ? (q8_steps_ ? "steps" : "groups") : q8a_ ? "q8a" : "fp32"; }
  int prep_rows() const override { return kMaxPass1Rows; }
  int pass2_rows() const override { return kPass2Rows; }
  // Two levels in one-vector calls on Intel at any pool size: on the GPU machine's 16-core Xeon,
  // batch 1 at 16 threads, 8 rounds in two VMs alternating FT_CPU_MOE_PREFETCH_L1=1024 with the
  // default, the paired ratio gain had medians of +0.019 (ahead in 7 of 8); ds_fp4 and nvfp4 showed
  // none (docs/benchmarks.md, thirty-eighth session). Calls of several vectors were not measured.
  bool two_level_prefetch_any_pool(int vectors) const override { return vectors == 1 && cpu_is_intel(); }

  void prep_input(const TaskInput& in) override {
    // One token: pass 1 calls take one vector; pass 2 takes more only for duplicate routes, which the
    // step records take too. So the group records are not prepared (a task's prep_inter and dot calls
    // run after this, on the pool, and read the flag).
    groups_ = !q8_steps_ || in.num_tokens > 1;
    const int H = p_.hidden;
    const size_t stride = x_stride();
    xprep_.resize(stride * in.num_tokens);
    for (int t = 0; t < in.num_tokens; ++t) {
      prep(in.x_f32 + static_cast<size_t>(t) * H, 0, H, H, xprep_.data() + t * stride);
    }
  }

  void gate_up(const TaskInput& /*in*/, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int n = i1 - i0;
    // Gate and up rows of [i0, i1) are the contiguous rows [2 i0, 2 i1): one stream.
    const size_t row0 = static_cast<size_t>(e) * 2 * I + 2 * static_cast<size_t>(i0);
    float tmp[2 * kMaxPass1Rows];
    const void* x = xprep_.data() + t * x_stride();
    dot(w13_ + row0 * (H / 2), s13_ + row0 * (H / 32), 2 * n, &x, 1, p_.hidden, tmp, 0);
    const uint16_t* b = b13_ ? b13_ + row0 : nullptr;
    for (int i = 0; i < n; ++i) {
      gate[i] = in_scale * tmp[2 * i] + (b ? bf16_to_f32(b[2 * i]) : 0.f);
      up[i] = in_scale * tmp[2 * i + 1] + (b ? bf16_to_f32(b[2 * i + 1]) : 0.f);
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
    const size_t row0 = static_cast<size_t>(e) * 2 * I + 2 * static_cast<size_t>(i0);
    const size_t xstride = x_stride();
    const void* xs[kMaxTokensPerCall];
    for (int j = 0; j < n; ++j) xs[j] = xprep_.data() + tokens[j] * xstride;
    // The 2 * rows interleaved gate/up rows of each token, one stream for all n tokens.
    float tmp[kMaxTokensPerCall * 2 * kMaxPass1Rows];
    dot(w13_ + row0 * (H / 2), s13_ + row0 * (H / 32), 2 * rows, xs, n, p_.hidden, tmp, 2 * kMaxPass1Rows);
    const uint16_t* b = b13_ ? b13_ + row0 : nullptr;
    for (int j = 0; j < n; ++j) {
      const float* t = tmp + j * 2 * kMaxPass1Rows;
      float* g = gate + j * stride;
      float* u = up + j * stride;
      for (int i = 0; i < rows; ++i) {
        g[i] = in_scales[j] * t[2 * i] + (b ? bf16_to_f32(b[2 * i]) : 0.f);
        u[i] = in_scales[j] * t[2 * i + 1] + (b ? bf16_to_f32(b[2 * i + 1]) : 0.f);
      }
    }
  }

  // Gate and up rows of [r0, r1) interleaved: one stream of 2 (r1 - r0) rows.
  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    const size_t H = p_.hidden, I = p_.intermediate, rows = r1 - r0;
    if (pass2) {
      out[0] = {w2_ + (static_cast<size_t>(e) * H + r0) * (I / 2), rows * (I / 2)};
    } else {
      out[0] = {w13_ + (static_cast<size_t>(e) * 2 * I + 2 * static_cast<size_t>(r0)) * (H / 2), 2 * rows * (H / 2)};
    }
    return 1;
  }

  size_t inter_prep_bytes() const override { return vec_bytes(p_.intermediate); }

  void prep_inter(const float* h, int i0, int i1, void* prepped) const override {
    prep(h + i0, i0, i1, p_.intermediate, prepped);
  }

  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override {
    const size_t H = p_.hidden, I = p_.intermediate;
    const int rows = h1 - h0;
    const size_t row0 = static_cast<size_t>(e) * H + h0;
    const void* hs[kMaxTokensPerCall];
    for (int j = 0; j < n; ++j) hs[j] = routes[j].h_prepped;
    dot(w2_ + row0 * (I / 2), s2_ + row0 * (I / 32), rows, hs, n, p_.intermediate, out, stride);
    if (b2_) {
      const uint16_t* b = b2_ + row0;
      for (int j = 0; j < n; ++j) {
        for (int r = 0; r < rows; ++r) out[j * stride + r] += bf16_to_f32(b[r]);
      }
    }
  }

 private:
  // The tier's prepared vectors and row kernels: int8 activations in the avx512_bf16 tier and the
  // avx2 tier (q8a_*), the tier's own layout otherwise. In the avx512_bf16 tier, group records
  // (fp4_common.h, q8g_*) for calls of several vectors, and step records (q8_*) before them for the
  // calls of one (unless FT_CPU_MOE_MXFP4_KERNELS=groups). At 8 vectors the group kernels are the
  // faster (Xeon, 16 threads: 426 -> 378 us a step; Zen 4, 2 threads: 2513 -> 2232). For one vector
  // the transpose costs port-5 shuffles on Intel (one core from L3: 219 against 202 us a step), and on
  // Zen 4 it went either way (one core from L3: qwen3-30b-a3b 143 -> 131 us, gpt-oss-120b 749 -> 838;
  // 2 threads from DRAM the same within 2%; docs/benchmarks.md).
  // $FT_CPU_MOE_MXFP4_KERNELS, read when a layer is made: "steps" or "auto" (unset) as above,
  // "groups" for group records in every call. Both name avx512_bf16 kernels.
  static bool step_records(Isa isa) {
    const std::string v =
        amx::kernel_choice("FT_CPU_MOE_MXFP4_KERNELS", isa, {{"steps", Isa::avx512_bf16}, {"groups", Isa::avx512_bf16}},
                           "auto, steps or groups");
    return v != "groups";
  }
  size_t step_bytes(int K) const { return q8_steps_ ? fp4::q8_vec_bytes(K) : 0; }
  // Bytes from one token's prepared x to the next (common.h's vec_stride).
  size_t x_stride() const { return vec_stride(vec_bytes(p_.hidden)); }
  size_t vec_bytes(int K) const {
    return q8_ ? step_bytes(K) + fp4::q8g_vec_bytes(K) : q8a_ ? fp4::q8a_vec_bytes(K) : fp4::vec_bytes(p_.isa, K);
  }
  void prep(const float* v, int i0, int i1, int K, void* out) const {
    if (q8_) {
      if (q8_steps_) fp4::q8_prep_vec(v, i0, i1, K, out);
      if (groups_) fp4::q8g_prep_vec(v, i0, i1, K, static_cast<char*>(out) + step_bytes(K));
    } else if (q8a_) {
      fp4::q8a_prep_vec(v, i0, i1, out);
    } else {
      fp4::prep_vec(p_.isa, v, i0, i1, out);
    }
  }
  void dot(const uint8_t* W, const uint8_t* S, int nrows, const void* const* xs, int n, int K, float* out,
           int os) const {
    if (q8_ && q8_steps_ && (n == 1 || !groups_)) {
      fp4::q8_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_, p_.multirow_explicit);
    } else if (q8_) {
      const void* xg[kMaxTokensPerCall];
      for (int j = 0; j < n; ++j) xg[j] = static_cast<const char*>(xs[j]) + step_bytes(K);
      fp4::q8g_dot_rows_multi(W, S, nrows, xg, n, K, out, os, pf_);
    } else if (q8a_) {
      fp4::q8a_dot_rows_multi(W, S, nrows, xs, n, K, out, os, pf_);
    } else {
      fp4::dot_rows_multi(p_.isa, W, S, nrows, xs, n, K, out, os, pf_);
    }
  }

  static constexpr int kMaxPass1Rows = 128;
  static constexpr int kPass2Rows = 64;  // down rows per unit: one stream of 64 rows per route

  MoeParams p_;
  int pf_ = p_.prefetch;  // after p_ (declaration order)
  bool q8_ = FT_X86 && p_.isa == Isa::avx512_bf16;
  bool q8_steps_ = step_records(p_.isa) && q8_;  // step records too, for one-vector calls (read on every tier)
  bool q8a_ = FT_X86 && p_.isa == Isa::avx2;  // int8 activations per block of 32 (VPMADDUBSW)
  bool groups_ = true;  // this task's vectors have group records (prep_input)
  const uint8_t* w13_;
  const uint8_t* s13_;
  const uint16_t* b13_;
  const uint8_t* w2_;
  const uint8_t* s2_;
  const uint16_t* b2_;
  AlignedBuffer<uint8_t> xprep_;  // [T] prepared tokens (prep_input, read by every pass-1 unit)
};

std::unique_ptr<MoeFormat> make_mxfp4_format(const MoeParams& params, FormatArgs& args) {
  return std::make_unique<Mxfp4Format>(params, args);
}

}  // namespace

FT_REGISTER_FORMAT("mxfp4", &make_mxfp4_format);

}  // namespace ft
