// Python bindings. Array checks live in the Python wrapper (ft_kernels_cpu/_executor.py); this
// layer takes raw addresses and byte sizes so that zero-copy callers can skip numpy entirely.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "executor.h"
#include "kernels/fp4_common.h"
#include "kernels/int8_codes.h"
#include "worker_pool.h"

namespace py = pybind11;
using ft::MoeExecutor;

namespace {

ft_moe_task make_task(int layer, int num_tokens, uintptr_t x, uintptr_t ids, uintptr_t w, uintptr_t y) {
  ft_moe_task t;
  t.layer = layer;
  t.num_tokens = num_tokens;
  t.x = reinterpret_cast<const void*>(x);
  t.ids = reinterpret_cast<const int32_t*>(ids);
  t.weights = reinterpret_cast<const float*>(w);
  t.y = reinterpret_cast<void*>(y);
  return t;
}

void release_capsule_owner(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));
}

}  // namespace

PYBIND11_MODULE(_ft_kernels_cpu, m) {
  m.doc() = "ft-kernels-cpu native module (use the ft_kernels_cpu package, not this module)";
  py::register_exception<ft::Error>(m, "KernelError", PyExc_ValueError);

  m.attr("ABI_VERSION") = FT_MOE_ABI_VERSION;
  m.attr("CAPSULE_NAME") = FT_MOE_EXECUTOR_CAPSULE;

  m.def("weight_formats", [] {
    std::vector<std::string> names;
    for (const auto& f : ft::weight_formats()) names.emplace_back(f.name);
    return names;
  });
  m.def("isa_tiers", [] {
    std::vector<std::string> names;
    for (int i = 0; i <= static_cast<int>(ft::cpu_best_isa()); ++i) names.emplace_back(ft::isa_name(static_cast<ft::Isa>(i)));
    return names;
  });
  m.def("resolve_isa", [](const std::string& requested) { return std::string(ft::isa_name(ft::resolve_isa(requested))); },
        py::arg("requested") = "");
  m.def("_resolve_isa_with_best", [](const std::string& requested, const std::string& best) {
    return std::string(ft::isa_name(ft::resolve_isa(requested, ft::isa_from_name(best, "best"))));
  });
  m.def(
      "_q8_codes",
      [](const py::bytes& values, bool simd) {
        const std::string v = values;
        const int n = static_cast<int>(v.size() / sizeof(float));
        if (n < 0 || n > 128 || v.size() % sizeof(float) != 0) throw ft::Error("_q8_codes takes 0..128 float32 values");
        if (simd && ft::cpu_best_isa() < ft::Isa::avx2) throw ft::Error("_q8_codes(simd=True) needs AVX2");
        float f[128];
        int8_t c[128] = {};
        std::memcpy(f, v.data(), v.size());
        const float amax = ft::int8_codes(f, n, c, simd);
        return py::make_tuple(amax, py::bytes(reinterpret_cast<const char*>(c), n));
      },
      py::arg("values"), py::arg("simd"));
  m.def(
      "_mxfp4_q8_rows",
      [](const py::bytes& blocks, const py::bytes& scales, const py::bytes& x, int K, int rows_per_call,
         const std::string& kernel) {
        // mxfp4's avx512_bf16 one-vector row kernels (step records) on nrows rows of K, in calls of
        // rows_per_call rows, by `kernel` (fp4::Q8Rows: "fastest", "from_records", "four_at_a_time"):
        // fp32 results for the tests (against float64, and the same bits however the rows are called
        // and whichever kernel reads them).
        const std::map<std::string, ft::fp4::Q8Rows> kernels = {{"fastest", ft::fp4::Q8Rows::fastest},
                                                                {"from_records", ft::fp4::Q8Rows::from_records},
                                                                {"four_at_a_time", ft::fp4::Q8Rows::four_at_a_time}};
        const auto how = kernels.find(kernel);
        if (how == kernels.end()) {
          throw ft::Error("kernel must be fastest, from_records or four_at_a_time, got '" + kernel + "'");
        }
        const std::string w = blocks, s = scales, xv = x;
        if (ft::cpu_best_isa() < ft::Isa::avx512_bf16) throw ft::Error("_mxfp4_q8_rows needs the avx512_bf16 tier");
        if (K <= 0 || K % 32 != 0 || xv.size() != K * sizeof(float)) throw ft::Error("x must be K float32, K % 32 == 0");
        const size_t nrows = w.size() / (K / 2);
        if (w.size() != nrows * (K / 2) || s.size() != nrows * (K / 32)) throw ft::Error("blocks/scales sizes");
        if (rows_per_call < 1) throw ft::Error("rows_per_call must be >= 1");
        std::vector<float> xf(K), out(nrows);
        std::memcpy(xf.data(), xv.data(), xv.size());
        ft::AlignedBuffer<uint8_t> rec(ft::fp4::q8_vec_bytes(K));
        ft::fp4::q8_prep_vec(xf.data(), 0, K, K, rec.data());
        const void* xs[1] = {rec.data()};
        const auto* wp = reinterpret_cast<const uint8_t*>(w.data());
        const auto* sp = reinterpret_cast<const uint8_t*>(s.data());
        for (size_t r = 0; r < nrows; r += rows_per_call) {
          const int n = static_cast<int>(std::min<size_t>(rows_per_call, nrows - r));
          ft::fp4::q8_dot_rows_one_vector(wp + r * (K / 2), sp + r * (K / 32), n, xs[0], K, out.data() + r, 0,
                                          how->second);
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
      },
      py::arg("blocks"), py::arg("scales"), py::arg("x"), py::arg("K"), py::arg("rows_per_call"),
      py::arg("kernel") = "fastest");
  m.def("cpu_amx_bf16", [] { return ft::cpu_amx_bf16(); });
  m.def("physical_cores", [] { return static_cast<int>(ft::physical_core_cpus().size()); });

  py::class_<MoeExecutor>(m, "_Executor")
      .def(py::init<int, int, int, int, const std::string&, int>(), py::arg("hidden"), py::arg("top_k"),
           py::arg("max_tokens"), py::arg("num_threads"), py::arg("isa"), py::arg("prefetch_bytes"))
      .def(
          "add_layer",
          [](MoeExecutor& ex, int layer, const std::string& fmt, int num_experts, int intermediate,
             const std::string& activation, const std::map<std::string, std::tuple<uintptr_t, size_t, std::string>>& banks,
             const std::map<std::string, double>& options, bool router_weight_on_input) {
            std::map<std::string, ft::Bank> b;
            for (const auto& kv : banks) {
              b[kv.first] = ft::Bank{reinterpret_cast<const void*>(std::get<0>(kv.second)), std::get<1>(kv.second),
                                     std::get<2>(kv.second)};
            }
            ex.add_layer(layer, fmt, num_experts, intermediate, activation, std::move(b), options, router_weight_on_input);
          },
          py::arg("layer"), py::arg("weight_format"), py::arg("num_experts"), py::arg("intermediate"),
          py::arg("activation"), py::arg("banks"), py::arg("options"), py::arg("router_weight_on_input"))
      .def(
          "run",
          [](MoeExecutor& ex, int layer, int num_tokens, uintptr_t x, uintptr_t ids, uintptr_t w, uintptr_t y) {
            const ft_moe_task task = make_task(layer, num_tokens, x, ids, w, y);
            py::gil_scoped_release nogil;
            ex.run(task);
          },
          py::arg("layer"), py::arg("num_tokens"), py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("y"))
      .def(
          "time_runs",
          [](MoeExecutor& ex, int layer, int num_tokens, uintptr_t x, uintptr_t ids_seq, uintptr_t w_seq, int count,
             uintptr_t y) {
            // `count` tasks back to back; task i reads ids/weights block i of [count, num_tokens, top_k].
            const size_t stride = static_cast<size_t>(num_tokens) * ex.top_k();
            py::gil_scoped_release nogil;
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < count; ++i) {
              ex.run(make_task(layer, num_tokens, x, ids_seq + i * stride * sizeof(int32_t),
                               w_seq + i * stride * sizeof(float), y));
            }
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          },
          py::arg("layer"), py::arg("num_tokens"), py::arg("x"), py::arg("ids_seq"), py::arg("weights_seq"),
          py::arg("count"), py::arg("y"))
      .def(
          "read_bandwidth_gbs",
          [](MoeExecutor& ex, size_t bytes, int passes, bool huge_pages) {
            py::gil_scoped_release nogil;
            return ex.read_bandwidth_gbs(bytes, passes, huge_pages);
          },
          py::arg("bytes"), py::arg("passes"), py::arg("huge_pages"))
      .def("read_buffer_span",
           [](const MoeExecutor& ex) {
             return py::make_tuple(reinterpret_cast<uintptr_t>(ex.read_buffer()), ex.read_buffer_bytes());
           })
      .def(
          "pool_profile",
          [](MoeExecutor& ex) {
            const ft::PoolProfile p = ex.pool_profile();
            const double s = 1.0 / p.ticks_per_second;
            py::dict d;
            d["runs"] = p.runs;
            d["wall_s"] = p.wall * s;
            d["pass1_s"] = p.busy[0] * s;
            d["pass2_s"] = p.busy[1] * s;
            d["barrier_s"] = p.barrier * s;
            d["join_s"] = p.join * s;
            d["tail_s"] = p.tail * s;
            d["units1"] = p.units[0];
            d["units2"] = p.units[1];
            d["chain_links"] = p.chain_links;
            return d;
          })
      .def("reset_pool_profile", &MoeExecutor::reset_pool_profile)
      .def(
          "capsule",
          // `owner` (default: the executor) is what the capsule keeps alive: the Python wrapper passes
          // itself, since it also holds the weight banks.
          [](py::object self, py::object owner) {
             MoeExecutor& ex = self.cast<MoeExecutor&>();
             if (owner.is_none()) owner = self;
             PyObject* cap = PyCapsule_New(const_cast<ft_moe_executor_abi*>(ex.abi()), FT_MOE_EXECUTOR_CAPSULE,
                                           &release_capsule_owner);
             if (!cap) throw py::error_already_set();
             Py_INCREF(owner.ptr());
             if (PyCapsule_SetContext(cap, owner.ptr()) != 0) {
               Py_DECREF(owner.ptr());
               Py_DECREF(cap);
               throw py::error_already_set();
             }
             return py::reinterpret_steal<py::object>(cap);
           },
          py::arg("owner") = py::none())
      .def("layer_format", &MoeExecutor::layer_format)
      .def("layer_kernels", &MoeExecutor::layer_kernels, py::arg("layer"))
      .def_property_readonly("layers", &MoeExecutor::layers)
      .def_property_readonly("hidden", &MoeExecutor::hidden)
      .def_property_readonly("top_k", &MoeExecutor::top_k)
      .def_property_readonly("max_tokens", &MoeExecutor::max_tokens)
      .def_property_readonly("num_threads", &MoeExecutor::num_threads)
      .def_property_readonly("claims", &MoeExecutor::claims)
      .def_property_readonly("prefetch_bytes", &MoeExecutor::prefetch_bytes)
      .def_property_readonly("prefetch_l1_bytes", &MoeExecutor::prefetch_l1_bytes)
      .def_property_readonly("multirow_min_bytes", &MoeExecutor::multirow_min_bytes)
      .def_property_readonly("multirow_several_min_bytes", &MoeExecutor::multirow_several_min_bytes)
      .def_property_readonly("gate_up_slice_bytes", &MoeExecutor::gate_up_slice_bytes)
      .def("layer_prefetch_bytes", &MoeExecutor::layer_prefetch_bytes, py::arg("layer"), py::arg("vectors") = 1)
      .def("layer_prefetch_l1_bytes", &MoeExecutor::layer_prefetch_l1_bytes, py::arg("layer"),
           py::arg("vectors") = 1)
      .def_property_readonly("isa", [](const MoeExecutor& ex) { return std::string(ft::isa_name(ex.isa())); });

  // Calls an executor the way other native code does: through its capsule and the C ABI only.
  m.def(
      "_run_through_capsule",
      [](py::capsule cap, int layer, int num_tokens, uintptr_t x, uintptr_t ids, uintptr_t w, uintptr_t y) {
        auto* abi = static_cast<const ft_moe_executor_abi*>(PyCapsule_GetPointer(cap.ptr(), FT_MOE_EXECUTOR_CAPSULE));
        if (!abi) throw py::error_already_set();
        if (abi->abi_version != FT_MOE_ABI_VERSION) throw ft::Error("capsule ABI version mismatch");
        const ft_moe_task task = make_task(layer, num_tokens, x, ids, w, y);
        int rc;
        {
          py::gil_scoped_release nogil;
          rc = abi->run(abi->self, &task);
        }
        if (rc != 0) throw ft::Error(std::string("run through the C ABI failed: ") + abi->last_error(abi->self));
      },
      py::arg("capsule"), py::arg("layer"), py::arg("num_tokens"), py::arg("x"), py::arg("ids"), py::arg("weights"),
      py::arg("y"));
}
