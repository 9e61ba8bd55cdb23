// q4_0 expert weights: ggml Q4_0 blocks (32 values in 18 bytes: fp16 scale d, then 16 bytes qs;
// element j < 16 is d * ((qs[j] & 15) - 8), element j + 16 is d * ((qs[j] >> 4) - 8)). The kernels
// are the Q4_0 entry of the ggml type table (ggml_blocks.cpp), shared with the gguf format: fp32
// activations in the scalar/avx2/avx512 tiers, int8 activations (x and the intermediate quantized per
// 32 elements, VPDPBUSD) in the avx512_bf16 tier.
//
// Banks (E experts, H hidden, I intermediate; H and I multiples of 32):
//   w13       [E, 2I, H/32*18] u8   gate rows 0..I-1, then up rows I..2I-1
//   w2        [E, H, I/32*18]  u8
//   w13_bias  [E, 2I]          f32  optional
//   w2_bias   [E, H]           f32  optional
#include <memory>
#include <string>

#include "format.h"
#include "ggml_blocks.h"

namespace ft {

namespace {

std::unique_ptr<MoeFormat> make_q4_0_format(const MoeParams& p, FormatArgs& args) {
  constexpr int kQ4_0 = 2;
  const ggml::TypeInfo& t = *ggml::find_type(kQ4_0);
  const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
  const size_t rh = ggml::row_bytes(args.context(), t, H, "hidden=" + std::to_string(H));
  const size_t ri = ggml::row_bytes(args.context(), t, I, "intermediate=" + std::to_string(I));
  const auto* w13 = static_cast<const uint8_t*>(
      args.require_bank("w13", {E, 2 * I, static_cast<long long>(rh)}, DType::u8));
  const auto* w2 = static_cast<const uint8_t*>(args.require_bank("w2", {E, H, static_cast<long long>(ri)}, DType::u8));
  const auto* b13 = static_cast<const float*>(args.optional_bank("w13_bias", {E, 2 * I}, DType::f32));
  const auto* b2 = static_cast<const float*>(args.optional_bank("w2_bias", {E, H}, DType::f32));
  ggml::Matrix gate{w13, 2 * I * rh, rh, &t, b13, static_cast<size_t>(2 * I)};
  ggml::Matrix up{w13 + I * rh, 2 * I * rh, rh, &t, b13 ? b13 + I : nullptr, static_cast<size_t>(2 * I)};
  ggml::Matrix down{w2, H * ri, ri, &t, b2, static_cast<size_t>(H)};
  return std::make_unique<ggml::GgmlMoeFormat>(p, gate, up, down);
}

}  // namespace

FT_REGISTER_FORMAT("q4_0", &make_q4_0_format);

}  // namespace ft
