// gguf expert weights: the expert tensors exactly as GGUF files store them, so that a loader fills
// the banks by slicing ffn_gate_exps / ffn_up_exps / ffn_down_exps without conversion. The block
// types and their kernels are the ggml type table of ggml_blocks.h/.cpp.
//
// Banks (E experts, H hidden, I intermediate; row_bytes(K) = K / block_elems * block_bytes of the
// bank's type, K a multiple of block_elems):
//   gate       [E, I, row_bytes(H)] u8   ffn_gate_exps (type gate_up_type)
//   up         [E, I, row_bytes(H)] u8   ffn_up_exps   (type gate_up_type)
//   down       [E, H, row_bytes(I)] u8   ffn_down_exps (type down_type)
//   gate_bias  [E, I] f32, up_bias [E, I] f32, down_bias [E, H] f32   optional
// Options: gate_up_type, down_type: ggml type ids (ggml_type / gguf.GGMLQuantizationType), one of
// Q8_0 (8), Q4_0 (2), BF16 (30), F16 (1), MXFP4 (39), Q4_K (12), Q6_K (14), Q5_K (13).
// In the avx512_bf16 tier Q8_0/Q4_0 take int8 activations per 32 elements and the K-quants per 256
// (ggml's Q8_0/Q8_K), with VNNI dot products; BF16, F16 and MXFP4 stay fp32 there.
#include <memory>
#include <string>

#include "format.h"
#include "ggml_blocks.h"

namespace ft {

namespace {

std::unique_ptr<MoeFormat> make_gguf_format(const MoeParams& p, FormatArgs& args) {
  const std::string& ctx = args.context();
  const ggml::TypeInfo& tgu = ggml::type_from_option(
      ctx, "gate_up_type",
      args.require_option("gate_up_type", "ggml type id of gate and up, e.g. 8 for Q8_0; supported: " +
                                              ggml::supported_types()));
  const ggml::TypeInfo& td = ggml::type_from_option(
      ctx, "down_type",
      args.require_option("down_type", "ggml type id of down, e.g. 8 for Q8_0; supported: " +
                                           ggml::supported_types()));
  const long long E = p.num_experts, H = p.hidden, I = p.intermediate;
  const size_t rh = ggml::row_bytes(ctx, tgu, H, "hidden=" + std::to_string(H) + " (gate_up_type)");
  const size_t ri = ggml::row_bytes(ctx, td, I, "intermediate=" + std::to_string(I) + " (down_type)");
  const long long rhl = static_cast<long long>(rh), ril = static_cast<long long>(ri);
  const auto* gate = static_cast<const uint8_t*>(args.require_bank("gate", {E, I, rhl}, DType::u8));
  const auto* up = static_cast<const uint8_t*>(args.require_bank("up", {E, I, rhl}, DType::u8));
  const auto* down = static_cast<const uint8_t*>(args.require_bank("down", {E, H, ril}, DType::u8));
  const auto* bg = static_cast<const float*>(args.optional_bank("gate_bias", {E, I}, DType::f32));
  const auto* bu = static_cast<const float*>(args.optional_bank("up_bias", {E, I}, DType::f32));
  const auto* bd = static_cast<const float*>(args.optional_bank("down_bias", {E, H}, DType::f32));
  const size_t Is = static_cast<size_t>(I), Hs = static_cast<size_t>(H);
  return std::make_unique<ggml::GgmlMoeFormat>(p, ggml::Matrix{gate, Is * rh, rh, &tgu, bg, Is},
                                               ggml::Matrix{up, Is * rh, rh, &tgu, bu, Is},
                                               ggml::Matrix{down, Hs * ri, ri, &td, bd, Hs});
}

}  // namespace

FT_REGISTER_FORMAT("gguf", &make_gguf_format);

}  // namespace ft
