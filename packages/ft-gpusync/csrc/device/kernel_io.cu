// Kernel IO of the bridge handshake: one source for CUDA (nvcc) and HIP (hipcc).
//
// ft_publish: copies a step's x / ids / weights into the pinned IO block through its mapped device
// address, then either rings the doorbell (some route goes to the CPU: done = 0, fence, doorbell) or,
// when no route does, sets done = 2 ("no CPU result") and rings nothing, so the CPU is never woken
// for an empty step.
// ft_combine: waits for done != 0 in the kernel, then reads y from the block and writes it into `out`,
// or adds it into the GPU partial already there; after done = 2 the CPU result is zero (y in the block
// is a stale one).
// Both run as one block: a decode step moves a few tens of KiB.
#include "compat.h"

namespace {

// Copies n 16-bit values; 16 bytes per thread and step when both ends and n allow it (one PCIe
// transaction moves 8 values instead of 1).
__device__ __forceinline__ void copy_u16(uint16_t* dst, const uint16_t* src, uint32_t n, uint32_t tid, uint32_t stride) {
  const bool vec = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0 && n % 8 == 0;
  if (vec) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (uint32_t i = tid; i < n / 8; i += stride) d[i] = s[i];
  } else {
    for (uint32_t i = tid; i < n; i += stride) dst[i] = src[i];
  }
}

__device__ __forceinline__ uint16_t add_bf16(uint16_t a, uint16_t b) {
  return ft_f32_to_bf16(ft_bf16_to_f32(a) + ft_bf16_to_f32(b));
}

}  // namespace

extern "C" __global__ void ft_publish(const uint16_t* __restrict__ x, const int32_t* __restrict__ ids,
                                      const float* __restrict__ weights, uint32_t layer, uint32_t num_tokens,
                                      uint32_t hidden, uint32_t top_k, uint8_t* block, uint64_t off_doorbell,
                                      uint64_t off_done, uint64_t off_x, uint64_t off_ids, uint64_t off_weights) {
  const uint32_t n_x = num_tokens * hidden, n_r = num_tokens * top_k;
  volatile uint64_t* done = reinterpret_cast<volatile uint64_t*>(block + off_done);
  volatile uint64_t* bell = reinterpret_cast<volatile uint64_t*>(block + off_doorbell);
  int any = 0;
  for (uint32_t i = threadIdx.x; i < n_r; i += blockDim.x) any |= ids[i] >= 0;
  if (!__syncthreads_or(any)) {
    // No route on the CPU: one word crosses PCIe, nothing else is written and the CPU is not woken.
    if (threadIdx.x == 0) {
      *done = 2;
      ft_fence_system();
    }
    return;
  }
  int32_t* bids = reinterpret_cast<int32_t*>(block + off_ids);
  float* bw = reinterpret_cast<float*>(block + off_weights);
  for (uint32_t i = threadIdx.x; i < n_r; i += blockDim.x) {
    bids[i] = ids[i];
    bw[i] = weights[i];
  }
  copy_u16(reinterpret_cast<uint16_t*>(block + off_x), x, n_x, threadIdx.x, blockDim.x);
  ft_fence_system();  // this thread's inputs reach the host before the doorbell (after the barrier)
  __syncthreads();
  if (threadIdx.x == 0) {
    *done = 0;
    ft_fence_system();
    *bell = (static_cast<uint64_t>(layer) << 32) | num_tokens;
    ft_fence_system();
  }
}

// Waits in the kernel: thread 0 of each block polls the done word until it is nonzero (every poll is one
// PCIe read, which paces the loop), so no stream wait sits between publish and combine and the two
// launches stay pipelined. 2 = the step had no CPU route: the CPU result is zero. The bound on the spin
// is the host's: its watchdog sets done on a stuck task.
extern "C" __global__ void ft_combine(uint16_t* __restrict__ out, const uint8_t* block, uint64_t off_done,
                                      uint64_t off_y, uint32_t count, uint32_t accumulate) {
  __shared__ int s_empty;
  if (threadIdx.x == 0) {
    const volatile uint64_t* done = reinterpret_cast<const volatile uint64_t*>(block + off_done);
    uint64_t v;
    while ((v = *done) == 0) {
    }
    ft_fence_system();  // acquire: y is read after done was seen
    s_empty = v == 2;
  }
  __syncthreads();
  const bool empty = s_empty != 0;
  if (empty && accumulate) return;  // nothing to add
  const uint16_t* y = reinterpret_cast<const uint16_t*>(block + off_y);
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  if (((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(y)) & 15) == 0 && count % 8 == 0) {
    const uint4* yv = reinterpret_cast<const uint4*>(y);
    uint4* ov = reinterpret_cast<uint4*>(out);
    for (uint32_t i = tid; i < count / 8; i += stride) {
      uint4 v = empty ? make_uint4(0, 0, 0, 0) : ft_load_host(yv + i);
      if (accumulate) {
        uint4 o = ov[i];
        uint16_t* a = reinterpret_cast<uint16_t*>(&o);
        const uint16_t* b = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = add_bf16(a[j], b[j]);
        v = o;
      }
      ov[i] = v;
    }
    return;
  }
  const volatile uint16_t* ys = y;
  for (uint32_t i = tid; i < count; i += stride) {
    const uint16_t v = empty ? 0 : ys[i];
    out[i] = accumulate ? add_bf16(out[i], v) : v;
  }
}
