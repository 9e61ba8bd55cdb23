// A bridge: one IO block pinned and mapped for the GPU, its coordinator thread, and the handshake that
// enqueues "submit" (GPU -> CPU) and "wait" (CPU -> GPU) on a stream, in eager mode or under capture.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "coordinator.h"
#include "probe.h"
#include "runtime.h"

namespace ftg {

enum class Handshake { kernel, memop, host_func };
const char* handshake_name(Handshake h);

struct KernelIo {
  void* module = nullptr;
  void* publish = nullptr;
  void* combine = nullptr;
};

// Loads the embedded kernel-IO image and runs both kernels once on scratch pinned memory: a publish of
// a step without CPU routes must set done without ringing, and a combine must add known values.
ProbeResult probe_kernel_io(Runtime& rt, int device, KernelIo* out);

class Bridge {
 public:
  // handshake: "auto" (kernel, else memop, else host-func, by probing), or one of them by name.
  Bridge(Runtime& rt, const ft_moe_executor_abi* abi, int device, int max_tokens, int hidden, int top_k,
         const std::string& handshake, std::chrono::milliseconds timeout);
  ~Bridge();

  Handshake handshake() const { return hs_; }
  const std::string& detail() const { return detail_; }
  Coordinator& coordinator() { return *coord_; }
  const IoLayout& layout() const { return layout_; }
  uint8_t* host_block() { return host_; }

  // Both only enqueue work on `stream`. x: [T, hidden] bf16, ids: [T, top_k] int32 (< 0: not on the
  // CPU), weights: [T, top_k] f32, out: [T, hidden] bf16; all device addresses.
  void submit(void* stream, uint32_t layer, const void* x, const void* ids, const void* weights, uint32_t num_tokens);
  void wait(void* stream, void* out, bool accumulate);

  struct HostFuncTask {
    Bridge* bridge;
    uint64_t word;
  };

 private:
  void check(int rc, const char* what);
  int memop(void* stream, bool write, uint8_t* dptr, uint64_t value);
  Runtime& rt_;
  int hidden_, top_k_, max_tokens_;
  IoLayout layout_;
  uint8_t* host_ = nullptr;
  uint8_t* dev_ = nullptr;
  std::unique_ptr<Coordinator> coord_;
  KernelIo kio_;
  bool kio_ok_ = false;
  Handshake hs_ = Handshake::memop;
  bool memop_nodes_ = false;  // under capture, append explicit batch-memop nodes (native memops not recorded)
  std::string detail_;
  uint32_t pending_tokens_ = 0;
  std::map<uint64_t, std::unique_ptr<HostFuncTask>> host_tasks_;  // one per (layer, tokens) word
  std::chrono::milliseconds timeout_;
};

}  // namespace ftg
