/* ft-kernels-cpu C ABI: how native code outside this package runs a CPU MoE executor.
 *
 * Every MoeExecutor exports a PyCapsule named FT_MOE_EXECUTOR_CAPSULE holding a pointer to one
 * ft_moe_executor_abi. The capsule keeps the executor alive; the pointer is valid for as long as
 * the capsule is referenced. `run` may be called without the GIL from any thread, one call at a
 * time per executor (concurrent calls are serialised).
 *
 * Data layout of one task (all row-major, contiguous):
 *   x        [num_tokens, hidden]  bf16 (uint16 bit patterns)
 *   ids      [num_tokens, top_k]   int32, expert ids; a negative id is a skipped route
 *   weights  [num_tokens, top_k]   float32 router weights
 *   y        [num_tokens, hidden]  bf16, written (not accumulated)
 *
 * This header is plain C99 so that CUDA, HIP and C code can include it.
 */
#ifndef FT_KERNELS_CPU_MOE_ABI_H
#define FT_KERNELS_CPU_MOE_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FT_MOE_ABI_VERSION 1u
#define FT_MOE_EXECUTOR_CAPSULE "ft_kernels_cpu.moe_executor_abi"

typedef struct ft_moe_task {
  int32_t layer;      /* layer id given to add_layer */
  int32_t num_tokens; /* 0 <= num_tokens <= max_tokens */
  const void* x;
  const int32_t* ids;
  const float* weights;
  void* y;
} ft_moe_task;

typedef struct ft_moe_executor_abi {
  uint32_t abi_version; /* FT_MOE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(ft_moe_executor_abi) of the producer */
  void* self;           /* opaque executor pointer, first argument of the calls below */
  /* Blocking: returns 0 on success, nonzero on error (then last_error says why). */
  int (*run)(void* self, const ft_moe_task* task);
  /* The message of the last failed run on this executor; "" when none. Valid until the next run. */
  const char* (*last_error)(void* self);
  int32_t hidden;
  int32_t top_k;
  int32_t max_tokens;
  int32_t num_threads;
} ft_moe_executor_abi;

#ifdef __cplusplus
}
#endif

#endif /* FT_KERNELS_CPU_MOE_ABI_H */
