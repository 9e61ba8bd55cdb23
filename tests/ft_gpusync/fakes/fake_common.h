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
