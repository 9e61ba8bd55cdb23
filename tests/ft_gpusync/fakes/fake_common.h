/* Shared machinery of the fake GPU runtimes used by the fault-injection tests.
 *
 * Streams run their operations at once, or record them while capturing; a graph replays what was
 * recorded. "Device" memory is host memory. FT_FAKE_FAIL="name=code,name=code" makes the named calls
 * fail with that code; FT_FAKE_PENDING=code puts a sticky error in place before anything runs (HIP).
 * The stream handle 0xCA97 always reports "capturing". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>

#define FAKE_CAPTURING_STREAM ((void*)(uintptr_t)0xCA97)

enum { OP_WRITE = 1, OP_WAIT = 2, OP_COPY = 3, MAX_OPS = 64 };
typedef struct { int kind; uint64_t* addr; uint64_t value; void* dst; const void* src; size_t n; } fake_op;
typedef struct { int capturing; int n; fake_op ops[MAX_OPS]; } fake_stream;
typedef struct { int n; fake_op ops[MAX_OPS]; } fake_graph;

static int fake_fail(const char* name) {
  const char* spec = getenv("FT_FAKE_FAIL");
  if (!spec) return 0;
  size_t len = strlen(name);
  for (const char* p = spec; (p = strstr(p, name)) != NULL; p += len) {
    if ((p == spec || p[-1] == ',') && p[len] == '=') return atoi(p + len + 1);
  }
  return 0;
}

/* A wait blocks the (fake) stream until the word reaches the value, like a GPU stream would; after
 * 10 s it gives up with 9999 instead of hanging the test. */
static int fake_run(fake_op* op) {
  if (op->kind == OP_WRITE) __atomic_store_n(op->addr, op->value, __ATOMIC_RELEASE);
  if (op->kind == OP_COPY) memcpy(op->dst, op->src, op->n);
  if (op->kind == OP_WAIT) {
    for (long i = 0; __atomic_load_n(op->addr, __ATOMIC_ACQUIRE) < op->value; ++i) {
      if (i > 100000000L) return 9999;
      if (i % 1024 == 0) sched_yield();
    }
  }
  return 0;
}

/* Explicit batch-memop nodes: the fake's graph is the capture list of its stream; a node is an op in
 * it, and destroying a node turns it into a no-op (counted, for the tests). */
static int destroyed_nodes = 0;
int fake_destroyed_nodes(void) { return destroyed_nodes; }

/* FT_FAKE_NO_CAPTURED_MEMOPS=1: stream memops refuse capture (like ROCm 7.x, which does not record them). */
static int memops_refuse_capture(void* s) {
  const char* v = getenv("FT_FAKE_NO_CAPTURED_MEMOPS");
  return v && *v == '1' && s && ((fake_stream*)s)->capturing;
}

typedef struct { uint32_t operation; uint64_t address; uint64_t value64; uint32_t flags; uint64_t alias; uint64_t pad; } fake_memop_params;
typedef struct { void* ctx; unsigned count; fake_memop_params* params; unsigned flags; } fake_memop_node_params;

static int fake_add_node(void** node, void* graph, const fake_memop_node_params* p) {
  fake_stream* st = (fake_stream*)graph;
  if (st->n == MAX_OPS) return 9998;
  fake_op op = {p->params[0].operation == 5 ? OP_WRITE : OP_WAIT, (uint64_t*)(uintptr_t)p->params[0].address,
                p->params[0].value64, NULL, NULL, 0};
  st->ops[st->n] = op;
  *node = &st->ops[st->n++];
  return 0;
}

static void fake_destroy_node(void* node) {
  ((fake_op*)node)->kind = 0;
  ++destroyed_nodes;
}

static int fake_push(void* s, fake_op op) {
  fake_stream* st = (fake_stream*)s;
  if (st && st->capturing) {
    if (st->n == MAX_OPS) return 9998;
    st->ops[st->n++] = op;
    return 0;
  }
  return fake_run(&op);
}

static int fake_enqueue(void* s, int kind, void* addr, uint64_t value) {
  fake_op op = {kind, (uint64_t*)addr, value, NULL, NULL, 0};
  return fake_push(s, op);
}

static int fake_copy(void* s, void* dst, const void* src, size_t n) {
  fake_op op = {OP_COPY, NULL, 0, dst, src, n};
  return fake_push(s, op);
}

/* Device code cannot run in a fake: loading works, launching fails like a missing kernel image. */
#define FAKE_NO_KERNEL_IMAGE 209
