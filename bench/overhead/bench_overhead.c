/*
 * bench_overhead.c — the C side of bench/overhead/bench_overhead.py: the
 * cost of the same calls without Python, in the same run.
 *
 *   bench_overhead <iterations> <batch>
 *
 * Prints one JSON object (microseconds of wall time, and *_cpu_us: of
 * process CPU time): a plain C call (tent_version),
 * a cheap call into Go (tent_engine_name), a 64-byte local WRITE and READ
 * with tent_transfer_sync, a batch of one 64-byte WRITE (tent_transfer +
 * tent_batch_wait + tent_batch_destroy), and a batch of <batch> 64-byte
 * local WRITEs, per batch and per request.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tent.h"

static double clock_us(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Wall time, and CPU time of the whole process (all threads: the Go
 * runtime's included), which a loaded machine distorts much less. */
typedef struct {
  double wall, cpu;
} stamp;

static stamp now(void) { return (stamp){clock_us(CLOCK_MONOTONIC), clock_us(CLOCK_PROCESS_CPUTIME_ID)}; }

static stamp since(stamp t0, double n) {
  stamp t = now();
  return (stamp){(t.wall - t0.wall) / n, (t.cpu - t0.cpu) / n};
}

#define CHECK(call)                                                             \
  do {                                                                          \
    tent_status st_ = (call);                                                   \
    if (st_ != TENT_OK) {                                                       \
      fprintf(stderr, "%s: %s: %s\n", #call, tent_status_str(st_), tent_last_error()); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 20000;
  size_t batch = argc > 2 ? (size_t)atol(argv[2]) : 128;
  tent_engine *e = NULL;
  CHECK(tent_engine_create(NULL, &e));
  char name[256];
  CHECK(tent_engine_name(e, name, sizeof name, NULL));
  size_t size = 64 * batch;
  char *src = calloc(1, size), *dst = calloc(1, size);
  tent_region *rs = NULL, *rd = NULL;
  CHECK(tent_register(e, src, size, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &rs));
  CHECK(tent_register(e, dst, size, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &rd));
  tent_segment *seg = NULL;
  CHECK(tent_segment_open(e, name, &seg));

  volatile uint32_t sink = 0;
  stamp t0 = now();
  for (long i = 0; i < iters * 10; i++) sink += tent_version();
  stamp version_us = since(t0, iters * 10);

  char namebuf[256];
  t0 = now();
  for (long i = 0; i < iters; i++) CHECK(tent_engine_name(e, namebuf, sizeof namebuf, NULL));
  stamp go_us = since(t0, iters);

  tent_request one = {TENT_OP_WRITE, 0, src, seg, (uint64_t)(uintptr_t)dst, 64};
  for (long i = 0; i < iters / 10; i++) CHECK(tent_transfer_sync(e, &one, 1, NULL, NULL));
  t0 = now();
  for (long i = 0; i < iters; i++) CHECK(tent_transfer_sync(e, &one, 1, NULL, NULL));
  stamp sync_us = since(t0, iters);

  tent_request one_read = {TENT_OP_READ, 0, dst, seg, (uint64_t)(uintptr_t)src, 64};
  for (long i = 0; i < iters / 10; i++) CHECK(tent_transfer_sync(e, &one_read, 1, NULL, NULL));
  t0 = now();
  for (long i = 0; i < iters; i++) CHECK(tent_transfer_sync(e, &one_read, 1, NULL, NULL));
  stamp sync_read_us = since(t0, iters);

  for (long i = 0; i < iters / 10; i++) {
    tent_batch *b = NULL;
    CHECK(tent_transfer(e, &one, 1, NULL, &b));
    CHECK(tent_batch_wait(b, -1));
    CHECK(tent_batch_destroy(b));
  }
  t0 = now();
  for (long i = 0; i < iters; i++) {
    tent_batch *b = NULL;
    CHECK(tent_transfer(e, &one, 1, NULL, &b));
    CHECK(tent_batch_wait(b, -1));
    CHECK(tent_batch_destroy(b));
  }
  stamp one_batch_us = since(t0, iters);

  tent_request *reqs = calloc(batch, sizeof *reqs);
  for (size_t i = 0; i < batch; i++) {
    reqs[i] = (tent_request){TENT_OP_WRITE, 0, src + 64 * i, seg, (uint64_t)(uintptr_t)(dst + 64 * i), 64};
  }
  long biters = iters / 10 > 0 ? iters / 10 : 1;
  for (long i = 0; i < biters / 10 + 1; i++) {
    tent_batch *b = NULL;
    CHECK(tent_transfer(e, reqs, batch, NULL, &b));
    CHECK(tent_batch_wait(b, -1));
    CHECK(tent_batch_destroy(b));
  }
  t0 = now();
  for (long i = 0; i < biters; i++) {
    tent_batch *b = NULL;
    CHECK(tent_transfer(e, reqs, batch, NULL, &b));
    CHECK(tent_batch_wait(b, -1));
    CHECK(tent_batch_destroy(b));
  }
  stamp batch_us = since(t0, biters);

  printf("{\"version_call_us\": %.4f, \"go_call_us\": %.4f, \"sync_write_us\": %.3f, \"sync_read_us\": %.3f, "
         "\"one_batch_us\": %.3f, \"batch_us\": %.3f, \"batch_per_request_us\": %.4f, "
         "\"version_call_cpu_us\": %.4f, \"go_call_cpu_us\": %.4f, \"sync_write_cpu_us\": %.3f, "
         "\"sync_read_cpu_us\": %.3f, \"one_batch_cpu_us\": %.3f, "
         "\"batch_cpu_us\": %.3f, \"batch_per_request_cpu_us\": %.4f, \"batch\": %zu, \"sink\": %u}\n",
         version_us.wall, go_us.wall, sync_us.wall, sync_read_us.wall, one_batch_us.wall, batch_us.wall,
         batch_us.wall / batch, version_us.cpu, go_us.cpu, sync_us.cpu, sync_read_us.cpu, one_batch_us.cpu,
         batch_us.cpu, batch_us.cpu / batch, batch, (unsigned)sink);
  CHECK(tent_segment_close(e, seg));
  CHECK(tent_unregister(e, rs));
  CHECK(tent_unregister(e, rd));
  CHECK(tent_engine_destroy(e));
  free(reqs);
  free(src);
  free(dst);
  return 0;
}
