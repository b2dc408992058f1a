/*
 * test_alias.c — out-parameters that alias each other or their inputs, and
 * versioned out-structs at the edge of writable memory.
 *
 * - Out-parameters of one call that overlap are TENT_ERR_INVALID_ARGUMENT
 *   naming both, with nothing created or dequeued: written one after the
 *   other, one result would overwrite another (tent_alloc's address over
 *   its region handle, a length over a message).
 * - An out-parameter that aliases an input array is fine: inputs are
 *   copied before anything is written (tent_register_batch's regions_out
 *   over its descs, tent_transfer_sync's statuses over its requests, a
 *   request array inside the memory the transfer overwrites).
 * - tent_engine_stats and tent_region_get_info write their struct whole or
 *   not at all (one that runs into read-only memory is left untouched),
 *   and zero the bytes past the struct this library knows, up to the
 *   caller's size.
 * Every case ends with the engine's counts back at their baseline.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

static tent_engine *engine;
static tent_segment *self;

static tent_stats stats(void) {
  tent_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK_ST(tent_engine_stats(engine, &s), TENT_OK);
  return s;
}

static void check_baseline(void) {
  tent_stats s = stats();
  CHECK_EQ_U64(s.regions, 0);
  CHECK_EQ_U64(s.allocations, 0);
  CHECK_EQ_U64(s.batches, 0);
  CHECK_EQ_U64(s.handles, 1); /* the open segment */
  CHECK_EQ_U64(s.requests_in_flight, 0);
}

static int mentions(const char *a, const char *b) {
  const char *m = tent_last_error();
  return strstr(m, a) != NULL && strstr(m, b) != NULL && strstr(m, "overlap") != NULL;
}

static void test_overlapping_outs(void) {
  /* tent_alloc: the address and the handle in one place */
  void *both[2] = {(void *)1, (void *)1};
  CHECK_ST(tent_alloc(engine, 4096, "cpu", RW, &both[0], (tent_region **)&both[0]), TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("addr_out", "region_out"));
  /* half over each other */
  unsigned char raw[16];
  memset(raw, 0x5A, sizeof raw);
  CHECK_ST(tent_alloc(engine, 4096, "cpu", RW, (void **)(raw + 4), (tent_region **)raw), TENT_ERR_INVALID_ARGUMENT);
  CHECK(raw[0] == 0x5A && raw[15] == 0x5A);
  CHECK(both[0] == (void *)1);
  check_baseline();

  /* the name and its length in one buffer */
  char name[64];
  memset(name, 'x', sizeof name);
  CHECK_ST(tent_engine_name(engine, name, sizeof name, (size_t *)(void *)(name + 8)), TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("len_out", "buf"));
  CHECK(name[0] == 'x');
  char json[1 << 14];
  CHECK_ST(tent_engine_stats_json(engine, json, sizeof json, (size_t *)(void *)json), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_engine_transports(engine, json, sizeof json, (size_t *)(void *)(json + 1)), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_topology_json(json, sizeof json, (size_t *)(void *)(json + 64)), TENT_ERR_INVALID_ARGUMENT);
  /* a length just past the buffer is fine, and so is one in a buffer too small to be written */
  struct {
    char buf[64];
    size_t len;
  } adj;
  CHECK_ST(tent_engine_name(engine, adj.buf, sizeof adj.buf, &adj.len), TENT_OK);
  CHECK_EQ_U64(adj.len, strlen(adj.buf));
  CHECK_ST(tent_engine_name(engine, adj.buf, 1, (size_t *)(void *)adj.buf), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(*(size_t *)(void *)adj.buf, adj.len);

  /* a notification's message, sender and length over each other: the
   * message stays queued */
  CHECK_ST(tent_notify_send(engine, self, "hello", 5), TENT_OK);
  char msg[2048];
  size_t len = 0;
  CHECK_ST(tent_notify_recv(engine, 5000, msg, sizeof msg, &len, msg + 100, 200), TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("buf", "from"));
  CHECK_ST(tent_notify_recv(engine, 5000, msg, sizeof msg, (size_t *)(void *)(msg + 8), NULL, 0),
           TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("len_out", "buf"));
  char from[TENT_MAX_NAME_LEN + 1];
  CHECK_ST(tent_notify_recv(engine, 5000, msg, sizeof msg, (size_t *)(void *)from, from, sizeof from),
           TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("len_out", "from"));
  CHECK_ST(tent_notify_recv(engine, 5000, msg, sizeof msg, &len, from, sizeof from), TENT_OK);
  CHECK_EQ_U64(len, 5);
  CHECK(memcmp(msg, "hello", 5) == 0);
  CHECK_ST(tent_notify_recv(engine, 0, msg, sizeof msg, &len, NULL, 0), TENT_ERR_TIMEOUT);
  check_baseline();
}

static void test_outs_over_inputs(void) {
  unsigned char *mem = aligned_alloc(4096, 1 << 20);
  CHECK(mem != NULL);
  /* regions_out over the descriptors it is made from */
  tent_region_desc d[4];
  for (int i = 0; i < 4; i++) d[i] = (tent_region_desc){mem + i * 4096, 4096, NULL};
  CHECK_ST(tent_register_batch(engine, d, 4, RW, (tent_region **)(void *)d), TENT_OK);
  CHECK_EQ_U64(stats().regions, 4);
  CHECK_ST(tent_unregister_batch(engine, (tent_region *const *)(void *)d, 4), TENT_OK);

  tent_region *r;
  CHECK_ST(tent_register(engine, mem, 1 << 20, NULL, RW, &r), TENT_OK);
  /* statuses over the requests they report */
  tent_request rq[4];
  for (int i = 0; i < 4; i++)
    rq[i] = (tent_request){TENT_OP_WRITE, 0, mem + i * 64, self, (uint64_t)(uintptr_t)(mem + 65536 + i * 64), 64};
  memset(mem, 7, 4096);
  CHECK_ST(tent_transfer_sync(engine, rq, 4, NULL, (tent_request_status *)(void *)rq), TENT_OK);
  tent_request_status *st = (tent_request_status *)(void *)rq;
  for (int i = 0; i < 4; i++) {
    CHECK_EQ_U64((uint64_t)(int64_t)st[i].status, TENT_OK);
    CHECK_EQ_U64(st[i].bytes, 64);
  }
  CHECK(mem[65536 + 255] == 7);
  /* a request array inside the memory its transfer overwrites */
  tent_request *inside = (tent_request *)(void *)(mem + 8192);
  memset(mem, 9, 4096);
  for (int i = 0; i < 4; i++) inside[i] = (tent_request){TENT_OP_WRITE, 0, mem, self, (uint64_t)(uintptr_t)(mem + 8192), 4096};
  CHECK_ST(tent_transfer_sync(engine, inside, 4, NULL, NULL), TENT_OK);
  CHECK(mem[8192] == 9 && mem[8192 + 4095] == 9);
  /* a batch's statuses over its completed count */
  tent_batch *b;
  rq[0] = (tent_request){TENT_OP_WRITE, 0, mem, self, (uint64_t)(uintptr_t)(mem + 65536), 64};
  CHECK_ST(tent_transfer(engine, rq, 1, NULL, &b), TENT_OK);
  CHECK_ST(tent_batch_wait(b, 10000), TENT_OK);
  tent_request_status bs[2];
  memset(bs, 0x77, sizeof bs);
  CHECK_ST(tent_batch_status(b, bs, 1, (size_t *)(void *)&bs[0].bytes), TENT_ERR_INVALID_ARGUMENT);
  CHECK(mentions("out", "completed_out"));
  CHECK_EQ_U64(bs[0].bytes, 0x7777777777777777ull);
  size_t done = 0;
  CHECK_ST(tent_batch_status(b, bs, 1, &done), TENT_OK);
  CHECK_EQ_U64(done, 1);
  /* n = 0 writes no status: the count may sit anywhere */
  CHECK_ST(tent_batch_status(b, bs, 0, (size_t *)(void *)bs), TENT_OK);
  CHECK_ST(tent_batch_destroy(b), TENT_OK);
  CHECK_ST(tent_unregister(engine, r), TENT_OK);
  free(mem);
  check_baseline();
}

static void test_structs_whole_or_not_at_all(void) {
  unsigned char *pg = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(pg != MAP_FAILED);
  CHECK(mprotect(pg + 4096, 4096, PROT_READ) == 0);
  /* a tent_stats whose last 16 bytes are read-only */
  unsigned char *at = pg + 4096 - (sizeof(tent_stats) - 16);
  memset(at, 0xAB, sizeof(tent_stats) - 16);
  ((tent_stats *)(void *)at)->size = sizeof(tent_stats);
  CHECK_ST(tent_engine_stats(engine, (tent_stats *)(void *)at), TENT_ERR_INVALID_ARGUMENT);
  CHECK(at[8] == 0xAB && at[sizeof(tent_stats) - 17] == 0xAB); /* regions .. untouched */

  unsigned char *mem = aligned_alloc(4096, 4096);
  tent_region *r;
  CHECK_ST(tent_register(engine, mem, 4096, NULL, TENT_REMOTE_READ, &r), TENT_OK);
  at = pg + 4096 - 12;
  memset(at, 0xAB, 12);
  ((tent_region_info *)(void *)at)->size = sizeof(tent_region_info);
  CHECK_ST(tent_region_get_info(engine, r, (tent_region_info *)(void *)at), TENT_ERR_INVALID_ARGUMENT);
  CHECK(at[4] == 0xAB && at[11] == 0xAB);

  /* a newer caller's larger struct: the unknown tail comes back zero */
  unsigned char big[512];
  memset(big, 0xCD, sizeof big);
  ((tent_stats *)(void *)big)->size = 256;
  CHECK_ST(tent_engine_stats(engine, (tent_stats *)(void *)big), TENT_OK);
  CHECK_EQ_U64(((tent_stats *)(void *)big)->size, 256);
  CHECK_EQ_U64(((tent_stats *)(void *)big)->regions, 1);
  int zero = 1;
  for (size_t i = sizeof(tent_stats); i < 256; i++) zero &= big[i] == 0;
  CHECK(zero);
  CHECK(big[256] == 0xCD);
  memset(big, 0xCD, sizeof big);
  ((tent_region_info *)(void *)big)->size = 200;
  CHECK_ST(tent_region_get_info(engine, r, (tent_region_info *)(void *)big), TENT_OK);
  CHECK_EQ_U64(((tent_region_info *)(void *)big)->len, 4096);
  CHECK_EQ_U64(((tent_region_info *)(void *)big)->flags, TENT_REMOTE_READ);
  zero = 1;
  for (size_t i = sizeof(tent_region_info); i < 200; i++) zero &= big[i] == 0;
  CHECK(zero);
  CHECK(big[200] == 0xCD);
  /* a size that runs into read-only memory: nothing written */
  at = pg + 4096 - sizeof(tent_stats);
  memset(at, 0xAB, sizeof(tent_stats));
  ((tent_stats *)(void *)at)->size = sizeof(tent_stats) + 8;
  CHECK_ST(tent_engine_stats(engine, (tent_stats *)(void *)at), TENT_ERR_INVALID_ARGUMENT);
  CHECK(at[8] == 0xAB);
  CHECK_ST(tent_unregister(engine, r), TENT_OK);
  free(mem);
  munmap(pg, 8192);
  check_baseline();
}

int main(void) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "local";
  CHECK_ST(tent_engine_create(&o, &engine), TENT_OK);
  char name[TENT_MAX_NAME_LEN + 1];
  CHECK_ST(tent_engine_name(engine, name, sizeof name, NULL), TENT_OK);
  CHECK_ST(tent_segment_open(engine, name, &self), TENT_OK);
  test_overlapping_outs();
  test_outs_over_inputs();
  test_structs_whole_or_not_at_all();
  CHECK_ST(tent_segment_close(engine, self), TENT_OK);
  CHECK_ST(tent_engine_destroy(engine), TENT_OK);
  return check_summary("test_alias");
}
