#include "bridge.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

extern const unsigned char ft_kernel_image[];
extern const size_t ft_kernel_image_size;

namespace ftg {

const char* handshake_name(Handshake h) {
  switch (h) {
    case Handshake::kernel: return "kernel";
    case Handshake::memop: return "memop";
    case Handshake::host_func: return "host-func";
  }
  return "?";
}

namespace {

std::string failed(Runtime& rt, const char* what, int rc) { return std::string(what) + " failed: " + rt.error_string(rc); }

constexpr unsigned kPublishThreads = 256;

int launch_publish(Runtime& rt, const KernelIo& k, void* stream, const void* x, const void* ids, const void* w,
                   uint32_t layer, uint32_t tokens, uint32_t hidden, uint32_t top_k, uint8_t* dev_block,
                   const IoLayout& l) {
  uint64_t od = l.doorbell, on = l.done, ox = l.x, oi = l.ids, ow = l.weights;
  void* args[] = {&x, &ids, &w, &layer, &tokens, &hidden, &top_k, &dev_block, &od, &on, &ox, &oi, &ow};
  return rt.launch(k.publish, 1, kPublishThreads, stream, args);
}

int launch_combine(Runtime& rt, const KernelIo& k, void* stream, void* out, uint8_t* dev_block, const IoLayout& l,
                   uint32_t count, bool accumulate) {
  uint64_t od = l.done, oy = l.y;
  uint32_t acc = accumulate ? 1 : 0;
  void* args[] = {&out, &dev_block, &od, &oy, &count, &acc};
  const unsigned items = count % 8 == 0 ? count / 8 : count;  // 8 values per thread on the vector path
  const unsigned grid = std::max(1u, std::min(64u, (items + 255) / 256));
  return rt.launch(k.combine, grid, 256, stream, args);
}

// Host-function handshake: these run on the runtime's callback thread, in stream order.
void host_ring(void* data) {
  auto* t = static_cast<Bridge::HostFuncTask*>(data);
  uint8_t* b = t->bridge->host_block();
  const IoLayout& l = t->bridge->layout();
  reinterpret_cast<std::atomic<uint64_t>*>(b + l.done)->store(0, std::memory_order_relaxed);
  reinterpret_cast<std::atomic<uint64_t>*>(b + l.doorbell)->store(t->word, std::memory_order_release);
}

void host_wait(void* data) {
  auto* t = static_cast<Bridge::HostFuncTask*>(data);
  auto* done = reinterpret_cast<std::atomic<uint64_t>*>(t->bridge->host_block() + t->bridge->layout().done);
  // The coordinator's watchdog sets done on a stuck task, so this ends.
  while (done->load(std::memory_order_acquire) == 0) std::this_thread::yield();
}

}  // namespace

ProbeResult probe_kernel_io(Runtime& rt, int device, KernelIo* out) {
  if (ft_kernel_image_size == 0) return {false, "this ft_gpusync was built with FT_GPU_BACKEND=none (no kernel image)"};
  if (!rt.available()) return {false, rt.reason()};
  ErrorScope scope(rt, "kernel-IO");
  int rc = rt.init(device);
  if (rc) return {false, failed(rt, "init", rc)};
  KernelIo k;
  if ((rc = rt.module_load(&k.module, ft_kernel_image))) return {false, failed(rt, "kernel image load", rc)};
  if ((rc = rt.module_function(&k.publish, k.module, "ft_publish")) ||
      (rc = rt.module_function(&k.combine, k.module, "ft_combine"))) {
    return {false, failed(rt, "kernel lookup", rc)};
  }
  // Scratch: an IO block for one token of 64 values and one route, plus inputs and an output row.
  const IoLayout l(1, 64, 1);
  const size_t in_off = l.bytes, out_off = in_off + 256;
  void *stream = nullptr, *host = nullptr, *dev = nullptr;
  if ((rc = rt.stream_create(&stream))) return {false, failed(rt, "stream create", rc)};
  ProbeResult r;
  if ((rc = rt.host_alloc_mapped(&host, out_off + 256))) {
    r.detail = failed(rt, "mapped host alloc", rc);
  } else if ((rc = rt.device_pointer(&dev, host))) {
    r.detail = failed(rt, "device pointer", rc);
  } else {
    uint8_t* h = static_cast<uint8_t*>(host);
    uint8_t* d = static_cast<uint8_t*>(dev);
    std::memset(h, 0, out_off + 256);
    *reinterpret_cast<int32_t*>(h + in_off + 128) = -1;  // the step's only route is not on the CPU
    uint16_t* y = reinterpret_cast<uint16_t*>(h + l.y);
    uint16_t* o = reinterpret_cast<uint16_t*>(h + out_off);
    for (int i = 0; i < 64; ++i) {
      y[i] = 0x3f80;  // 1.0
      o[i] = 0x4000;  // 2.0
    }
    auto* done = reinterpret_cast<std::atomic<uint64_t>*>(h + l.done);
    auto* bell = reinterpret_cast<std::atomic<uint64_t>*>(h + l.doorbell);
    done->store(3);  // nonzero: a combine after a publish that did not run finds it and cannot spin
    if ((rc = launch_publish(rt, k, stream, d + in_off, d + in_off + 128, d + in_off + 192, 3, 1, 64, 1, d, l)) ||
        (rc = launch_combine(rt, k, stream, d + out_off, d, l, 64, true)) || (rc = rt.stream_sync(stream))) {
      r.detail = failed(rt, "kernel-IO launch", rc);
    } else if (done->load() != 2 || bell->load() != 0) {
      r.detail = "publish of a step without CPU routes must set done = 2 and ring nothing";
    } else if (o[0] != 0x4000 || o[63] != 0x4000) {  // an empty step adds nothing to 2.0
      r.detail = "combine after an empty step changed the output";
    } else if ((done->store(1), rc = launch_combine(rt, k, stream, d + out_off, d, l, 64, true)) ||
               (rc = rt.stream_sync(stream))) {
      r.detail = failed(rt, "combine launch", rc);
    } else if (o[0] != 0x4040 || o[63] != 0x4040) {  // 2 + 1 = 3.0
      r.detail = "combine did not add y into the output";
    } else {
      r.supported = true;
      r.detail = "publish and combine kernels ran on scratch memory";
      *out = k;
    }
  }
  if (host) rt.host_free(host);
  rt.stream_destroy(stream);
  return r;
}

Bridge::Bridge(Runtime& rt, const ft_moe_executor_abi* abi, int device, int max_tokens, int hidden, int top_k,
               const std::string& handshake, std::chrono::milliseconds timeout)
    : rt_(rt), hidden_(hidden), top_k_(top_k), max_tokens_(max_tokens), layout_(max_tokens, hidden, top_k),
      timeout_(timeout) {
  if (!rt.available()) throw std::runtime_error("no " + std::string(backend_name(rt.backend())) + " runtime: " + rt.reason());
  if (handshake != "auto" && handshake != "kernel" && handshake != "memop" && handshake != "host-func") {
    throw std::invalid_argument("handshake='" + handshake + "' is unknown; expected auto, kernel, memop or host-func");
  }
  const ProbeResult kp = probe_kernel_io(rt, device, &kio_);
  kio_ok_ = kp.supported;
  check(rt.init(device), "init");
  void* host = nullptr;
  void* dev = nullptr;
  check(rt.host_alloc_mapped(&host, layout_.bytes), "IO block alloc");
  host_ = static_cast<uint8_t*>(host);
  std::memset(host_, 0, layout_.bytes);
  check(rt.device_pointer(&dev, host), "IO block device pointer");
  dev_ = static_cast<uint8_t*>(dev);

  if (handshake == "kernel" || (handshake == "auto" && kio_ok_)) {
    if (!kio_ok_) throw std::runtime_error("handshake='kernel' is unavailable: " + kp.detail);
    hs_ = Handshake::kernel;
    detail_ = "kernel-IO probe: " + kp.detail;
  } else if (handshake == "memop" || handshake == "auto") {
    const ProbeResult mp = probe_memop_graph(rt, device);
    ProbeResult np;
    if (!mp.supported) np = probe_memop_node_graph(rt, device);
    const std::string why = handshake == "auto" ? "kernel-IO probe failed (" + kp.detail + "); " : std::string();
    if (mp.supported) {
      hs_ = Handshake::memop;
      detail_ = why + "memop graph probe: " + mp.detail;
    } else if (np.supported || handshake == "memop") {
      hs_ = Handshake::memop;
      memop_nodes_ = np.supported;
      detail_ = why + "stream memops under capture failed (" + mp.detail + "); explicit batch-memop nodes: " +
                (np.supported ? np.detail : "failed (" + np.detail + "): graphs will not capture this handshake");
    } else {
      hs_ = Handshake::host_func;
      detail_ = why + "memop graph probe failed (" + mp.detail + "); memop node probe failed (" + np.detail + ")";
    }
  } else {
    hs_ = Handshake::host_func;
    detail_ = "host-func requested";
  }
  coord_ = std::make_unique<Coordinator>(abi, host_, layout_, max_tokens, hidden, top_k, timeout);
}

Bridge::~Bridge() {
  coord_.reset();
  if (host_) rt_.host_free(host_);
}

void Bridge::check(int rc, const char* what) {
  if (rc) throw std::runtime_error(failed(rt_, what, rc));
}

int Bridge::memop(void* stream, bool write, uint8_t* dptr, uint64_t value) {
  if (memop_nodes_) {
    bool capturing = false;
    const int rc = rt_.is_capturing(stream, &capturing);
    if (rc) return rc;
    if (capturing) return rt_.capture_memop_node(stream, write, dptr, value);
  }
  return write ? rt_.write_value64(stream, dptr, value) : rt_.wait_value64_geq(stream, dptr, value);
}

void Bridge::submit(void* stream, uint32_t layer, const void* x, const void* ids, const void* w, uint32_t tokens) {
  if (tokens == 0 || tokens > static_cast<uint32_t>(max_tokens_)) {
    throw std::invalid_argument("num_tokens=" + std::to_string(tokens) + " must be in [1, max_tokens=" +
                                std::to_string(max_tokens_) + "]");
  }
  pending_tokens_ = tokens;
  if (hs_ == Handshake::kernel) {
    check(launch_publish(rt_, kio_, stream, x, ids, w, layer, tokens, hidden_, top_k_, dev_, layout_), "publish launch");
    return;
  }
  if (hs_ == Handshake::host_func) check_host_func_allowed(rt_, stream);
  check(rt_.copy_d2h_async(host_ + layout_.x, x, size_t(tokens) * hidden_ * 2, stream), "x copy");
  check(rt_.copy_d2h_async(host_ + layout_.ids, ids, size_t(tokens) * top_k_ * 4, stream), "ids copy");
  check(rt_.copy_d2h_async(host_ + layout_.weights, w, size_t(tokens) * top_k_ * 4, stream), "weights copy");
  const uint64_t word = doorbell_word(layer, tokens);
  if (hs_ == Handshake::memop) {
    check(memop(stream, true, dev_ + layout_.done, 0), "done reset");
    check(memop(stream, true, dev_ + layout_.doorbell, word), "doorbell write");
    return;
  }
  auto& t = host_tasks_[word];
  if (!t) t = std::make_unique<HostFuncTask>(HostFuncTask{this, word});
  check(rt_.launch_host_func(stream, &host_ring, t.get()), "host-func ring");
}

void Bridge::wait(void* stream, void* out, bool accumulate) {
  const uint32_t tokens = pending_tokens_;
  if (tokens == 0) throw std::logic_error("wait() without a submit() before it");
  const size_t count = size_t(tokens) * hidden_;
  if (hs_ == Handshake::host_func) {
    check_host_func_allowed(rt_, stream);
    auto& t = host_tasks_[0];
    if (!t) t = std::make_unique<HostFuncTask>(HostFuncTask{this, 0});
    check(rt_.launch_host_func(stream, &host_wait, t.get()), "host-func wait");
  } else if (hs_ == Handshake::memop) {
    check(memop(stream, false, dev_ + layout_.done, 1), "done wait");
  }  // kernel: the combine kernel waits for done itself
  if (kio_ok_) {
    check(launch_combine(rt_, kio_, stream, out, dev_, layout_, static_cast<uint32_t>(count), accumulate), "combine launch");
  } else if (accumulate) {
    throw std::runtime_error("wait(accumulate=True) needs the combine kernel, which is unavailable here (" + detail_ +
                             "); wait into a separate buffer and add it");
  } else {
    check(rt_.copy_h2d_async(out, host_ + layout_.y, count * 2, stream), "y copy");
  }
}

}  // namespace ftg
