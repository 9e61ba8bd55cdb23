#include "runtime.h"

#include <dlfcn.h>

#include <cstdlib>

namespace ftg {

// Constants from the public CUDA driver and HIP runtime headers (this file includes neither).
namespace k {
constexpr unsigned kCuMemHostAllocPortable = 0x01, kCuMemHostAllocDeviceMap = 0x02;
constexpr unsigned kCuStreamNonBlocking = 0x1;
constexpr unsigned kCuWaitValueGeq = 0x0;
constexpr int kCuCaptureModeRelaxed = 2;
constexpr unsigned kHipHostMallocPortable = 0x1, kHipHostMallocMapped = 0x2;
constexpr unsigned kHipStreamNonBlocking = 0x1;
constexpr unsigned kHipWaitValueGte = 0x0;
constexpr int kHipCaptureModeRelaxed = 2;
}  // namespace k

const char* backend_name(Backend b) { return b == Backend::cuda ? "cuda" : "hip"; }

// Raw entry points, typed with plain pointers and integers (handles are opaque pointers, CUdeviceptr
// is a 64-bit integer on every supported platform).
struct Runtime::Fns {
  // CUDA driver
  int (*cuInit)(unsigned);
  int (*cuDeviceGet)(int*, int);
  int (*cuDevicePrimaryCtxRetain)(void**, int);
  int (*cuCtxSetCurrent)(void*);
  int (*cuStreamCreate)(void**, unsigned);
  int (*cuStreamDestroy)(void*);
  int (*cuStreamSynchronize)(void*);
  int (*cuMemHostAlloc)(void**, size_t, unsigned);
  int (*cuMemFreeHost)(void*);
  int (*cuMemHostGetDevicePointer)(uint64_t*, void*, unsigned);
  int (*cuStreamWriteValue64)(void*, uint64_t, uint64_t, unsigned);
  int (*cuStreamWaitValue64)(void*, uint64_t, uint64_t, unsigned);
  int (*cuLaunchHostFunc)(void*, void (*)(void*), void*);
  int (*cuStreamBeginCapture)(void*, int);
  int (*cuStreamEndCapture)(void*, void**);
  int (*cuGraphInstantiateWithFlags)(void**, void*, unsigned long long);
  int (*cuGraphLaunch)(void*, void*);
  int (*cuGraphDestroy)(void*);
  int (*cuGraphExecDestroy)(void*);
  int (*cuGetErrorString)(int, const char**);
  int (*cuStreamIsCapturing)(void*, int*);
  int (*cuModuleLoadData)(void**, const void*);
  int (*cuModuleGetFunction)(void**, void*, const char*);
  int (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);
  int (*cuMemcpyDtoHAsync)(void*, uint64_t, size_t, void*);
  int (*cuMemcpyHtoDAsync)(uint64_t, const void*, size_t, void*);
  int (*cuStreamGetCaptureInfo)(void*, int*, uint64_t*, void**, const void**, const void**, size_t*);
  int (*cuGraphAddBatchMemOpNode)(void**, void*, const void*, size_t, const void*);
  int (*cuStreamUpdateCaptureDependencies)(void*, void**, const void*, size_t, unsigned);
  int (*cuGraphDestroyNode)(void*);
  int (*cuMemAlloc)(uint64_t*, size_t);
  int (*cuMemFree)(uint64_t);
  int (*cuMemcpyHtoD)(uint64_t, const void*, size_t);
  // HIP runtime
  int (*hipInit)(unsigned);
  int (*hipSetDevice)(int);
  int (*hipStreamCreateWithFlags)(void**, unsigned);
  int (*hipStreamDestroy)(void*);
  int (*hipStreamSynchronize)(void*);
  int (*hipHostMalloc)(void**, size_t, unsigned);
  int (*hipHostFree)(void*);
  int (*hipHostGetDevicePointer)(void**, void*, unsigned);
  int (*hipStreamWriteValue64)(void*, void*, uint64_t, unsigned);
  int (*hipStreamWaitValue64)(void*, void*, uint64_t, unsigned, uint64_t);
  int (*hipLaunchHostFunc)(void*, void (*)(void*), void*);
  int (*hipStreamBeginCapture)(void*, int);
  int (*hipStreamEndCapture)(void*, void**);
  int (*hipGraphInstantiateWithFlags)(void**, void*, unsigned long long);
  int (*hipGraphLaunch)(void*, void*);
  int (*hipGraphDestroy)(void*);
  int (*hipGraphExecDestroy)(void*);
  int (*hipGetLastError)();
  int (*hipPeekAtLastError)();
  const char* (*hipGetErrorString)(int);
  int (*hipStreamIsCapturing)(void*, int*);
  int (*hipModuleLoadData)(void**, const void*);
  int (*hipModuleGetFunction)(void**, void*, const char*);
  int (*hipModuleLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void**, void**);
  int (*hipMemcpyDtoHAsync)(void*, const void*, size_t, void*);
  int (*hipMemcpyHtoDAsync)(void*, const void*, size_t, void*);
  int (*hipStreamGetCaptureInfo_v2)(void*, int*, uint64_t*, void**, const void**, size_t*);
  int (*hipGraphAddBatchMemOpNode)(void**, void*, const void*, size_t, const void*);
  int (*hipStreamUpdateCaptureDependencies)(void*, void**, size_t, unsigned);
  int (*hipGraphDestroyNode)(void*);
  int (*hipMalloc)(void**, size_t);
  int (*hipFree)(void*);
  int (*hipMemcpyHtoD)(void*, const void*, size_t);
};

// Batch memop parameters: the same layout in both runtimes (CUstreamBatchMemOpParams_v1 /
// hipStreamBatchMemOpParams, 48 bytes; CUDA_BATCH_MEM_OP_NODE_PARAMS_v1 / hipBatchMemOpNodeParams).
struct MemOpParams {
  uint32_t operation;  // 4: wait value 64, 5: write value 64
  uint64_t address;
  uint64_t value64;
  uint32_t flags;      // wait: 0 = greater or equal
  uint64_t alias;
  uint64_t pad[1];  // the union is 6 x 64 bits
};
static_assert(sizeof(MemOpParams) == 48, "batch memop params are 48 bytes");
struct MemOpNodeParams {
  void* ctx;
  unsigned count;
  MemOpParams* params;
  unsigned flags;
};

void* Runtime::sym(const char* name, bool required) {
  void* p = dlsym(handle_, name);
  if (!p && required && reason_.empty()) reason_ = library_ + " has no symbol " + name;
  return p;
}

#define FT_SYM(field, name) f_->field = reinterpret_cast<decltype(f_->field)>(sym(name))
// Optional entry points (absent in some runtime versions): calls through them report kMissing.
#define FT_SYM_OPT(field, name) f_->field = reinterpret_cast<decltype(f_->field)>(sym(name, false))
constexpr int kMissing = -2;

Runtime::Runtime(Backend backend) : backend_(backend), f_(new Fns{}) {
  const char* env = std::getenv(backend == Backend::cuda ? "FT_GPUSYNC_CUDA_LIB" : "FT_GPUSYNC_HIP_LIB");
  library_ = env && *env ? env : (backend == Backend::cuda ? "libcuda.so.1" : "libamdhip64.so");
  handle_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    reason_ = "cannot load " + library_ + ": " + (why ? why : "unknown error");
    return;
  }
  if (backend == Backend::cuda) {
    FT_SYM(cuInit, "cuInit");
    FT_SYM(cuDeviceGet, "cuDeviceGet");
    FT_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    FT_SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    FT_SYM(cuStreamCreate, "cuStreamCreate");
    FT_SYM(cuStreamDestroy, "cuStreamDestroy_v2");
    FT_SYM(cuStreamSynchronize, "cuStreamSynchronize");
    FT_SYM(cuMemHostAlloc, "cuMemHostAlloc");
    FT_SYM(cuMemFreeHost, "cuMemFreeHost");
    FT_SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    FT_SYM(cuStreamWriteValue64, "cuStreamWriteValue64_v2");
    FT_SYM(cuStreamWaitValue64, "cuStreamWaitValue64_v2");
    FT_SYM(cuLaunchHostFunc, "cuLaunchHostFunc");
    FT_SYM(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    FT_SYM(cuStreamEndCapture, "cuStreamEndCapture");
    FT_SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    FT_SYM(cuGraphLaunch, "cuGraphLaunch");
    FT_SYM(cuGraphDestroy, "cuGraphDestroy");
    FT_SYM(cuGraphExecDestroy, "cuGraphExecDestroy");
    FT_SYM(cuGetErrorString, "cuGetErrorString");
    FT_SYM(cuStreamIsCapturing, "cuStreamIsCapturing");
    FT_SYM(cuModuleLoadData, "cuModuleLoadData");
    FT_SYM(cuModuleGetFunction, "cuModuleGetFunction");
    FT_SYM(cuLaunchKernel, "cuLaunchKernel");
    FT_SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    FT_SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    FT_SYM_OPT(cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo_v3");
    FT_SYM_OPT(cuGraphAddBatchMemOpNode, "cuGraphAddBatchMemOpNode");
    FT_SYM_OPT(cuStreamUpdateCaptureDependencies, "cuStreamUpdateCaptureDependencies_v2");
    FT_SYM_OPT(cuGraphDestroyNode, "cuGraphDestroyNode");
    // Device buffers for the bench and tests only (the bridge itself never allocates device memory).
    FT_SYM_OPT(cuMemAlloc, "cuMemAlloc_v2");
    FT_SYM_OPT(cuMemFree, "cuMemFree_v2");
    FT_SYM_OPT(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  } else {
    FT_SYM(hipInit, "hipInit");
    FT_SYM(hipSetDevice, "hipSetDevice");
    FT_SYM(hipStreamCreateWithFlags, "hipStreamCreateWithFlags");
    FT_SYM(hipStreamDestroy, "hipStreamDestroy");
    FT_SYM(hipStreamSynchronize, "hipStreamSynchronize");
    FT_SYM(hipHostMalloc, "hipHostMalloc");
    FT_SYM(hipHostFree, "hipHostFree");
    FT_SYM(hipHostGetDevicePointer, "hipHostGetDevicePointer");
    FT_SYM(hipStreamWriteValue64, "hipStreamWriteValue64");
    FT_SYM(hipStreamWaitValue64, "hipStreamWaitValue64");
    FT_SYM_OPT(hipLaunchHostFunc, "hipLaunchHostFunc");
    FT_SYM(hipStreamBeginCapture, "hipStreamBeginCapture");
    FT_SYM(hipStreamEndCapture, "hipStreamEndCapture");
    FT_SYM(hipGraphInstantiateWithFlags, "hipGraphInstantiateWithFlags");
    FT_SYM(hipGraphLaunch, "hipGraphLaunch");
    FT_SYM(hipGraphDestroy, "hipGraphDestroy");
    FT_SYM(hipGraphExecDestroy, "hipGraphExecDestroy");
    FT_SYM(hipGetLastError, "hipGetLastError");
    FT_SYM(hipPeekAtLastError, "hipPeekAtLastError");
    FT_SYM(hipGetErrorString, "hipGetErrorString");
    FT_SYM(hipStreamIsCapturing, "hipStreamIsCapturing");
    FT_SYM(hipModuleLoadData, "hipModuleLoadData");
    FT_SYM(hipModuleGetFunction, "hipModuleGetFunction");
    FT_SYM(hipModuleLaunchKernel, "hipModuleLaunchKernel");
    FT_SYM(hipMemcpyDtoHAsync, "hipMemcpyDtoHAsync");
    FT_SYM(hipMemcpyHtoDAsync, "hipMemcpyHtoDAsync");
    // Newer ROCm only (absent from the headers and library of ROCm 5.x): looked up, never linked.
    FT_SYM_OPT(hipStreamGetCaptureInfo_v2, "hipStreamGetCaptureInfo_v2");
    FT_SYM_OPT(hipGraphAddBatchMemOpNode, "hipGraphAddBatchMemOpNode");
    FT_SYM_OPT(hipStreamUpdateCaptureDependencies, "hipStreamUpdateCaptureDependencies");
    FT_SYM_OPT(hipGraphDestroyNode, "hipGraphDestroyNode");
    FT_SYM_OPT(hipMalloc, "hipMalloc");
    FT_SYM_OPT(hipFree, "hipFree");
    FT_SYM_OPT(hipMemcpyHtoD, "hipMemcpyHtoD");
  }
}
#undef FT_SYM
#undef FT_SYM_OPT

Runtime::~Runtime() {
  // The library stays loaded: other code in the process (torch) uses the same runtime.
  delete f_;
}

#define FT_CALL(cuda_expr, hip_expr)                     \
  do {                                                  \
    if (!available()) return -1;                        \
    return backend_ == Backend::cuda ? (cuda_expr) : (hip_expr); \
  } while (0)

int Runtime::init(int device) {
  if (!available()) return -1;
  if (backend_ == Backend::hip) {
    int rc = f_->hipInit(0);
    return rc ? rc : f_->hipSetDevice(device);
  }
  int rc = f_->cuInit(0);
  int dev = 0;
  if (!rc) rc = f_->cuDeviceGet(&dev, device);
  void* ctx = nullptr;
  if (!rc) rc = f_->cuDevicePrimaryCtxRetain(&ctx, dev);
  if (!rc) rc = f_->cuCtxSetCurrent(ctx);
  return rc;
}

int Runtime::stream_create(void** s) {
  FT_CALL(f_->cuStreamCreate(s, k::kCuStreamNonBlocking), f_->hipStreamCreateWithFlags(s, k::kHipStreamNonBlocking));
}
int Runtime::stream_destroy(void* s) { FT_CALL(f_->cuStreamDestroy(s), f_->hipStreamDestroy(s)); }
int Runtime::stream_sync(void* s) { FT_CALL(f_->cuStreamSynchronize(s), f_->hipStreamSynchronize(s)); }
int Runtime::host_alloc_mapped(void** p, size_t bytes) {
  FT_CALL(f_->cuMemHostAlloc(p, bytes, k::kCuMemHostAllocPortable | k::kCuMemHostAllocDeviceMap),
          f_->hipHostMalloc(p, bytes, k::kHipHostMallocPortable | k::kHipHostMallocMapped));
}
int Runtime::host_free(void* p) { FT_CALL(f_->cuMemFreeHost(p), f_->hipHostFree(p)); }
int Runtime::device_pointer(void** d, void* host) {
  if (!available()) return -1;
  if (backend_ == Backend::hip) return f_->hipHostGetDevicePointer(d, host, 0);
  uint64_t dp = 0;
  const int rc = f_->cuMemHostGetDevicePointer(&dp, host, 0);
  *d = reinterpret_cast<void*>(static_cast<uintptr_t>(dp));
  return rc;
}
int Runtime::write_value64(void* s, void* d, uint64_t v) {
  FT_CALL(f_->cuStreamWriteValue64(s, reinterpret_cast<uintptr_t>(d), v, 0), f_->hipStreamWriteValue64(s, d, v, 0));
}
int Runtime::wait_value64_geq(void* s, void* d, uint64_t v) {
  FT_CALL(f_->cuStreamWaitValue64(s, reinterpret_cast<uintptr_t>(d), v, k::kCuWaitValueGeq),
          f_->hipStreamWaitValue64(s, d, v, k::kHipWaitValueGte, ~0ull));
}
int Runtime::launch_host_func(void* s, void (*fn)(void*), void* data) {
  if (backend_ == Backend::hip && available() && !f_->hipLaunchHostFunc) return kMissing;
  FT_CALL(f_->cuLaunchHostFunc(s, fn, data), f_->hipLaunchHostFunc(s, fn, data));
}
int Runtime::is_capturing(void* s, bool* capturing) {
  if (!available()) return -1;
  int status = 0;  // 0 = none, 1 = active, 2 = invalidated (same values in both runtimes)
  const int rc = backend_ == Backend::cuda ? f_->cuStreamIsCapturing(s, &status) : f_->hipStreamIsCapturing(s, &status);
  *capturing = status != 0;
  return rc;
}
int Runtime::module_load(void** m, const void* image) {
  FT_CALL(f_->cuModuleLoadData(m, image), f_->hipModuleLoadData(m, image));
}
int Runtime::module_function(void** fn, void* m, const char* name) {
  FT_CALL(f_->cuModuleGetFunction(fn, m, name), f_->hipModuleGetFunction(fn, m, name));
}
int Runtime::launch(void* fn, unsigned grid, unsigned block, void* s, void** args) {
  FT_CALL(f_->cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, s, args, nullptr),
          f_->hipModuleLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, s, args, nullptr));
}
int Runtime::copy_d2h_async(void* host, const void* dev, size_t bytes, void* s) {
  FT_CALL(f_->cuMemcpyDtoHAsync(host, reinterpret_cast<uintptr_t>(dev), bytes, s),
          f_->hipMemcpyDtoHAsync(host, dev, bytes, s));
}
int Runtime::copy_h2d_async(void* dev, const void* host, size_t bytes, void* s) {
  FT_CALL(f_->cuMemcpyHtoDAsync(reinterpret_cast<uintptr_t>(dev), host, bytes, s),
          f_->hipMemcpyHtoDAsync(dev, host, bytes, s));
}
int Runtime::device_alloc(void** p, size_t bytes) {
  if (!available()) return -1;
  if (backend_ == Backend::hip) return f_->hipMalloc ? f_->hipMalloc(p, bytes) : kMissing;
  if (!f_->cuMemAlloc) return kMissing;
  uint64_t d = 0;
  const int rc = f_->cuMemAlloc(&d, bytes);
  *p = reinterpret_cast<void*>(static_cast<uintptr_t>(d));
  return rc;
}
int Runtime::device_free(void* p) {
  if (!available()) return -1;
  if (backend_ == Backend::hip) return f_->hipFree ? f_->hipFree(p) : kMissing;
  return f_->cuMemFree ? f_->cuMemFree(reinterpret_cast<uintptr_t>(p)) : kMissing;
}
int Runtime::copy_h2d(void* dev, const void* host, size_t bytes) {
  if (!available()) return -1;
  if (backend_ == Backend::hip) return f_->hipMemcpyHtoD ? f_->hipMemcpyHtoD(dev, host, bytes) : kMissing;
  return f_->cuMemcpyHtoD ? f_->cuMemcpyHtoD(reinterpret_cast<uintptr_t>(dev), host, bytes) : kMissing;
}
int Runtime::capture_memop_node(void* s, bool write, void* dptr, uint64_t value) {
  if (!available()) return -1;
  const bool cuda = backend_ == Backend::cuda;
  if (cuda ? !(f_->cuStreamGetCaptureInfo && f_->cuGraphAddBatchMemOpNode && f_->cuStreamUpdateCaptureDependencies &&
               f_->cuGraphDestroyNode)
           : !(f_->hipStreamGetCaptureInfo_v2 && f_->hipGraphAddBatchMemOpNode &&
               f_->hipStreamUpdateCaptureDependencies && f_->hipGraphDestroyNode)) {
    return kMissing;
  }
  int status = 0;
  uint64_t id = 0;
  void* graph = nullptr;
  const void* deps = nullptr;
  const void* edges = nullptr;
  size_t ndeps = 0;
  int rc = cuda ? f_->cuStreamGetCaptureInfo(s, &status, &id, &graph, &deps, &edges, &ndeps)
                : f_->hipStreamGetCaptureInfo_v2(s, &status, &id, &graph, &deps, &ndeps);
  if (rc) return rc;
  MemOpParams op{};
  op.operation = write ? 5 : 4;
  op.address = reinterpret_cast<uintptr_t>(dptr);
  op.value64 = value;
  MemOpNodeParams np{nullptr, 1, &op, 0};
  void* node = nullptr;
  rc = cuda ? f_->cuGraphAddBatchMemOpNode(&node, graph, deps, ndeps, &np)
            : f_->hipGraphAddBatchMemOpNode(&node, graph, deps, ndeps, &np);
  if (rc) return rc;
  rc = cuda ? f_->cuStreamUpdateCaptureDependencies(s, &node, nullptr, 1, 1)
            : f_->hipStreamUpdateCaptureDependencies(s, &node, 1, 1);  // 1: set, not add
  if (rc) {
    // The node is in the graph but nothing depends on it: remove it, report the update's error.
    if (cuda) {
      f_->cuGraphDestroyNode(node);
    } else {
      f_->hipGraphDestroyNode(node);
    }
    return rc;
  }
  return 0;
}

int Runtime::begin_capture(void* s) {
  FT_CALL(f_->cuStreamBeginCapture(s, k::kCuCaptureModeRelaxed), f_->hipStreamBeginCapture(s, k::kHipCaptureModeRelaxed));
}
int Runtime::end_capture(void* s, void** g) { FT_CALL(f_->cuStreamEndCapture(s, g), f_->hipStreamEndCapture(s, g)); }
int Runtime::instantiate(void** e, void* g) {
  FT_CALL(f_->cuGraphInstantiateWithFlags(e, g, 0), f_->hipGraphInstantiateWithFlags(e, g, 0));
}
int Runtime::graph_launch(void* e, void* s) { FT_CALL(f_->cuGraphLaunch(e, s), f_->hipGraphLaunch(e, s)); }
int Runtime::graph_destroy(void* g) { FT_CALL(f_->cuGraphDestroy(g), f_->hipGraphDestroy(g)); }
int Runtime::exec_destroy(void* e) { FT_CALL(f_->cuGraphExecDestroy(e), f_->hipGraphExecDestroy(e)); }
int Runtime::peek_last_error() { FT_CALL(0, f_->hipPeekAtLastError()); }
int Runtime::get_last_error() { FT_CALL(0, f_->hipGetLastError()); }
#undef FT_CALL

std::string Runtime::error_string(int code) {
  if (code == kMissing) return std::string(backend_name(backend_)) + " runtime " + library_ + " lacks this call";
  const char* s = nullptr;
  if (available()) {
    if (backend_ == Backend::cuda) {
      f_->cuGetErrorString(code, &s);
    } else {
      s = f_->hipGetErrorString(code);
    }
  }
  return std::string(backend_name(backend_)) + " error " + std::to_string(code) + (s ? std::string(" (") + s + ")" : "");
}

}  // namespace ftg
