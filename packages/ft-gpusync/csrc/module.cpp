// Python bindings of the bridge's CPU side. Addresses are plain integers; nothing here knows torch.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "bridge.h"
#include "coordinator.h"
#include "probe.h"
#include "runtime.h"

namespace py = pybind11;

namespace {

// Host memory of an IO block. (A GPU backend allocates it pinned and mapped instead.)
struct HostBlock {
  explicit HostBlock(size_t bytes) : bytes(bytes) {
    ptr = static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    if (!ptr) throw std::runtime_error("out of memory allocating an IO block of " + std::to_string(bytes) + " bytes");
    std::memset(ptr, 0, bytes);
  }
  ~HostBlock() { std::free(ptr); }
  uint8_t* ptr;
  size_t bytes;
};

const ft_moe_executor_abi* abi_from_capsule(const py::object& capsule) {
  if (!PyCapsule_CheckExact(capsule.ptr())) {
    throw py::type_error("executor must be the capsule of an ft_kernels_cpu executor (MoeExecutor.capsule())");
  }
  auto* abi = static_cast<const ft_moe_executor_abi*>(PyCapsule_GetPointer(capsule.ptr(), FT_MOE_EXECUTOR_CAPSULE));
  if (!abi) throw py::error_already_set();
  if (abi->abi_version != FT_MOE_ABI_VERSION || abi->struct_size < sizeof(ft_moe_executor_abi)) {
    throw py::value_error("executor capsule speaks C ABI version " + std::to_string(abi->abi_version) +
                          "; this ft_gpusync was built for version " + std::to_string(FT_MOE_ABI_VERSION));
  }
  return abi;
}

class PyCoordinator {
 public:
  PyCoordinator(py::object capsule, int max_tokens, int hidden, int top_k, int timeout_ms)
      : capsule_(std::move(capsule)), abi_(abi_from_capsule(capsule_)) {
    if (hidden != abi_->hidden) {
      throw py::value_error("hidden=" + std::to_string(hidden) + " differs from the executor's hidden=" +
                            std::to_string(abi_->hidden));
    }
    if (top_k != abi_->top_k) {
      throw py::value_error("top_k=" + std::to_string(top_k) + " differs from the executor's top_k=" +
                            std::to_string(abi_->top_k));
    }
    if (max_tokens < 1 || max_tokens > abi_->max_tokens) {
      throw py::value_error("max_tokens=" + std::to_string(max_tokens) + " must be in [1, " +
                            std::to_string(abi_->max_tokens) + "] (the executor's max_tokens)");
    }
    if (timeout_ms < 1) throw py::value_error("timeout_ms must be >= 1, got " + std::to_string(timeout_ms));
    layout_ = ftg::IoLayout(max_tokens, hidden, top_k);
    block_ = std::make_unique<HostBlock>(layout_.bytes);
    coord_ = std::make_unique<ftg::Coordinator>(abi_, block_->ptr, layout_, max_tokens, hidden, top_k,
                                                std::chrono::milliseconds(timeout_ms));
  }

  void close() {
    py::gil_scoped_release nogil;
    coord_.reset();
  }
  ftg::Coordinator& coord() {
    if (!coord_) throw py::value_error("the coordinator was closed");
    return *coord_;
  }

  py::object capsule_;
  const ft_moe_executor_abi* abi_;
  ftg::IoLayout layout_;
  std::unique_ptr<HostBlock> block_;
  std::unique_ptr<ftg::Coordinator> coord_;
};

ftg::Backend parse_backend(const std::string& name) {
  if (name == "cuda") return ftg::Backend::cuda;
  if (name == "hip") return ftg::Backend::hip;
  throw py::value_error("backend='" + name + "' is unknown; expected 'cuda' or 'hip'");
}

}  // namespace

PYBIND11_MODULE(_ft_gpusync, m) {
  m.doc() = "ft-gpusync native module (use the ft_gpusync package)";
  py::class_<PyCoordinator>(m, "_Coordinator")
      .def(py::init<py::object, int, int, int, int>(), py::arg("executor"), py::arg("max_tokens"), py::arg("hidden"),
           py::arg("top_k"), py::arg("timeout_ms"))
      .def_property_readonly("address", [](PyCoordinator& c) { return reinterpret_cast<uintptr_t>(c.block_->ptr); })
      .def_property_readonly("layout",
                             [](PyCoordinator& c) {
                               const auto& l = c.layout_;
                               return std::map<std::string, size_t>{{"doorbell", l.doorbell}, {"done", l.done},
                                                                    {"x", l.x},           {"ids", l.ids},
                                                                    {"weights", l.weights}, {"y", l.y},
                                                                    {"bytes", l.bytes}};
                             })
      .def_property_readonly("served", [](PyCoordinator& c) { return c.coord().served(); })
      .def_property_readonly("poisoned", [](PyCoordinator& c) { return c.coord().poisoned(); })
      .def("take_error", [](PyCoordinator& c) { return c.coord().take_error(); })
      .def("close", &PyCoordinator::close);
  m.def("doorbell_word", &ftg::doorbell_word, py::arg("layer"), py::arg("num_tokens"));

  static py::exception<ftg::PendingError> pending(m, "PendingGpuError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ftg::PendingError& e) {
      py::set_error(pending, e.what());
    }
  });
  m.def(
      "runtime_status",
      [](const std::string& backend) {
        ftg::Runtime rt(parse_backend(backend));
        py::dict d;
        d["backend"] = backend;
        d["library"] = rt.library();
        d["available"] = rt.available();
        d["reason"] = rt.reason();
        return d;
      },
      py::arg("backend"));
  // A probe by backend name: {"supported": bool, "detail": str}; PendingGpuError if an error was pending.
  auto bind_probe = [&m](const char* name, ftg::ProbeResult (*probe)(ftg::Runtime&, int)) {
    m.def(
        name,
        [probe](const std::string& backend, int device) {
          ftg::Runtime rt(parse_backend(backend));
          ftg::ProbeResult r;
          {
            py::gil_scoped_release nogil;
            r = probe(rt, device);
          }
          py::dict d;
          d["supported"] = r.supported;
          d["detail"] = r.detail;
          return d;
        },
        py::arg("backend"), py::arg("device") = 0);
  };
  bind_probe("probe_memop_graph", &ftg::probe_memop_graph);
  bind_probe("probe_memop_node_graph", &ftg::probe_memop_node_graph);
  py::class_<ftg::Runtime>(m, "_Runtime")
      .def(py::init([](const std::string& backend) { return new ftg::Runtime(parse_backend(backend)); }))
      .def_property_readonly("available", &ftg::Runtime::available)
      .def_property_readonly("reason", &ftg::Runtime::reason);

  // Thin stream and graph helpers, so tests and the bench need no torch.
  auto rt_call = [](ftg::Runtime& rt, int rc, const char* what) {
    if (rc) throw std::runtime_error(std::string(what) + " failed: " + rt.error_string(rc));
  };
  m.def("_stream_create", [rt_call](ftg::Runtime& rt, int device) {
    void* s = nullptr;
    rt_call(rt, rt.init(device), "init");
    rt_call(rt, rt.stream_create(&s), "stream create");
    return reinterpret_cast<uintptr_t>(s);
  });
  m.def("_stream_destroy", [rt_call](ftg::Runtime& rt, uintptr_t s) { rt_call(rt, rt.stream_destroy(reinterpret_cast<void*>(s)), "stream destroy"); });
  m.def("_stream_sync", [rt_call](ftg::Runtime& rt, uintptr_t s) {
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = rt.stream_sync(reinterpret_cast<void*>(s));
    }
    rt_call(rt, rc, "stream sync");
  });
  m.def("_begin_capture", [rt_call](ftg::Runtime& rt, uintptr_t s) { rt_call(rt, rt.begin_capture(reinterpret_cast<void*>(s)), "begin capture"); });
  m.def("_end_capture_instantiate", [rt_call](ftg::Runtime& rt, uintptr_t s) {
    void *g = nullptr, *e = nullptr;
    rt_call(rt, rt.end_capture(reinterpret_cast<void*>(s), &g), "end capture");
    rt_call(rt, rt.instantiate(&e, g), "graph instantiate");
    rt.graph_destroy(g);
    return reinterpret_cast<uintptr_t>(e);
  });
  m.def("_graph_launch", [rt_call](ftg::Runtime& rt, uintptr_t e, uintptr_t s) {
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = rt.graph_launch(reinterpret_cast<void*>(e), reinterpret_cast<void*>(s));
    }
    rt_call(rt, rc, "graph launch");
  });
  m.def("_host_alloc_mapped", [rt_call](ftg::Runtime& rt, int device, size_t bytes) {
    void *h = nullptr, *d = nullptr;
    rt_call(rt, rt.init(device), "init");
    rt_call(rt, rt.host_alloc_mapped(&h, bytes), "mapped host alloc");
    std::memset(h, 0, bytes);
    rt_call(rt, rt.device_pointer(&d, h), "device pointer");
    return std::make_pair(reinterpret_cast<uintptr_t>(h), reinterpret_cast<uintptr_t>(d));
  });
  // One 64-bit stream write of `word` followed by a wait for it: the floor of a handshake's cost.
  m.def("_stream_write_wait", [rt_call](ftg::Runtime& rt, uintptr_t s, uintptr_t dev_word, uint64_t value) {
    void* st = reinterpret_cast<void*>(s);
    void* w = reinterpret_cast<void*>(dev_word);
    rt_call(rt, rt.write_value64(st, w, value), "stream write value");
    rt_call(rt, rt.wait_value64_geq(st, w, value), "stream wait value");
  });
  m.def("_host_free", [](ftg::Runtime& rt, uintptr_t h) { rt.host_free(reinterpret_cast<void*>(h)); });
  m.def("_device_alloc", [rt_call](ftg::Runtime& rt, int device, size_t bytes) {
    void* d = nullptr;
    rt_call(rt, rt.init(device), "init");
    rt_call(rt, rt.device_alloc(&d, bytes), "device alloc");
    return reinterpret_cast<uintptr_t>(d);
  });
  m.def("_device_free", [](ftg::Runtime& rt, uintptr_t d) { rt.device_free(reinterpret_cast<void*>(d)); });
  // Synchronous upload of a bytes-like object (a numpy array) to device memory.
  m.def("_copy_h2d", [rt_call](ftg::Runtime& rt, uintptr_t dst, py::buffer src) {
    const py::buffer_info info = src.request();
    rt_call(rt, rt.copy_h2d(reinterpret_cast<void*>(dst), info.ptr, static_cast<size_t>(info.size * info.itemsize)),
            "copy to device");
  });
  m.def("_graph_exec_destroy", [](ftg::Runtime& rt, uintptr_t e) { rt.exec_destroy(reinterpret_cast<void*>(e)); });

  py::class_<ftg::Bridge>(m, "_Bridge")
      .def(py::init([](ftg::Runtime& rt, py::object capsule, int device, int max_tokens, int hidden, int top_k,
                       const std::string& handshake, int timeout_ms) {
             const ft_moe_executor_abi* abi = abi_from_capsule(capsule);
             if (hidden != abi->hidden || top_k != abi->top_k || max_tokens < 1 || max_tokens > abi->max_tokens) {
               throw py::value_error("hidden/top_k must equal the executor's (" + std::to_string(abi->hidden) + ", " +
                                     std::to_string(abi->top_k) + ") and max_tokens be in [1, " +
                                     std::to_string(abi->max_tokens) + "]");
             }
             if (timeout_ms < 1) throw py::value_error("timeout_ms must be >= 1");
             return new ftg::Bridge(rt, abi, device, max_tokens, hidden, top_k, handshake,
                                    std::chrono::milliseconds(timeout_ms));
           }),
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def_property_readonly("handshake", [](ftg::Bridge& b) { return std::string(ftg::handshake_name(b.handshake())); })
      .def_property_readonly("detail", &ftg::Bridge::detail)
      .def_property_readonly("served", [](ftg::Bridge& b) { return b.coordinator().served(); })
      .def_property_readonly("poisoned", [](ftg::Bridge& b) { return b.coordinator().poisoned(); })
      .def("take_error", [](ftg::Bridge& b) { return b.coordinator().take_error(); })
      .def("submit",
           [](ftg::Bridge& b, uintptr_t stream, uint32_t layer, uintptr_t x, uintptr_t ids, uintptr_t w, uint32_t n) {
             b.submit(reinterpret_cast<void*>(stream), layer, reinterpret_cast<const void*>(x),
                      reinterpret_cast<const void*>(ids), reinterpret_cast<const void*>(w), n);
           })
      .def("wait", [](ftg::Bridge& b, uintptr_t stream, uintptr_t out, bool accumulate) {
        b.wait(reinterpret_cast<void*>(stream), reinterpret_cast<void*>(out), accumulate);
      });

  m.def(
      "check_host_func_allowed",
      [](const std::string& backend, uintptr_t stream) {
        ftg::Runtime rt(parse_backend(backend));
        if (!rt.available()) throw py::value_error(rt.reason());
        ftg::check_host_func_allowed(rt, reinterpret_cast<void*>(stream));
      },
      py::arg("backend"), py::arg("stream"));
}
