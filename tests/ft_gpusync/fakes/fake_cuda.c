/* A fake CUDA driver (the subset ft_gpusync loads), for fault injection without a GPU. */
#include "fake_common.h"

#define CALL(name) do { int rc_ = fake_fail(#name); if (rc_) return rc_; } while (0)

int cuInit(unsigned f) { (void)f; CALL(cuInit); return 0; }
int cuDeviceGet(int* d, int o) { CALL(cuDeviceGet); *d = o; return 0; }
int cuDevicePrimaryCtxRetain(void** c, int d) { (void)d; CALL(cuDevicePrimaryCtxRetain); *c = (void*)1; return 0; }
int cuCtxSetCurrent(void* c) { (void)c; CALL(cuCtxSetCurrent); return 0; }
int cuStreamCreate(void** s, unsigned f) { (void)f; CALL(cuStreamCreate); *s = calloc(1, sizeof(fake_stream)); return 0; }
int cuStreamDestroy_v2(void* s) { free(s); return 0; }
int cuStreamSynchronize(void* s) { (void)s; CALL(cuStreamSynchronize); return 0; }
int cuMemHostAlloc(void** p, size_t n, unsigned f) { (void)f; CALL(cuMemHostAlloc); *p = calloc(1, n); return 0; }
int cuMemFreeHost(void* p) { free(p); return 0; }
int cuMemHostGetDevicePointer_v2(uint64_t* d, void* h, unsigned f) {
  (void)f; CALL(cuMemHostGetDevicePointer); *d = (uint64_t)(uintptr_t)h; return 0;
}
int cuStreamWriteValue64_v2(void* s, uint64_t a, uint64_t v, unsigned f) {
  (void)f; CALL(cuStreamWriteValue64); return fake_enqueue(s, OP_WRITE, (void*)(uintptr_t)a, v);
}
int cuStreamWaitValue64_v2(void* s, uint64_t a, uint64_t v, unsigned f) {
  (void)f; CALL(cuStreamWaitValue64); return fake_enqueue(s, OP_WAIT, (void*)(uintptr_t)a, v);
}
int cuLaunchHostFunc(void* s, void (*fn)(void*), void* d) { (void)s; CALL(cuLaunchHostFunc); fn(d); return 0; }
int cuStreamIsCapturing(void* s, int* status) {
  CALL(cuStreamIsCapturing);
  *status = (s == FAKE_CAPTURING_STREAM) ? 1 : (s ? ((fake_stream*)s)->capturing : 0);
  return 0;
}
int cuStreamBeginCapture_v2(void* s, int mode) {
  (void)mode; CALL(cuStreamBeginCapture); ((fake_stream*)s)->capturing = 1; ((fake_stream*)s)->n = 0; return 0;
}
int cuStreamEndCapture(void* s, void** g) {
  fake_stream* st = (fake_stream*)s;
  st->capturing = 0; /* a real driver ends the capture even when it reports an error */
  CALL(cuStreamEndCapture);
  fake_graph* gr = (fake_graph*)calloc(1, sizeof(fake_graph));
  gr->n = st->n;
  memcpy(gr->ops, st->ops, sizeof(st->ops));
  *g = gr;
  return 0;
}
int cuGraphInstantiateWithFlags(void** e, void* g, unsigned long long f) {
  (void)f; CALL(cuGraphInstantiate);
  fake_graph* ex = (fake_graph*)malloc(sizeof(fake_graph));
  memcpy(ex, g, sizeof(fake_graph));
  *e = ex;
  return 0;
}
int cuGraphLaunch(void* e, void* s) {
  (void)s; CALL(cuGraphLaunch);
  fake_graph* ex = (fake_graph*)e;
  for (int i = 0; i < ex->n; ++i) { int rc = fake_run(&ex->ops[i]); if (rc) return rc; }
  return 0;
}
int cuGraphDestroy(void* g) { free(g); return 0; }
int cuGraphExecDestroy(void* e) { free(e); return 0; }
int cuGetErrorString(int code, const char** s) { (void)code; *s = "fake CUDA error"; return 0; }
