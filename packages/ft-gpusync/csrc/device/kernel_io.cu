// Kernel IO of the bridge handshake: one source for CUDA (nvcc) and HIP (hipcc).
//
// ft_publish: copies a step's x / ids / weights into the pinned IO block through its mapped device
// address, then either rings the doorbell (some route goes to the CPU: done = 0, fence, doorbell) or,
// when no route does, sets done = 2 ("no CPU result") and rings nothing, so the CPU is never woken
// for an empty step. The stream's wait is for done >= 1.
// ft_combine: after the wait, reads y from the block and writes it into `out`, or adds it into the GPU
// partial already there; after done = 2 the CPU result is zero (y in the block is a stale one).
// Both run as one block: a decode step moves a few tens of KiB.
#include "compat.h"

extern "C" __global__ void ft_publish(const uint16_t* __restrict__ x, const int32_t* __restrict__ ids,
                                      const float* __restrict__ weights, uint32_t layer, uint32_t num_tokens,
                                      uint32_t hidden, uint32_t top_k, uint8_t* block, uint64_t off_doorbell,
                                      uint64_t off_done, uint64_t off_x, uint64_t off_ids, uint64_t off_weights) {
  const uint32_t n_x = num_tokens * hidden, n_r = num_tokens * top_k;
  uint16_t* bx = reinterpret_cast<uint16_t*>(block + off_x);
  int32_t* bids = reinterpret_cast<int32_t*>(block + off_ids);
  float* bw = reinterpret_cast<float*>(block + off_weights);
  int any = 0;
  for (uint32_t i = threadIdx.x; i < n_r; i += blockDim.x) {
    const int32_t id = ids[i];
    bids[i] = id;
    bw[i] = weights[i];
    any |= id >= 0;
  }
  any = __syncthreads_or(any);
  if (any) {
    for (uint32_t i = threadIdx.x; i < n_x; i += blockDim.x) bx[i] = x[i];
  }
  ft_fence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile uint64_t* done = reinterpret_cast<volatile uint64_t*>(block + off_done);
    volatile uint64_t* bell = reinterpret_cast<volatile uint64_t*>(block + off_doorbell);
    if (any) {
      *done = 0;
      ft_fence_system();
      *bell = (static_cast<uint64_t>(layer) << 32) | num_tokens;
    } else {
      *done = 2;
    }
    ft_fence_system();
  }
}

extern "C" __global__ void ft_combine(uint16_t* __restrict__ out, const uint8_t* block, uint64_t off_done,
                                      uint64_t off_y, uint32_t count, uint32_t accumulate) {
  const bool empty = *reinterpret_cast<const volatile uint64_t*>(block + off_done) == 2;
  if (empty && accumulate) return;
  const uint16_t* y = reinterpret_cast<const uint16_t*>(block + off_y);
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const uint16_t v = empty ? 0 : y[i];
    out[i] = accumulate ? ft_f32_to_bf16(ft_bf16_to_f32(out[i]) + ft_bf16_to_f32(v)) : v;
  }
}
