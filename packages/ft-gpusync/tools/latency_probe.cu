// Latency of the primitives a GPU<->CPU handshake is made of, per operation, in CUDA graph replay.
// A developer tool (not part of the package): it answers "what does one SM read of mapped host memory,
// one system fence, one stream memop, one small DMA cost on this machine?", which sets the floor of
// the bridge's handshakes.
//
//   nvcc -O2 -arch=native -o /tmp/latency_probe packages/ft-gpusync/tools/latency_probe.cu -lcuda
//   /tmp/latency_probe [ops per graph, default 48]
//
// Prints one line per primitive: microseconds per operation (median of 30 replays of a graph of N of
// them, with the empty-graph replay cost subtracted out by the per-op division only).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
#define CKD(x)                                                                                       \
  do {                                                                                               \
    CUresult r_ = (x);                                                                               \
    if (r_ != CUDA_SUCCESS) {                                                                        \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

__global__ void k_empty() {}

__global__ void k_read_host(const volatile uint64_t* p, uint64_t* sink) {
  const uint64_t v = *p;
  if (v == 0xdeadbeefull) *sink = v;
}

__global__ void k_read_host_dependent(const volatile uint64_t* p, int n, uint64_t* sink) {
  uint64_t acc = 0;
  for (int i = 0; i < n; ++i) acc += p[acc & 7];
  if (acc == 0xdeadbeefull) *sink = acc;
}

__global__ void k_write_host(volatile uint64_t* p) {
  if (threadIdx.x == 0) *p = 2;
}

__global__ void k_write_host_fence(volatile uint64_t* p) {
  if (threadIdx.x == 0) {
    *p = 2;
    __threadfence_system();
  }
}

__global__ void k_fence_all_threads(volatile uint64_t* p) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *p = 2;
}

__global__ void k_read_host_4k(const uint16_t* y, uint16_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = y[i];
}

int main(int argc, char** argv) {
  const int n_ops = argc > 1 ? std::atoi(argv[1]) : 48;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t* host = nullptr;
  CK(cudaHostAlloc(&host, 1 << 16, cudaHostAllocMapped | cudaHostAllocPortable));
  std::fill(host, host + (1 << 13), 0ull);
  uint64_t* hdev = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hdev), host, 0));
  uint64_t* sink = nullptr;
  uint16_t* dbuf = nullptr;
  CK(cudaMalloc(&sink, 64));
  CK(cudaMalloc(&dbuf, 1 << 16));
  host[16] = 1;  // the word the stream waits on (>= 1 is satisfied)

  auto time_graph = [&](const char* name, const std::function<void()>& enqueue) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < n_ops; ++i) enqueue();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int r = 0; r < 30; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaGraphLaunch(e, s));
      CK(cudaStreamSynchronize(s));
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    std::printf("%-44s %8.2f us/op  (graph of %d: %.1f us)\n", name, t[t.size() / 2] / n_ops, n_ops, t[t.size() / 2]);
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
  };

  CUdeviceptr wait_word = reinterpret_cast<CUdeviceptr>(hdev + 16);
  CUdeviceptr write_word = reinterpret_cast<CUdeviceptr>(hdev + 24);
  time_graph("empty kernel (1x32)", [&] { k_empty<<<1, 32, 0, s>>>(); });
  time_graph("empty kernel (1x256)", [&] { k_empty<<<1, 256, 0, s>>>(); });
  time_graph("kernel: 1 SM read of mapped host word", [&] { k_read_host<<<1, 32, 0, s>>>(hdev, sink); });
  time_graph("kernel: 8 dependent mapped host reads", [&] { k_read_host_dependent<<<1, 1, 0, s>>>(hdev, 8, sink); });
  time_graph("kernel: 1 write to mapped host", [&] { k_write_host<<<1, 32, 0, s>>>(hdev + 32); });
  time_graph("kernel: 1 write + 1 system fence", [&] { k_write_host_fence<<<1, 32, 0, s>>>(hdev + 32); });
  time_graph("kernel: 256 threads system fence + write", [&] { k_fence_all_threads<<<1, 256, 0, s>>>(hdev + 32); });
  time_graph("kernel: 4 KiB read of mapped host (8x256)", [&] {
    k_read_host_4k<<<8, 256, 0, s>>>(reinterpret_cast<uint16_t*>(hdev + 1024), dbuf, 2048);
  });
  time_graph("kernel: 4 KiB device read (8x256)", [&] {
    k_read_host_4k<<<8, 256, 0, s>>>(dbuf + 8192, dbuf, 2048);
  });
  time_graph("memop: write value 64 (host word)", [&] { CKD(cuStreamWriteValue64(s, write_word, 1, 0)); });
  time_graph("memop: wait value 64 (host word, already set)",
             [&] { CKD(cuStreamWaitValue64(s, wait_word, 1, CU_STREAM_WAIT_VALUE_GEQ)); });
  time_graph("DMA: 4 KiB host -> device", [&] { CK(cudaMemcpyAsync(dbuf, host + 1024, 4096, cudaMemcpyHostToDevice, s)); });
  time_graph("DMA: 64 B host -> device", [&] { CK(cudaMemcpyAsync(dbuf, host + 1024, 64, cudaMemcpyHostToDevice, s)); });
  time_graph("DMA: 4 KiB device -> host", [&] { CK(cudaMemcpyAsync(host + 1024, dbuf, 4096, cudaMemcpyDeviceToHost, s)); });
  CK(cudaFreeHost(host));
  CK(cudaFree(sink));
  CK(cudaFree(dbuf));
  return 0;
}
