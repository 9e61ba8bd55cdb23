#include "probe.h"

#include <atomic>
#include <cstdint>

namespace ftg {

ErrorScope::ErrorScope(Runtime& rt, const char* what) : rt_(rt) {
  const int pending = rt.peek_last_error();
  if (pending != 0) {
    throw PendingError(std::string("an earlier ") + backend_name(rt.backend()) + " error is pending (" +
                       rt.error_string(pending) + "); the " + what + " probe did not run and left it in place");
  }
}

ErrorScope::~ErrorScope() { rt_.get_last_error(); }

namespace {

std::string failed(Runtime& rt, const char* call, int rc) { return std::string(call) + " failed: " + rt.error_string(rc); }

}  // namespace

ProbeResult probe_memop_graph(Runtime& rt, int device) {
  if (!rt.available()) return {false, rt.reason()};
  ErrorScope scope(rt, "memop graph");
  ProbeResult r;
  void *stream = nullptr, *host = nullptr, *dev = nullptr, *graph = nullptr, *exec = nullptr;
  int rc = rt.init(device);
  if (rc) return {false, failed(rt, "init", rc)};
  if ((rc = rt.stream_create(&stream))) return {false, failed(rt, "stream create", rc)};
  if ((rc = rt.host_alloc_mapped(&host, 64))) {
    rt.stream_destroy(stream);
    return {false, failed(rt, "mapped host alloc", rc)};
  }
  auto* word = static_cast<std::atomic<uint64_t>*>(host);
  word->store(0);
  if ((rc = rt.device_pointer(&dev, host))) {
    r.detail = failed(rt, "device pointer", rc);
  } else if ((rc = rt.begin_capture(stream))) {
    r.detail = failed(rt, "begin capture", rc);
  } else {
    int op = rt.write_value64(stream, dev, 7);
    const char* what = "stream write value";
    if (!op) {
      op = rt.wait_value64_geq(stream, dev, 7);
      what = "stream wait value";
    }
    // Always end the capture, also after a failed operation: the stream must leave capture mode.
    const int end = rt.end_capture(stream, &graph);
    if (op) {
      r.detail = failed(rt, what, op) + " under capture";
    } else if (end) {
      r.detail = failed(rt, "end capture", end);
    } else if ((rc = rt.instantiate(&exec, graph))) {
      r.detail = failed(rt, "graph instantiate", rc);
    } else if ((rc = rt.graph_launch(exec, stream)) || (rc = rt.stream_sync(stream))) {
      r.detail = failed(rt, "graph replay", rc);
    } else if (word->load() != 7) {
      r.detail = "graph replay ran but the word reads " + std::to_string(word->load()) + ", not 7";
    } else {
      r.supported = true;
      r.detail = "64-bit stream write/wait captured and replayed";
    }
  }
  if (exec) rt.exec_destroy(exec);
  if (graph) rt.graph_destroy(graph);
  rt.host_free(host);
  rt.stream_destroy(stream);
  return r;
}

ProbeResult host_func_replay_safe(Backend backend) {
  if (backend == Backend::cuda) return {true, "host-function nodes replay on CUDA"};
  return {false, "host-function nodes are not replay-safe on ROCm"};
}

void check_host_func_allowed(Runtime& rt, void* stream) {
  bool capturing = false;
  const int rc = rt.is_capturing(stream, &capturing);
  if (rc) throw std::runtime_error(failed(rt, "stream capture status", rc));
  if (capturing && !host_func_replay_safe(rt.backend()).supported) {
    throw std::runtime_error(
        "the host-func handshake cannot be captured on ROCm: its host-function nodes do not replay correctly "
        "(wrong outputs, no error). Use the memop or kernel handshake, or run without CUDA graphs "
        "(--cuda-graph-max-bs 0).");
  }
}

}  // namespace ftg
