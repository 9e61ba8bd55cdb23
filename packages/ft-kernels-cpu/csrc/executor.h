// The CPU MoE executor: layers of expert weights in any registered format, run as two passes on a
// pinned worker pool.
//
// Pass 1 (units: expert x block of intermediate rows, all of the expert's tokens): gate/up rows,
// router weight on input if asked, activation, prep_inter. Pass 2 (units: expert x block of output
// rows, all of the expert's tokens; a unit starts once its expert's pass 1 is done): the format's
// down rows; the unit that completes a block sums each token's routes in route order. Every output
// element is computed by the same arithmetic whatever the thread count.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "activation.h"
#include "format.h"
#include "ft_kernels_cpu/moe_abi.h"
#include "worker_pool.h"

namespace ft {

struct MoeJob;

class MoeExecutor {
 public:
  // prefetch_bytes < 0: $FT_CPU_MOE_PREFETCH, else 8192 (a format may use less: bf16 on AMD, 0).
  MoeExecutor(int hidden, int top_k, int max_tokens, int num_threads, const std::string& isa, int prefetch_bytes);
  ~MoeExecutor();

  void add_layer(int layer, const std::string& format, int num_experts, int intermediate,
                 const std::string& activation, std::map<std::string, Bank> banks,
                 std::map<std::string, double> options, bool router_weight_on_input);

  // Throws Error on bad input. Blocking; concurrent calls are serialised.
  void run(const ft_moe_task& task);
  // C ABI: 0 on success, else -1 and last_error() says why.
  int run_noexcept(const ft_moe_task& task) noexcept;
  const char* last_error() const { return last_error_.c_str(); }

  // Read bandwidth of this pool over a buffer of `bytes` (reused across calls), in GB/s, the buffer on
  // transparent huge pages (huge_pages) or on 4 KiB pages: the pages the banks it is set against are
  // on (numpy asks for huge pages on its large arrays).
  double read_bandwidth_gbs(size_t bytes, int passes, bool huge_pages);
  // The read buffer's first byte and size (0, 0 before the first read_bandwidth_gbs).
  const uint8_t* read_buffer() const { return bw_buffer_.data(); }
  size_t read_buffer_bytes() const { return bw_buffer_.size(); }

  // Where the pool's time went in run() calls since the last reset (WorkerPool::profile).
  PoolProfile pool_profile();
  void reset_pool_profile();

  const ft_moe_executor_abi* abi() const { return &abi_; }
  int hidden() const { return hidden_; }
  int top_k() const { return top_k_; }
  int max_tokens() const { return max_tokens_; }
  int num_threads() const { return pool_.num_threads(); }
  // How the pool's workers claim units: "ranges" or "shared" (WorkerPool::Claims, $FT_CPU_MOE_CLAIMS).
  std::string claims() const { return pool_.claims() == WorkerPool::Claims::kRanges ? "ranges" : "shared"; }
  Isa isa() const { return isa_; }
  // prefetch_bytes, else $FT_CPU_MOE_PREFETCH, else 8192. A layer's format may prefetch less when
  // neither is set (bf16 on AMD: none in one-vector calls; layer_prefetch_bytes).
  int prefetch_bytes() const { return prefetch_; }
  // The distance of a layer's kernel calls over `vectors` (1 .. 8) tokens or routes.
  int layer_prefetch_bytes(int layer, int vectors = 1) const;
  // The L1 distance of the two-level prefetch (stream_prefetch.h), 0 for one level:
  // $FT_CPU_MOE_PREFETCH_L1, else 2048 with at most 2 threads, 1024 with 3 or 4, else 0. Unless the
  // variable is set, a layer's calls over `vectors` (1 .. 8) tokens or routes whose format asks for
  // two levels at any pool size take 1024 in pools of more than 4 threads, and a layer without
  // software prefetch in any call 0 (layer_prefetch_l1_bytes).
  int prefetch_l1_bytes() const { return prefetch_l1_; }
  int layer_prefetch_l1_bytes(int layer, int vectors = 1) const;
  // The least row bytes for which int8 kernels read several rows side by side in calls of one vector
  // ($FT_CPU_MOE_MULTIROW_BYTES's first value, else the vendor's default: executor.cpp).
  int multirow_min_bytes() const { return multirow_min_bytes_; }
  // The same for calls of several vectors (the 2-row kernels).
  int multirow_several_min_bytes() const { return multirow_several_min_bytes_; }
  int gate_up_slice_bytes() const { return gate_up_slice_bytes_; }
  std::vector<int> layers() const;
  std::string layer_format(int layer) const;
  // The kernels a layer's format runs (MoeFormat::kernels; "" for a format without a choice).
  std::string layer_kernels(int layer) const;

  struct Layer {
    std::string format_name;
    MoeParams params;
    ActivationSpec act;
    std::unique_ptr<MoeFormat> fmt;
    // pass-1 unit rows, the least pass-2 unit rows (exact when rows2_fixed), prep_inter block rows
    int rows1 = 16, rows2 = 16, prep_rows = 16;
    bool rows2_fixed = false;
    // the software prefetch distance of this layer's calls over v vectors, at v - 1 (MoeFormat::prefetch_bytes)
    int prefetch[MoeFormat::kMaxTokensPerCall] = {};
    // the L1 distance of the two-level prefetch for this layer's calls over v vectors, at v - 1
    int prefetch_l1[MoeFormat::kMaxTokensPerCall] = {};
  };

 private:
  void run_locked(const ft_moe_task& task);
  const Layer& layer_at(int layer) const;  // throws for a layer not added

  int hidden_, top_k_, max_tokens_;
  Isa isa_;
  int prefetch_;
  bool prefetch_explicit_;
  int prefetch_l1_ = 0;
  bool prefetch_l1_explicit_ = false;  // $FT_CPU_MOE_PREFETCH_L1 set
  int unit_rows1_ = 0, unit_rows2_ = 0;  // $FT_CPU_MOE_UNIT_ROWS overrides (0: the format's)
  bool chain_streams_ = true;            // $FT_CPU_MOE_CHAIN (stream_prefetch.h's StreamChain)
  int multirow_min_bytes_ = 0;           // $FT_CPU_MOE_MULTIROW_BYTES (stream_prefetch.h's multirow)
  int multirow_several_min_bytes_ = 0;   // its second value (calls of several vectors)
  bool multirow_explicit_ = false;       // $FT_CPU_MOE_MULTIROW_BYTES set (MoeParams::multirow_explicit)
  int gate_up_slice_bytes_ = 0;          // $FT_CPU_MOE_GATE_UP_SLICE (stream_prefetch.h's gate_up_slices)
  WorkerPool pool_;
  std::map<int, Layer> layers_;
  std::unique_ptr<MoeJob> job_;
  std::mutex run_mutex_;
  std::string last_error_;
  ft_moe_executor_abi abi_{};

  // Scratch, sized for the largest layer.
  AlignedBuffer<float> x_f32_;          // [max_tokens, hidden]
  AlignedBuffer<float> inter_;          // [max_tokens, top_k, I_max]
  AlignedBuffer<uint8_t> inter_prep_;   // [max_tokens, top_k, prep_bytes_max]
  AlignedBuffer<float> vals_;           // [max_tokens * top_k, hidden]: pass 2's per-route values
  AlignedBuffer<float> worker_scratch_; // per worker: gate, up, out rows
  size_t inter_stride_ = 0, prep_stride_ = 0, worker_stride_ = 0;
  AlignedBuffer<uint8_t> bw_buffer_;
};

}  // namespace ft
