/* Shared machinery of the fake GPU runtimes used by the fault-injection tests.
 *
 * Streams run their operations at once, or record them while capturing; a graph replays what was
 * recorded. "Device" memory is host memory. FT_FAKE_FAIL="name=code,name=code" makes the named calls
 * fail with that code; FT_FAKE_PENDING=code puts a sticky error in place before anything runs (HIP).
 * The stream handle 0xCA97 always reports "capturing". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_CAPTURING_STREAM ((void*)(uintptr_t)0xCA97)

enum { OP_WRITE = 1, OP_WAIT = 2, MAX_OPS = 16 };
typedef struct { int kind; uint64_t* addr; uint64_t value; } fake_op;
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

static int fake_run(fake_op* op) {
  if (op->kind == OP_WRITE) *op->addr = op->value;
  if (op->kind == OP_WAIT && *op->addr < op->value) return 9999; /* would hang on a real GPU */
  return 0;
}

static int fake_enqueue(void* s, int kind, void* addr, uint64_t value) {
  fake_stream* st = (fake_stream*)s;
  fake_op op = {kind, (uint64_t*)addr, value};
  if (st && st->capturing) {
    if (st->n == MAX_OPS) return 9998;
    st->ops[st->n++] = op;
    return 0;
  }
  return fake_run(&op);
}
