// Layout of one bridge's IO block: the two handshake words and the task rows, in one allocation
// (pinned and mapped into the GPU's address space when a GPU backend owns it).
//
//   offset 0    doorbell  uint64  {layer:32 (high), num_tokens:32 (low)}; 0 = nothing to do
//   offset 64   done      uint64  0 while a task is pending, 1 once y holds its result
//   offset 128  x         bf16    [max_tokens, hidden]
//               ids       int32   [max_tokens, top_k]   (< 0: route not on the CPU)
//               weights   f32     [max_tokens, top_k]
//               y         bf16    [max_tokens, hidden]
// Every array starts on a 64-byte boundary. One task is in flight per block: the GPU writes x, ids and
// weights, sets done = 0, then writes the doorbell; the coordinator clears the doorbell, runs the task,
// writes y and sets done = 1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ftg {

inline size_t align64(size_t n) { return (n + 63) / 64 * 64; }

struct IoLayout {
  size_t doorbell = 0, done = 64, x = 128, ids = 0, weights = 0, y = 0, bytes = 0;

  IoLayout() = default;
  IoLayout(int max_tokens, int hidden, int top_k) {
    const size_t T = static_cast<size_t>(max_tokens);
    ids = align64(x + T * hidden * 2);
    weights = align64(ids + T * top_k * 4);
    y = align64(weights + T * top_k * 4);
    bytes = align64(y + T * hidden * 2);
  }
};

inline uint64_t doorbell_word(uint32_t layer, uint32_t num_tokens) {
  return (static_cast<uint64_t>(layer) << 32) | num_tokens;
}

}  // namespace ftg
