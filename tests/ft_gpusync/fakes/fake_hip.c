/* A fake HIP runtime (the subset ft_gpusync loads), for fault injection without a GPU. Like the real
 * runtime, every failing call also leaves a sticky last error that hipGetLastError returns and clears. */
#include "fake_common.h"

static int last_error = -1; /* -1: not yet read from FT_FAKE_PENDING */

static int sticky(void) {
  if (last_error < 0) {
    const char* p = getenv("FT_FAKE_PENDING");
    last_error = p ? atoi(p) : 0;
  }
  return last_error;
}

#define CALL(name) do { sticky(); int rc_ = fake_fail(#name); if (rc_) { last_error = rc_; return rc_; } } while (0)

int hipInit(unsigned f) { (void)f; CALL(hipInit); return 0; }
int hipSetDevice(int d) { (void)d; CALL(hipSetDevice); return 0; }
int hipStreamCreateWithFlags(void** s, unsigned f) { (void)f; CALL(hipStreamCreate); *s = calloc(1, sizeof(fake_stream)); return 0; }
int hipStreamDestroy(void* s) { free(s); return 0; }
int hipStreamSynchronize(void* s) { (void)s; CALL(hipStreamSynchronize); return 0; }
int hipHostMalloc(void** p, size_t n, unsigned f) { (void)f; CALL(hipHostMalloc); *p = calloc(1, n); return 0; }
int hipHostFree(void* p) { free(p); return 0; }
int hipHostGetDevicePointer(void** d, void* h, unsigned f) { (void)f; CALL(hipHostGetDevicePointer); *d = h; return 0; }
int hipStreamWriteValue64(void* s, void* a, uint64_t v, unsigned f) {
  (void)f; CALL(hipStreamWriteValue64); return fake_enqueue(s, OP_WRITE, a, v);
}
int hipStreamWaitValue64(void* s, void* a, uint64_t v, unsigned f, uint64_t m) {
  (void)f; (void)m; CALL(hipStreamWaitValue64); return fake_enqueue(s, OP_WAIT, a, v);
}
int hipLaunchHostFunc(void* s, void (*fn)(void*), void* d) { (void)s; CALL(hipLaunchHostFunc); fn(d); return 0; }
int hipStreamIsCapturing(void* s, int* status) {
  CALL(hipStreamIsCapturing);
  *status = (s == FAKE_CAPTURING_STREAM) ? 1 : (s ? ((fake_stream*)s)->capturing : 0);
  return 0;
}
int hipStreamBeginCapture(void* s, int mode) {
  (void)mode; CALL(hipStreamBeginCapture); ((fake_stream*)s)->capturing = 1; ((fake_stream*)s)->n = 0; return 0;
}
int hipStreamEndCapture(void* s, void** g) {
  fake_stream* st = (fake_stream*)s;
  st->capturing = 0;
  CALL(hipStreamEndCapture);
  fake_graph* gr = (fake_graph*)calloc(1, sizeof(fake_graph));
  gr->n = st->n;
  memcpy(gr->ops, st->ops, sizeof(st->ops));
  *g = gr;
  return 0;
}
int hipGraphInstantiateWithFlags(void** e, void* g, unsigned long long f) {
  (void)f; CALL(hipGraphInstantiate);
  fake_graph* ex = (fake_graph*)malloc(sizeof(fake_graph));
  memcpy(ex, g, sizeof(fake_graph));
  *e = ex;
  return 0;
}
int hipGraphLaunch(void* e, void* s) {
  (void)s; CALL(hipGraphLaunch);
  fake_graph* ex = (fake_graph*)e;
  for (int i = 0; i < ex->n; ++i) { int rc = fake_run(&ex->ops[i]); if (rc) { last_error = rc; return rc; } }
  return 0;
}
int hipGraphDestroy(void* g) { free(g); return 0; }
int hipGraphExecDestroy(void* e) { free(e); return 0; }
int hipGetLastError(void) { int e = sticky(); last_error = 0; return e; }
int hipPeekAtLastError(void) { return sticky(); }
const char* hipGetErrorString(int code) { (void)code; return "fake HIP error"; }
/* Test hooks: read the sticky error without touching it, reset the fake. */
int fake_hip_sticky(void) { return sticky(); }
void fake_hip_reset(void) { last_error = -1; }
