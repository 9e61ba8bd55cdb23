// The CPU side of a bridge: a thread that waits for the doorbell, runs the task through the
// executor's C ABI (no GIL), writes y and sets done; and a watchdog that turns a task stuck past a
// bound into an error instead of a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "ft_kernels_cpu/moe_abi.h"
#include "io_block.h"

namespace ftg {

class Coordinator {
 public:
  // `block` is the host view of an IO block laid out as `layout`; it must outlive the coordinator.
  Coordinator(const ft_moe_executor_abi* abi, uint8_t* block, const IoLayout& layout, int max_tokens, int hidden,
              int top_k, std::chrono::milliseconds timeout);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  uint64_t served() const { return served_.load(std::memory_order_acquire); }
  // The first error recorded since the last call ("" if none), cleared by the call.
  std::string take_error();
  bool has_error() const { return has_error_.load(std::memory_order_acquire); }
  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }

 private:
  void serve();
  void watch();
  void fail(const std::string& message);
  std::atomic<uint64_t>& word(size_t offset) { return *reinterpret_cast<std::atomic<uint64_t>*>(block_ + offset); }

  const ft_moe_executor_abi* abi_;
  uint8_t* block_;
  IoLayout layout_;
  int max_tokens_, hidden_, top_k_;
  std::chrono::milliseconds timeout_;

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  // Task in progress: its doorbell word and start time (steady clock ns), 0 when idle.
  std::atomic<uint64_t> running_word_{0};
  std::atomic<int64_t> running_since_{0};
  // Set by the watchdog when it released a stuck task: the late result must not be published, and
  // the bridge answers every later doorbell with an error.
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> poisoned_{false};

  std::mutex error_mutex_;
  std::string error_;
  std::atomic<bool> has_error_{false};

  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::thread server_, watchdog_;
};

}  // namespace ftg
