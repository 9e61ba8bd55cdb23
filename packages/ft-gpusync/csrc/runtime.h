// The GPU runtime a bridge drives, loaded with dlopen at run time so that the module imports on a
// machine without a GPU (the runtime is then reported unavailable, with the reason).
//
// CUDA: the driver API (libcuda.so.1): stream memory operations only exist there. HIP: the HIP runtime
// (libamdhip64.so). FT_GPUSYNC_CUDA_LIB / FT_GPUSYNC_HIP_LIB name another library (the tests load fake
// runtimes that fail chosen calls this way). Every call returns 0 or the runtime's own error code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ftg {

enum class Backend { cuda, hip };
const char* backend_name(Backend b);

class Runtime {
 public:
  explicit Runtime(Backend backend);  // never throws: see available() / reason()
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Backend backend() const { return backend_; }
  bool available() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }
  const std::string& library() const { return library_; }

  // Makes `device` current (CUDA: its primary context).
  int init(int device);
  int stream_create(void** stream);
  int stream_destroy(void* stream);
  int stream_sync(void* stream);
  int host_alloc_mapped(void** host, size_t bytes);
  int host_free(void* host);
  int device_pointer(void** device_ptr, void* host);
  int write_value64(void* stream, void* device_ptr, uint64_t value);
  int wait_value64_geq(void* stream, void* device_ptr, uint64_t value);
  int launch_host_func(void* stream, void (*fn)(void*), void* data);
  int is_capturing(void* stream, bool* capturing);
  // Device code: a CUDA fatbin or a HIP code object, and launches of its kernels.
  int module_load(void** module, const void* image);
  int module_function(void** fn, void* module, const char* name);
  int launch(void* fn, unsigned grid, unsigned block, void* stream, void** args);
  int copy_d2h_async(void* host, const void* device, size_t bytes, void* stream);
  int copy_h2d_async(void* device, const void* host, size_t bytes, void* stream);
  // Device memory and a synchronous upload: for the bench and tests (optional entry points).
  int device_alloc(void** device, size_t bytes);
  int device_free(void* device);
  int copy_h2d(void* device, const void* host, size_t bytes);
  // Appends a 64-bit write (or a wait for >= value) to the graph being captured on `stream` as an
  // explicit batch-memop node, for runtimes that do not record stream memops under capture. If making
  // the node the capture's new dependency fails, the node is destroyed and that error returned.
  int capture_memop_node(void* stream, bool write, void* device_ptr, uint64_t value);
  int begin_capture(void* stream);
  int end_capture(void* stream, void** graph);
  int instantiate(void** exec, void* graph);
  int graph_launch(void* exec, void* stream);
  int graph_destroy(void* graph);
  int exec_destroy(void* exec);
  // The sticky last error of the HIP runtime (peek leaves it, get clears it). The CUDA driver API
  // keeps no such state: both return 0 there.
  int peek_last_error();
  int get_last_error();
  std::string error_string(int code);

 private:
  void* sym(const char* name, bool required = true);
  Backend backend_;
  std::string library_, reason_;
  void* handle_ = nullptr;
  struct Fns;
  Fns* f_ = nullptr;
};

}  // namespace ftg
