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
