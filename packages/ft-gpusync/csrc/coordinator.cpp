#include "coordinator.h"

#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ftg {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The doorbell is written by the GPU over PCIe, so nothing can wake this thread: it polls. It spins
// hot for a while after each task (decode rings every few tens of microseconds), then yields, then
// sleeps in short steps so an idle bridge costs little CPU.
constexpr int64_t kSpinNs = 200'000;
constexpr int64_t kYieldNs = 5'000'000;
constexpr auto kIdleSleep = std::chrono::microseconds(50);

}  // namespace

Coordinator::Coordinator(const ft_moe_executor_abi* abi, uint8_t* block, const IoLayout& layout, int max_tokens,
                         int hidden, int top_k, std::chrono::milliseconds timeout)
    : abi_(abi), block_(block), layout_(layout), max_tokens_(max_tokens), hidden_(hidden), top_k_(top_k),
      timeout_(timeout) {
  word(layout_.doorbell).store(0, std::memory_order_relaxed);
  word(layout_.done).store(1, std::memory_order_release);
  server_ = std::thread(&Coordinator::serve, this);
  watchdog_ = std::thread(&Coordinator::watch, this);
}

Coordinator::~Coordinator() {
  stop_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
  }
  watch_cv_.notify_all();
  // A task still inside the executor is waited for: the executor reads this block.
  server_.join();
  watchdog_.join();
}

std::string Coordinator::take_error() {
  std::lock_guard<std::mutex> lock(error_mutex_);
  std::string e;
  e.swap(error_);
  has_error_.store(false, std::memory_order_release);
  return e;
}

void Coordinator::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (error_.empty()) error_ = message;  // keep the first cause
  has_error_.store(true, std::memory_order_release);
}

void Coordinator::serve() {
  std::atomic<uint64_t>& bell = word(layout_.doorbell);
  std::atomic<uint64_t>& done = word(layout_.done);
  int64_t idle_since = now_ns();
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t v = bell.load(std::memory_order_acquire);
    if (v == 0) {
      const int64_t idle = now_ns() - idle_since;
      if (idle < kSpinNs) {
        for (int i = 0; i < 64; ++i) cpu_relax();
      } else if (idle < kYieldNs) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kIdleSleep);
      }
      continue;
    }
    bell.store(0, std::memory_order_relaxed);
    const uint32_t layer = static_cast<uint32_t>(v >> 32), num_tokens = static_cast<uint32_t>(v);
    uint8_t* y = block_ + layout_.y;
    const size_t y_bytes = static_cast<size_t>(num_tokens) * hidden_ * 2;
    if (poisoned_.load(std::memory_order_acquire)) {
      fail("layer " + std::to_string(layer) + ": the bridge stopped serving after an earlier stuck task");
    } else if (num_tokens > static_cast<uint32_t>(max_tokens_)) {
      fail("layer " + std::to_string(layer) + ": doorbell asks for num_tokens=" + std::to_string(num_tokens) +
           " but the IO block holds max_tokens=" + std::to_string(max_tokens_));
    } else {
      ft_moe_task task;
      task.layer = static_cast<int32_t>(layer);
      task.num_tokens = static_cast<int32_t>(num_tokens);
      task.x = block_ + layout_.x;
      task.ids = reinterpret_cast<const int32_t*>(block_ + layout_.ids);
      task.weights = reinterpret_cast<const float*>(block_ + layout_.weights);
      task.y = y;
      running_since_.store(now_ns(), std::memory_order_relaxed);
      running_word_.store(v, std::memory_order_release);
      const int rc = abi_->run(abi_->self, &task);
      running_word_.store(0, std::memory_order_release);
      if (abandoned_.exchange(false)) {  // the watchdog already answered the GPU for this task
        idle_since = now_ns();
        continue;
      }
      if (rc == 0) {
        served_.fetch_add(1, std::memory_order_acq_rel);
        done.store(1, std::memory_order_release);
        idle_since = now_ns();
        continue;
      }
      fail("layer " + std::to_string(layer) + ": CPU MoE executor failed: " + abi_->last_error(abi_->self));
    }
    // Errors still release the GPU (no hang); y is zero and the error waits for the next Python call.
    std::memset(y, 0, y_bytes <= layout_.bytes - layout_.y ? y_bytes : layout_.bytes - layout_.y);
    done.store(1, std::memory_order_release);
    idle_since = now_ns();
  }
}

void Coordinator::watch() {
  std::unique_lock<std::mutex> lock(watch_mutex_);
  const auto period = std::max(std::chrono::milliseconds(1), timeout_ / 10);
  while (!stop_.load(std::memory_order_acquire)) {
    watch_cv_.wait_for(lock, period);
    const uint64_t v = running_word_.load(std::memory_order_acquire);
    if (v == 0 || poisoned_.load(std::memory_order_acquire)) continue;
    const int64_t ran = now_ns() - running_since_.load(std::memory_order_relaxed);
    if (ran < std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count()) continue;
    // The executor cannot be interrupted: release the GPU, stop serving, and report. y stays as the
    // stuck task may still write it; it is never published.
    poisoned_.store(true, std::memory_order_release);
    abandoned_.store(true, std::memory_order_release);
    fail("layer " + std::to_string(v >> 32) + ": CPU MoE task of " + std::to_string(static_cast<uint32_t>(v)) +
         " tokens still running after " + std::to_string(ran / 1'000'000) + " ms (timeout_ms=" +
         std::to_string(timeout_.count()) + "); the GPU was released and this bridge stopped serving");
    word(layout_.done).store(1, std::memory_order_release);
  }
}

}  // namespace ftg
