// Start-up probes of what a runtime can do, each inside an error scope so that a failed probe leaves
// the runtime as usable as it found it.
#pragma once

#include <stdexcept>
#include <string>

#include "runtime.h"

namespace ftg {

// The caller already had an error pending when a probe started: the probe did not run, and the
// error was left in place for its owner to see.
class PendingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Entering: refuse (PendingError) if the runtime holds a sticky error. Leaving, after the probe's own
// cleanup: consume the sticky error the probe may have left (HIP), so eager work stays usable.
class ErrorScope {
 public:
  ErrorScope(Runtime& rt, const char* what);
  ~ErrorScope();
  ErrorScope(const ErrorScope&) = delete;
  ErrorScope& operator=(const ErrorScope&) = delete;

 private:
  Runtime& rt_;
};

struct ProbeResult {
  bool supported = false;
  std::string detail;
};

// Captures a 64-bit stream write and wait into a graph, instantiates and replays it, and checks
// the word: the memop handshake works in graph replay.
ProbeResult probe_memop_graph(Runtime& rt, int device);

// Whether host-function nodes are replay-safe: yes on CUDA, no on ROCm.
ProbeResult host_func_replay_safe(Backend backend);

// Throws if a host function is about to be enqueued on a capturing stream where replay would not
// run it correctly (ROCm); the message says how to run instead.
void check_host_func_allowed(Runtime& rt, void* stream);

}  // namespace ftg
