// Everything that differs between CUDA and HIP device code, in one place: kernels include this and
// never name cuda* or hip* themselves.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define FT_DEVICE_BACKEND "hip"
#else
#define FT_DEVICE_BACKEND "cuda"
#endif

#include <stdint.h>

// Make every earlier write of this thread visible to the host (and to PCIe peers) before later ones.
__device__ __forceinline__ void ft_fence_system() { __threadfence_system(); }

// A 16-byte load from mapped host memory that no cache of the GPU may answer (the CPU wrote it).
__device__ __forceinline__ uint4 ft_load_host(const uint4* p) {
#if defined(__HIPCC__)
  // mapped host memory is fine-grained (uncached) on ROCm; volatile keeps the compiler from reusing a load
  const volatile uint32_t* w = reinterpret_cast<const volatile uint32_t*>(p);
  return make_uint4(w[0], w[1], w[2], w[3]);
#else
  return __ldcv(p);
#endif
}

__device__ __forceinline__ float ft_bf16_to_f32(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

__device__ __forceinline__ uint16_t ft_f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  const uint32_t b = __float_as_uint(f);
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu)) return static_cast<uint16_t>((b >> 16) | 0x40u);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
