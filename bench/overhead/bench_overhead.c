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
 * local WRITEs, per batch and per request; over shm (two engines of this
 * process with only it) the one-request calls and a batch of <batch>
 * 4 KiB WRITEs into tent_alloc memory, with a transport and a timeout (as
 * bench/sweep passes them).
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

static stamp best(stamp a, stamp b) {
  return (stamp){a.wall < b.wall ? a.wall : b.wall, a.cpu < b.cpu ? a.cpu : b.cpu};
}

/* shm rounds: bench_overhead.py's SHM_ROUNDS and shm_iters. */
#define SHM_ROUNDS 7
#define SHM_ITERS(iters) ((iters) / 10 > 0 ? (iters) / 10 : 1)

/* One 64-byte request between src (registered with e) and dst (the
 * segment's), four ways: tent_transfer_sync WRITE and READ, a
 * batch of one (tent_transfer + tent_batch_wait + tent_batch_destroy), and
 * a batch of one through tent_transfer_poll (waiting only when the batch
 * is not finished yet). */
typedef struct {
  stamp sync_write, sync_read, one_batch, one_batch_poll;
} one_request;

static one_request one_request_costs(tent_engine *e, tent_segment *seg, char *src, char *dst, long iters) {
  one_request r;
  tent_request one = {TENT_OP_WRITE, 0, src, seg, (uint64_t)(uintptr_t)dst, 64};
  for (long i = 0; i < iters / 10; i++) CHECK(tent_transfer_sync(e, &one, 1, NULL, NULL));
  stamp t0 = now();
  for (long i = 0; i < iters; i++) CHECK(tent_transfer_sync(e, &one, 1, NULL, NULL));
  r.sync_write = since(t0, iters);

  tent_request one_read = {TENT_OP_READ, 0, src, seg, (uint64_t)(uintptr_t)dst, 64};
  for (long i = 0; i < iters / 10; i++) CHECK(tent_transfer_sync(e, &one_read, 1, NULL, NULL));
  t0 = now();
  for (long i = 0; i < iters; i++) CHECK(tent_transfer_sync(e, &one_read, 1, NULL, NULL));
  r.sync_read = since(t0, iters);

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
  r.one_batch = since(t0, iters);

  t0 = now();
  for (long i = 0; i < iters; i++) {
    tent_batch *b = NULL;
    tent_status st = tent_transfer_poll(e, &one, 1, NULL, &b);
    if (st == TENT_PENDING) st = tent_batch_wait(b, -1);
    CHECK(st);
    CHECK(tent_batch_destroy(b));
  }
  r.one_batch_poll = since(t0, iters);
  return r;
}

/* The shm batch: SHM_BLOCK bytes a request, SHM_TIMEOUT_MS its deadline
 * (bench_overhead.py's SHM_BLOCK and SHM_TIMEOUT). */
#define SHM_BLOCK 4096
#define SHM_TIMEOUT_MS 120000

/* A batch of n requests (submit with a transport and a timeout, wait,
 * destroy), per batch. */
static stamp shm_batch_cost(tent_engine *e, const tent_request *reqs, size_t n, long iters) {
  tent_transfer_options opts = TENT_TRANSFER_OPTIONS_INIT;
  opts.timeout_ms = SHM_TIMEOUT_MS;
  opts.transport = "shm";
  stamp t0 = now();
  for (long i = 0; i < iters; i++) {
    tent_batch *b = NULL;
    CHECK(tent_transfer(e, reqs, n, &opts, &b));
    CHECK(tent_batch_wait(b, -1));
    CHECK(tent_batch_destroy(b));
  }
  return since(t0, iters);
}

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

  one_request local = one_request_costs(e, seg, src, dst, iters);

  /* The same over shm: two engines of this process that have only it. */
  tent_engine_options so = TENT_ENGINE_OPTIONS_INIT;
  so.transports = "shm";
  tent_engine *sa = NULL, *sb = NULL;
  CHECK(tent_engine_create(&so, &sa));
  CHECK(tent_engine_create(&so, &sb));
  char *ssrc = calloc(1, 64), *sdst = calloc(1, 64);
  tent_region *srs = NULL, *srd = NULL;
  CHECK(tent_register(sa, ssrc, 64, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &srs));
  CHECK(tent_register(sb, sdst, 64, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &srd));
  char sbname[256];
  CHECK(tent_engine_name(sb, sbname, sizeof sbname, NULL));
  tent_segment *sseg = NULL;
  CHECK(tent_segment_open(sa, sbname, &sseg));
  /* shm's cost swings with the machine's load: the best of SHM_ROUNDS
   * short rounds (as the Python side does). */
  one_request shm = one_request_costs(sa, sseg, ssrc, sdst, SHM_ITERS(iters));
  for (int k = 1; k < SHM_ROUNDS; k++) {
    one_request r = one_request_costs(sa, sseg, ssrc, sdst, SHM_ITERS(iters));
    shm.sync_write = best(shm.sync_write, r.sync_write);
    shm.sync_read = best(shm.sync_read, r.sync_read);
    shm.one_batch = best(shm.one_batch, r.one_batch);
    shm.one_batch_poll = best(shm.one_batch_poll, r.one_batch_poll);
  }
  /* batch x 4 KiB into the other engine's tent_alloc memory (memfd, which
   * shm maps), as bench/sweep's shm/alloc points move them. */
  char *bsrc = calloc(batch, SHM_BLOCK);
  void *bdst = NULL;
  tent_region *brs = NULL, *brd = NULL;
  CHECK(tent_register(sa, bsrc, batch * SHM_BLOCK, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &brs));
  CHECK(tent_alloc(sb, batch * SHM_BLOCK, NULL, TENT_REMOTE_READ | TENT_REMOTE_WRITE, &bdst, &brd));
  tent_request *breqs = calloc(batch, sizeof *breqs);
  for (size_t i = 0; i < batch; i++) {
    breqs[i] = (tent_request){TENT_OP_WRITE, 0, bsrc + SHM_BLOCK * i, sseg,
                              (uint64_t)(uintptr_t)bdst + SHM_BLOCK * i, SHM_BLOCK};
  }
  shm_batch_cost(sa, breqs, batch, SHM_ITERS(iters) / 10 + 1); /* warm up: the mapping, the grants */
  stamp shm_batch = shm_batch_cost(sa, breqs, batch, SHM_ITERS(iters));
  for (int k = 1; k < SHM_ROUNDS; k++) shm_batch = best(shm_batch, shm_batch_cost(sa, breqs, batch, SHM_ITERS(iters)));
  CHECK(tent_unregister(sa, brs));
  CHECK(tent_free(sb, brd));
  free(breqs);
  free(bsrc);
  CHECK(tent_segment_close(sa, sseg));
  CHECK(tent_unregister(sa, srs));
  CHECK(tent_unregister(sb, srd));
  CHECK(tent_engine_destroy(sa));
  CHECK(tent_engine_destroy(sb));
  free(ssrc);
  free(sdst);

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

  printf("{\"version_call_us\": %.4f, \"go_call_us\": %.4f, \"batch_us\": %.3f, \"batch_per_request_us\": %.4f, "
         "\"version_call_cpu_us\": %.4f, \"go_call_cpu_us\": %.4f, "
         "\"batch_cpu_us\": %.3f, \"batch_per_request_cpu_us\": %.4f, \"batch\": %zu, \"sink\": %u",
         version_us.wall, go_us.wall, batch_us.wall, batch_us.wall / batch, version_us.cpu, go_us.cpu,
         batch_us.cpu, batch_us.cpu / batch, batch, (unsigned)sink);
  printf(", \"shm_batch_us\": %.3f, \"shm_batch_cpu_us\": %.3f", shm_batch.wall, shm_batch.cpu);
  const struct {
    const char *prefix;
    one_request *r;
  } paths[] = {{"", &local}, {"shm_", &shm}};
  for (size_t p = 0; p < 2; p++) {
    one_request *r = paths[p].r;
    const char *x = paths[p].prefix;
    printf(", \"%ssync_write_us\": %.3f, \"%ssync_write_cpu_us\": %.3f", x, r->sync_write.wall, x, r->sync_write.cpu);
    printf(", \"%ssync_read_us\": %.3f, \"%ssync_read_cpu_us\": %.3f", x, r->sync_read.wall, x, r->sync_read.cpu);
    printf(", \"%sone_batch_us\": %.3f, \"%sone_batch_cpu_us\": %.3f", x, r->one_batch.wall, x, r->one_batch.cpu);
    printf(", \"%sone_batch_poll_us\": %.3f, \"%sone_batch_poll_cpu_us\": %.3f", x, r->one_batch_poll.wall, x,
           r->one_batch_poll.cpu);
  }
  printf("}\n");
  CHECK(tent_segment_close(e, seg));
  CHECK(tent_unregister(e, rs));
  CHECK(tent_unregister(e, rd));
  CHECK(tent_engine_destroy(e));
  free(reqs);
  free(src);
  free(dst);
  return 0;
}
