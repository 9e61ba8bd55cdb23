// The weight-format interface of the CPU MoE executor.
//
// A format owns how one layer's expert weights are stored and multiplied. The executor owns
// everything else: routes, the two passes, the activation, threads and scratch. Adding a format is
// one file kernels/<fmt>.cpp that ends with FT_REGISTER_FORMAT("<fmt>", factory); nothing else
// changes (CMake compiles every kernels/*.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common.h"

namespace ft {

struct Bank {
  const void* data = nullptr;
  size_t nbytes = 0;
  std::string dtype;  // numpy dtype name of the caller's array; empty for a raw address
};

// Element types of banks. u8 is raw bytes (packed quantized blocks).
enum class DType { bf16, f16, f32, u8, i32 };

// A layer's banks and numeric options, by name. Formats take what they need in their constructor;
// the executor then rejects anything left unused, so a misspelt name is an error, not ignored.
class FormatArgs {
 public:
  FormatArgs(std::string context, std::map<std::string, Bank> banks, std::map<std::string, double> options)
      : context_(std::move(context)), banks_(std::move(banks)), options_(std::move(options)) {}

  // A bank of shape `dims` and element type `dtype`; a wrong byte size or numpy dtype raises with the
  // bank's name and the expected shape.
  const void* require_bank(const std::string& name, std::initializer_list<long long> dims, DType dtype);
  // nullptr when absent; a present bank must still match.
  const void* optional_bank(const std::string& name, std::initializer_list<long long> dims, DType dtype);
  double require_option(const std::string& name, const std::string& meaning);
  double option_or(const std::string& name, double fallback);
  void check_all_used() const;
  const std::string& context() const { return context_; }

 private:
  std::string context_;
  std::map<std::string, Bank> banks_;
  std::map<std::string, double> options_;
  std::set<std::string> used_banks_, used_options_;
};

struct MoeParams {
  int layer = 0;
  int num_experts = 0;
  int hidden = 0;
  int intermediate = 0;
  int top_k = 0;
  Isa isa = Isa::scalar;
  bool router_weight_on_input = false;
  int prefetch = 0;  // software prefetch distance of weight streams, bytes (0: hardware prefetch only)
  // True when prefetch was set by the caller (prefetch_bytes / FT_CPU_MOE_PREFETCH); false when it is
  // the executor's default, which a format may replace with its own measured one (prefetch_bytes).
  bool prefetch_explicit = false;
  // True when $FT_CPU_MOE_MULTIROW_BYTES is set: every kernel then reads rows side by side as
  // multirow() says (stream_prefetch.h); false when its thresholds are the vendor's defaults, which a
  // format may override where it measured otherwise (nvfp4's one-vector rows).
  bool multirow_explicit = false;
};

// The task's hidden states as the executor prepared them before pass 1.
struct TaskInput {
  int num_tokens = 0;
  const uint16_t* x_bf16 = nullptr;  // [T, hidden] as given
  const float* x_f32 = nullptr;      // [T, hidden] widened
};

// One routed expert of a token, as pass 2 sees it (the executor applies the router weight).
struct RouteRef {
  int expert;
  const float* h;        // [intermediate] activated intermediate, fp32
  const void* h_prepped; // the format's prep_inter output for this route, or nullptr
};

class MoeFormat {
 public:
  virtual ~MoeFormat() = default;

  // Intermediate rows per pass-1 unit, and the fewest output rows per pass-2 unit (the executor
  // takes up to 256 when a run has few experts per thread). A format computes every row the same way
  // whichever rows share a call, so results never depend on unit sizes or the number of threads.
  virtual int pass1_rows() const { return 16; }
  virtual int pass2_rows() const { return 16; }
  // Intermediate rows that one prep_inter call takes whole (aligned blocks [p * n, (p + 1) * n)): a
  // multiple of pass1_rows(). The executor calls prep_inter for a block once every pass-1 unit of the
  // block is done, so pass-1 units can be smaller than a format's prepared groups (more units, better
  // balance across cores).
  virtual int prep_rows() const { return pass1_rows(); }
  // True for a format whose calls over `vectors` tokens or routes (1 .. kMaxTokensPerCall) gain from
  // the two-level prefetch (stream_prefetch.h) at any pool size; the others take it in pools of up
  // to 4 threads only (MoeExecutor, docs/benchmarks.md). bf16: every call; q4_0, gguf, mxfp4 and
  // fp8_block: calls of one vector on Intel (thirty-eighth session).
  virtual bool two_level_prefetch_any_pool(int /*vectors*/) const { return false; }
  // The kernels this layer runs, for a format with a choice of them (the value its kernel-choice
  // variable takes, e.g. "q8" for ds_fp4), or "" for a format with one set of kernels per tier.
  virtual std::string kernels() const { return ""; }
  // The software prefetch distance this format's kernels use for a layer of params p in calls over
  // `vectors` tokens or routes (1 .. kMaxTokensPerCall): p.prefetch, unless the format measured
  // better with another when the caller set none (bf16 on AMD: 0 for one vector).
  // MoeExecutor::layer_prefetch_bytes reports it.
  virtual int prefetch_bytes(const MoeParams& p, int /*vectors*/) const { return p.prefetch; }

  // Once per task, on the calling thread, before pass 1.
  virtual void prep_input(const TaskInput& /*in*/) {}

  // Pass 1, for intermediate rows [i0, i1) of expert `e` and token `t`:
  //   gate[i - i0] = in_scale * (W_gate[e, i] . x_t) + gate_bias[e, i]
  //   up[i - i0]   = in_scale * (W_up[e, i]   . x_t) + up_bias[e, i]
  // in_scale is the router weight when it is applied on the input, else 1.
  virtual void gate_up(const TaskInput& in, int e, int t, int i0, int i1, float in_scale, float* gate,
                       float* up) const = 0;

  // Pass 1 for n <= kMaxTokensPerCall tokens routed to expert `e`: gate/up of token j go to
  // gate + j * stride and up + j * stride. A format that reads each weight once for all n tokens
  // makes a batch cost little more than one token; the default calls gate_up per token.
  static constexpr int kMaxTokensPerCall = 8;
  virtual void gate_up_tokens(const TaskInput& in, int e, const int* tokens, const float* in_scales, int n, int i0,
                              int i1, float* gate, float* up, int stride) const {
    for (int j = 0; j < n; ++j) gate_up(in, e, tokens[j], i0, i1, in_scales[j], gate + j * stride, up + j * stride);
  }

  // Bytes of prepared intermediate per route (0: pass 2 reads the fp32 intermediate directly).
  virtual size_t inter_prep_bytes() const { return 0; }
  // Pass 1, after the activation: prepare rows [i0, i1) of one route's intermediate for pass 2, one
  // whole prep_rows() block (the last one may be short).
  virtual void prep_inter(const float* /*h*/, int /*i0*/, int /*i1*/, void* /*prepped*/) const {}

  // The weight streams of a unit, in the order its kernels read them, each exactly as a kernel call
  // prefetches it (the call's rows, from its first byte to the end of its last row): pass 1 (pass2
  // false) rows [r0, r1) of expert e's gate and up, pass 2 its down rows [r0, r1). The executor
  // chains them across the units a worker runs (stream_prefetch.h's StreamChain), so that each
  // stream's prefetch goes on into the next one. Returns how many (<= kMaxUnitStreams); a format
  // that lists none, or a stream its kernels read otherwise, only loses the chaining.
  static constexpr int kMaxUnitStreams = 4;
  struct ByteRange {
    const void* begin;
    size_t bytes;
  };
  virtual int unit_streams(bool /*pass2*/, int /*e*/, int /*r0*/, int /*r1*/, ByteRange* /*out*/) const { return 0; }
  // unit_streams of banks w13 [E, 2I, row13 bytes] (gate rows, then up rows) and w2 [E, H, row2 bytes].
  static int gate_up_down_streams(bool pass2, const void* w13, size_t row13, const void* w2, size_t row2, int I,
                                  int H, int e, int r0, int r1, ByteRange* out) {
    const size_t rows = static_cast<size_t>(r1 - r0);
    if (pass2) {
      out[0] = {static_cast<const char*>(w2) + (static_cast<size_t>(e) * H + r0) * row2, rows * row2};
      return 1;
    }
    const size_t g = static_cast<size_t>(e) * 2 * I + r0;
    out[0] = {static_cast<const char*>(w13) + g * row13, rows * row13};
    out[1] = {static_cast<const char*>(w13) + (g + I) * row13, rows * row13};
    return 2;
  }

  // Pass 2, for output rows [h0, h1), n <= kMaxTokensPerCall routes of one expert `e`
  // (routes[j].expert == e), each weight row read once for all of them, without the router weight:
  //   out[j * stride + r - h0] = W_down[e, r] . h_j + down_bias[e, r]
  // The executor then sums each token's routes in route order (y[t] += weight * value).
  virtual void down_rows(int e, int h0, int h1, const RouteRef* routes, int n, float* out, int stride) const = 0;
};

using FormatFactory = std::unique_ptr<MoeFormat> (*)(const MoeParams&, FormatArgs&);

struct FormatEntry {
  const char* name;
  FormatFactory make;
};

// Registered formats, sorted by name.
std::vector<FormatEntry> weight_formats();
std::unique_ptr<MoeFormat> make_format(const std::string& name, const MoeParams& params, FormatArgs& args);

// Called from static initialisers only (FT_REGISTER_FORMAT); a duplicate name aborts the load.
bool register_format(const char* name, FormatFactory make);

#define FT_REGISTER_FORMAT(name, factory) \
  static const bool ft_format_registered_ = ::ft::register_format(name, factory)

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

}  // namespace ft
