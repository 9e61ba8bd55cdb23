// ggml block types (the packed blocks of GGUF files) shared by the `q4_0` and `gguf` formats: a table
// of the supported types with their row-dot kernels per ISA tier (ggml_blocks.cpp), and one format
// class for "gate, up and down matrices whose rows are ggml rows".
//
// Block layouts (little-endian; element order within a block as ggml dequantizes it):
//   F16   1 elem,    2 bytes: fp16
//   BF16  1 elem,    2 bytes: bf16
//   Q8_0  32 elems, 34 bytes: fp16 d, int8 qs[32];              v[j] = d * qs[j]
//   Q4_0  32 elems, 18 bytes: fp16 d, u8 qs[16];                v[j] = d * ((qs[j] & 15) - 8),
//                                                               v[j + 16] = d * ((qs[j] >> 4) - 8)
//   MXFP4 32 elems, 17 bytes: e8m0 e, u8 qs[16];                v[j] = 2^(e - 128) * K[qs[j] & 15],
//                             v[j + 16] = ... K[qs[j] >> 4], K = doubled e2m1 {0,1,2,3,4,6,8,12,0,-1,..,-12}
//   Q4_K 256 elems, 144 bytes: fp16 d, fp16 dmin, u8 scales[12] (8 6-bit scales and mins), u8 qs[128];
//                             sub-block s (32 elems) = d*sc[s]*q - dmin*m[s], q the low (s even) or
//                             high (s odd) nibbles of qs[32*(s/2) .. +32]
//   Q5_K 256 elems, 176 bytes: fp16 d, fp16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]; as Q4_K with
//                             bit s of qh[l] as bit 4 of element l of sub-block s
//   Q6_K 256 elems, 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], fp16 d; v = d*scales[i/16]*(q-32),
//                             per 128-elem half h, l < 32: q[l] = ql[l]&15 | (qh[l]&3)<<4,
//                             q[l+32] = ql[l+32]&15 | (qh[l]>>2&3)<<4, q[l+64] = ql[l]>>4 | (qh[l]>>4&3)<<4,
//                             q[l+96] = ql[l+32]>>4 | (qh[l]>>6)<<4 (ql, qh offset by 64h, 32h)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format.h"

namespace ft {
namespace ggml {

// out[r] = row r of W (ggml rows of K elements, `ld` bytes apart) . x, fp32 accumulation; the weight
// stream is software-prefetched `prefetch` bytes ahead (0: off). K is a multiple of block_elems.
using RowsFn = void (*)(const uint8_t* W, size_t ld, int nrows, const float* x, int K, float* out, int prefetch);
// The same for n <= 8 vectors at once (each block decoded once): out[j * os + r] = row r . xs[j].
using MultiFn = void (*)(const uint8_t* W, size_t ld, int nrows, const float* const* xs, int n, int K, float* out,
                         int os, int prefetch);

// A vector of K elements quantized to int8 per group of G elements (G = 32 for Q8_0 as ggml's Q8_0
// activations, 256 for the K-quants as its Q8_K and for Q4_0; groups start at the first element
// quantized, the last one may be shorter, whole 32-blocks):
//   code[k]  = round-half-even(x[k] * (127 / amax_g)) in fp32, amax_g = max |x| over the group of k
//              (0 for a zero group), clamped to [-127, 127]; the value is code[k] * dx_g,
//              dx_g = amax_g / 127
// stored in one of two layouts (TypeInfo::q8_layout), one pointer per vector (Q8Ref):
//
// kQ8Plain (Q8_0), kQ8KQuant (Q4_K, Q5_K) and kQ8Q6K (Q6_K):
//   q[k]     = code[k] as int8, or code[k] + 128 as uint8 when the weight type takes x unsigned
//              (TypeInfo::q8_xu: VPDPBUSD multiplies unsigned by signed bytes; the weights' side is
//              then signed and the +128 is taken out once per weight block, for all vectors)
//   dl[l]    = dx of the group of lane l (elements 4l..4l+3)
//   xsum[b]  = sum of the unquantized x over elements 32b..32b+31 (fp32; the min terms of Q4_K/Q5_K)
//   q [K] bytes, dl [K/4] fp32 at byte K, xsum [K/32] fp32 at byte 2K (q8_bytes(K) in all): dl of
//   element k is at byte K + k, xsum of its 32-block at byte 2K + k/8.
//   kQ8KQuant: q of each whole group of 256 holds its 32-blocks in the order 0, 2, 1, 3, 4, 6, 5, 7
//   (the order of Q4_K/Q5_K's nibbles in 64-byte loads); dl and xsum stay in element order.
//   kQ8Q6K: xsum's bytes hold instead the int16 sums of the codes per 16 elements (Q6_K's offset 32
//   times its scales: one VPDPWSSD per block).
//
// kQ8Q4_0 (Q4_0; G = 256): a record of kQ4_0XGroupBytes per group g of 256 elements (8 blocks; the
// last group zero-padded), in the order the Q4_0 kernel unpacks nibbles:
//   bytes 128c .. +63      codes of elements 0..15 of blocks 4c..4c+3 of the group (16 each, c = 0, 1)
//   bytes 128c + 64 .. +63 codes of elements 16..31 of the same blocks
//   bytes 256 + 64c .. +63 int32 lanes l = 0..15: -8 * (sum of the codes at bytes 128c + 4l .. +3 and
//                          128c + 64 + 4l .. +3): the start of the VPDPBUSD lanes (Q4_0's offset 8)
//   bytes 384 .. 387       dx of the group (fp32)
//
// kQ8Avx2K (the avx2 tier's int8 kernels of Q4_K, Q5_K and Q6_K; Q4_0's and MXFP4's take avx2_pairs.h's
// records; G = 256, as ggml's Q8_K; K a multiple of 256; codes as int8_codes in int8_codes.h, the
// same as above for finite x):
//   q[K]        int8 codes in element order
//   dx[K/256]   fp32 at byte K: the step of each group
//   xsum[K/32]  fp32 at byte K + K/64: sums of the unquantized x per 32-block (the min terms of
//               Q4_K and Q5_K)
//   csum[K/16]  int16 at byte K + K/64 + K/8: sums of the codes per 16 elements (the offset 32 of
//               Q6_K's codes times its scales)
//   K + K/64 + K/4 bytes (q8_avx2k_bytes).
inline size_t q8_bytes(int K) { return 2 * static_cast<size_t>(K) + static_cast<size_t>(K) / 8; }
inline size_t q8_avx2k_bytes(int K) { return static_cast<size_t>(K) + static_cast<size_t>(K) / 64 + static_cast<size_t>(K) / 4; }
constexpr size_t kQ4_0XGroupBytes = 448;
inline size_t q4_0_xq_bytes(int K) { return static_cast<size_t>((K + 255) / 256) * kQ4_0XGroupBytes; }
enum Q8Layout : int { kQ8Plain = 0, kQ8Q4_0 = 1, kQ8KQuant = 2, kQ8Q6K = 3, kQ8Avx2K = 4 };
struct Q8Ref {
  const uint8_t* q;  // the vector's base
};
// Quantizes elements [k0, k1) (k0 a multiple of G) of x into the Q8 vector of K elements at `base`
// (AVX-512: the avx512_bf16 tier's q8 kernels; the avx2 tier's take kQ8Avx2K, below).
// layout: a Q8Layout other than kQ8Q4_0 and kQ8Avx2K.
void q8_quantize(const float* x, int k0, int k1, int K, int G, bool unsigned_x, int layout, void* base);
// The same into the kQ8Q4_0 layout (k0 a multiple of 256; the group of k1 is zero-padded).
void q4_0_xq_quantize(const float* x, int k0, int k1, void* base);
// The same into the kQ8Avx2K layout, in AVX2 code (x indexed from element 0 as above; k0 and k1
// multiples of 256, whole groups only; the avx2 tier).
void q8_avx2k_quantize(const float* x, int k0, int k1, int K, void* base);
// Int8 kernels: out[j * os + r] = row r . dequant(xs[j]) for n <= 8 vectors.
using Q8Fn = void (*)(const uint8_t* W, size_t ld, int nrows, const Q8Ref* xs, int n, int K, float* out, int os,
                      int prefetch);
// Int8 kernel of one vector over rows [0, nrows) of a gate block Wg and of its up block Wu, side by
// side: og[r] = gate row r . dequant(x), ou[r] = up row r . dequant(x), each bit for bit its Q8Fn's.
using Q8GateUpFn = void (*)(const uint8_t* Wg, const uint8_t* Wu, size_t ld, int nrows, const Q8Ref& x, int K,
                            float* og, float* ou, int prefetch);

struct TypeInfo {
  int id;  // ggml_type
  const char* name;
  int block_elems;
  int block_bytes;
  RowsFn rows[kNumIsa];    // indexed by Isa
  MultiFn multi[kNumIsa];  // n >= 2 vectors
  Q8Fn q8;                 // int8-activation kernels of the avx512_bf16 tier (AVX512-VNNI), or nullptr
  bool q8_xu;              // q8 takes x as unsigned (code + 128)
  int q8_group;            // elements per x scale that q8 expects (32 or 256)
  int q8_layout;           // Q8Layout of the x that q8 takes
  Q8Fn q8_avx2;            // int8-activation kernels of the avx2 tier (VPMADDUBSW) or nullptr
  int q8_avx2_pairs = 0;   // q8_avx2 takes x as avx2_pairs.h's records with this code offset (0: kQ8Avx2K)
  Q8GateUpFn q8_gate_up = nullptr;  // q8's gate and up rows side by side (one vector), or nullptr
  // Q4_0: q8 and q8_gate_up with the other way of gathering a group's codes and scales (ggml_blocks.cpp's
  // Q4_0Words; q8 and q8_gate_up take Q4_0Dwords), bit for bit the same results; nullptr elsewhere.
  // GgmlMoeFormat picks per layer ($FT_CPU_MOE_Q4_0_GATHER).
  Q8Fn q8_words = nullptr;
  Q8GateUpFn q8_gate_up_words = nullptr;
};

// The supported type of ggml id `id`, or nullptr.
const TypeInfo* find_type(int id);
// "Q8_0 (8), Q4_0 (2), ..." in table order.
std::string supported_types();

// The type that option `option` names (a ggml type id); raises naming the option, the value and the
// supported types when it is not one.
const TypeInfo& type_from_option(const std::string& context, const std::string& option, double value);

// Bytes of a row of K elements; raises (naming `what`, e.g. "hidden=100") when K is not a multiple of
// the block size.
size_t row_bytes(const std::string& context, const TypeInfo& t, long long K, const std::string& what);

// One projection of every expert: rows of `row_bytes` bytes, `expert_stride` bytes between experts.
struct Matrix {
  const uint8_t* data = nullptr;
  size_t expert_stride = 0;
  size_t row_bytes = 0;
  const TypeInfo* type = nullptr;
  const float* bias = nullptr;  // optional, `bias_stride` floats between experts
  size_t bias_stride = 0;
};

// gate_up and down over ggml rows (fp32 activations, fp32 accumulation).
class GgmlMoeFormat final : public MoeFormat {
 public:
  GgmlMoeFormat(const MoeParams& p, const Matrix& gate, const Matrix& up, const Matrix& down);
  void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
               float* up) const override;
  void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0, int i1,
                      float* gate, float* up, int stride) const override;
  void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const override;
  // prep_inter quantizes whole Q8 groups of h; pass-1 units of (at most) 64 rows, as nvfp4's.
  int pass1_rows() const override { return down_q8_ ? std::min(64, prep_rows()) : 16; }
  // (the avx2 tier's pair records of Q4_0 and MXFP4 are per 32-block; they are prepared 64 rows at a
  // time, for units of 64; its K-quants' x is per 256, as the avx512_bf16 tier's.)
  int prep_rows() const override {
    if (!down_q8_) return 16;
    return avx2_q8_ && down_.type->q8_avx2_pairs ? 64 : std::max(32, down_.type->q8_group);
  }
  int unit_streams(bool pass2, int e, int r0, int r1, ByteRange* out) const override {
    auto rows = [&](const Matrix& m) {
      return ByteRange{m.data + e * m.expert_stride + r0 * m.row_bytes, (r1 - r0) * m.row_bytes};
    };
    if (pass2) {
      out[0] = rows(down_);
      return 1;
    }
    out[0] = rows(gate_);
    out[1] = rows(up_);
    return 2;
  }
  int pass2_rows() const override { return kPass2Rows; }
  // Two levels in one-vector calls on Intel at any pool size: on the GPU machine's 16-core Xeon,
  // batch 1 at 16 threads, 8 rounds in two VMs alternating FT_CPU_MOE_PREFETCH_L1=1024 with the
  // default, the paired ratio gain had medians of +0.053 for q4_0 and +0.036 for gguf (ahead in 6
  // and 7 of 8); ds_fp4 and nvfp4 showed none (docs/benchmarks.md, thirty-eighth session). Calls of
  // several vectors were not measured.
  bool two_level_prefetch_any_pool(int vectors) const override { return vectors == 1 && cpu_is_intel(); }
  void prep_input(const TaskInput& in) override;
  size_t inter_prep_bytes() const override { return down_q8_ ? xq_bytes(*down_.type, p_.intermediate) : 0; }
  void prep_inter(const float* h, int i0, int i1, void* prepped) const override;
  std::string kernels() const override { return q4_0_gather_; }

 private:
  static constexpr int kPass2Rows = 16;
  // Bytes of a Q8 vector of K elements for type t's q8 kernel, and its quantization (elements [k0, k1)).
  size_t xq_bytes(const TypeInfo& t, int K) const;
  // Bytes from one token's quantized x to the next (common.h's vec_stride).
  size_t x_stride() const { return vec_stride(xq_bytes(*gate_.type, p_.hidden)); }
  void xq_quantize(const TypeInfo& t, const float* x, int k0, int k1, int K, void* base) const;
  Q8Fn q8_fn(const TypeInfo& t) const;  // the tier's int8 kernels of type t
  Q8GateUpFn q8_gate_up_fn(const TypeInfo& t) const;  // their gate and up rows side by side, or nullptr
  // Rows [i0, i1) of one matrix of expert e times n vectors (float or Q8), into out[j * os + r].
  void mat_rows(const Matrix& m, bool q8, int e, int r0, int r1, const float* const* xs, const Q8Ref* qs, int n,
                int K, float* out, int os) const;
  MoeParams p_;
  Matrix gate_, up_, down_;
  bool gu_q8_ = false, down_q8_ = false;  // the int8 paths (types with a q8 kernel in this tier)
  bool avx2_q8_ = false;                  // the avx2 tier (q8_avx2 kernels; kQ8Avx2K x for K-quants)
  // The avx512_bf16 tier's Q4_0 kernels, "dwords" or "words" ($FT_CPU_MOE_Q4_0_GATHER), for a layer with
  // Q4_0 rows in that tier; "" otherwise (kernels()).
  std::string q4_0_gather_;
  bool q4_0_words_ = false;  // q4_0_gather_ is "words" (read at every kernel call)
  // prep_input: the tokens' Q8 vectors of x, from a cache-line boundary (x_stride() is whole lines), so
  // that the kernels' 64-byte loads of x never straddle two lines (a std::vector's bytes start at any
  // 16-byte boundary; no step time changed on the 2-core Zen 4, docs/benchmarks.md, thirty-first session)
  AlignedBuffer<uint8_t> xq_;
};

}  // namespace ggml
}  // namespace ft
