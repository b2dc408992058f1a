/*
 * test_badstate.c — the C ABI against bad state rather than bad pointers
 * (test_badinput.c): stale, double-released and foreign handles of every
 * kind in every handle slot, handles used after tent_engine_destroy,
 * misaligned arguments, absurd values, batch arrays that run into an
 * unmapped page, many threads using an engine while it is destroyed, and
 * log callbacks swapped while lines are delivered. Every call must return
 * its documented status with a message, never crash or hang (alarm), and
 * every count comes back to its baseline.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "tent.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

static tent_stats stats_of(tent_engine *e) {
  tent_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK_ST(tent_engine_stats(e, &s), TENT_OK);
  return s;
}

static tent_engine *new_engine(const char *transports) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = transports;
  o.unregister_timeout_ms = 500;
  o.timeout_ms = 5000;
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  return e;
}

static uint64_t process_handles(void) {
  tent_engine *probe = new_engine("local");
  uint64_t n = stats_of(probe).process_handles;
  CHECK_ST(tent_engine_destroy(probe), TENT_OK);
  return n;
}

static tent_segment *open_self(tent_engine *e) {
  char name[TENT_MAX_NAME_LEN + 1];
  size_t n = 0;
  CHECK_ST(tent_engine_name(e, name, sizeof name, &n), TENT_OK);
  tent_segment *s = NULL;
  CHECK_ST(tent_segment_open(e, name, &s), TENT_OK);
  return s;
}

static tent_request write_req(unsigned char *buf, tent_segment *s, size_t off, uint64_t len) {
  tent_request r;
  memset(&r, 0, sizeof r);
  r.opcode = TENT_OP_WRITE;
  r.local_addr = buf;
  r.segment = s;
  r.remote_addr = (uint64_t)(uintptr_t)(buf + off);
  r.length = len;
  return r;
}

static int known(tent_status st) {
  return st == TENT_OK || st == TENT_PENDING || strcmp(tent_status_str(st), "unknown status") != 0;
}

/* ---- Stale and double-released handles ---------------------------------- */

static void test_stale_and_double_release(void) {
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  tent_segment *s = open_self(e);
  tent_request q = write_req(buf, s, 4096, 64);
  tent_batch *b = NULL;
  CHECK_ST(tent_transfer(e, &q, 1, NULL, &b), TENT_OK);
  CHECK_ST(tent_batch_wait(b, 5000), TENT_OK);

  /* Each released once, then every use of the stale handle. */
  CHECK_ST(tent_batch_destroy(b), TENT_OK);
  CHECK_ST(tent_batch_destroy(b), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_wait(b, 0), TENT_ERR_INVALID_HANDLE);
  tent_request_status rs[1];
  size_t done = 77;
  CHECK_ST(tent_batch_status(b, rs, 1, &done), TENT_ERR_INVALID_HANDLE);
  CHECK_EQ_U64(done, 77);

  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_ST(tent_segment_close(e, s), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_notify_send(e, s, "x", 1), TENT_ERR_INVALID_HANDLE);
  tent_batch *b2 = (tent_batch *)(uintptr_t)1;
  CHECK_ST(tent_transfer(e, &q, 1, NULL, &b2), TENT_ERR_INVALID_HANDLE);
  CHECK(b2 == (tent_batch *)(uintptr_t)1); /* untouched on failure */
  CHECK_ST(tent_transfer_poll(e, &q, 1, NULL, &b2), TENT_ERR_INVALID_HANDLE);
  CHECK(b2 == NULL);
  CHECK_ST(tent_transfer_sync(e, &q, 1, NULL, NULL), TENT_ERR_INVALID_HANDLE);

  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_free(e, r), TENT_ERR_INVALID_HANDLE);
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  CHECK_ST(tent_region_get_info(e, r, &info), TENT_ERR_INVALID_HANDLE);
  tent_region *pair[2] = {r, r};
  CHECK_ST(tent_unregister_batch(e, pair, 1), TENT_ERR_INVALID_HANDLE);

  void *a = NULL;
  tent_region *ar = NULL;
  CHECK_ST(tent_alloc(e, 8192, "cpu", RW, &a, &ar), TENT_OK);
  CHECK_ST(tent_free(e, ar), TENT_OK);
  CHECK_ST(tent_free(e, ar), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(e, ar), TENT_ERR_INVALID_HANDLE);

  tent_stats st = stats_of(e);
  CHECK_EQ_U64(st.regions, 0);
  CHECK_EQ_U64(st.handles, 0);
  CHECK_EQ_U64(st.batches, 0);
  CHECK_EQ_U64(st.segments, 0);
  CHECK_EQ_U64(st.allocations, 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_ERR_INVALID_HANDLE);
  free(buf);
}

/* ---- A handle of one kind in the slot of another ------------------------ */

static void test_every_kind_in_every_slot(void) {
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  tent_segment *s = open_self(e);
  tent_request q = write_req(buf, s, 4096, 64);
  tent_batch *b = NULL;
  CHECK_ST(tent_transfer(e, &q, 1, NULL, &b), TENT_OK);
  CHECK_ST(tent_batch_wait(b, 5000), TENT_OK);
  void *handles[4] = {e, r, s, b};
  tent_stats st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  tent_request_status rs[1];
  char text[256];

  for (int k = 0; k < 4; k++) {
    void *h = handles[k];
    if (k != 0) {
      CHECK_ST(tent_engine_stats((tent_engine *)h, &st), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_engine_name((tent_engine *)h, text, sizeof text, NULL), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_engine_transports((tent_engine *)h, text, sizeof text, NULL), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_engine_stats_json((tent_engine *)h, text, sizeof text, NULL), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_uninstall((tent_engine *)h, "local"), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_engine_destroy((tent_engine *)h), TENT_ERR_INVALID_HANDLE);
    }
    if (k != 1) {
      CHECK_ST(tent_region_get_info(e, (tent_region *)h, &info), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_unregister(e, (tent_region *)h), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_free(e, (tent_region *)h), TENT_ERR_INVALID_HANDLE);
      tent_region *one[1] = {(tent_region *)h};
      CHECK_ST(tent_unregister_batch(e, one, 1), TENT_ERR_INVALID_HANDLE);
    }
    if (k != 2) {
      CHECK_ST(tent_segment_close(e, (tent_segment *)h), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_notify_send(e, (tent_segment *)h, "x", 1), TENT_ERR_INVALID_HANDLE);
      tent_request bad = write_req(buf, (tent_segment *)h, 4096, 64);
      tent_batch *nb = NULL;
      CHECK_ST(tent_transfer(e, &bad, 1, NULL, &nb), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_transfer_sync(e, &bad, 1, NULL, NULL), TENT_ERR_INVALID_HANDLE);
    }
    if (k != 3) {
      CHECK_ST(tent_batch_status((tent_batch *)h, rs, 1, NULL), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_batch_wait((tent_batch *)h, 0), TENT_ERR_INVALID_HANDLE);
      CHECK_ST(tent_batch_destroy((tent_batch *)h), TENT_ERR_INVALID_HANDLE);
    }
  }
  /* Nothing was released by a call that got the wrong kind. */
  st = stats_of(e);
  CHECK_EQ_U64(st.regions, 1);
  CHECK_EQ_U64(st.segments, 1);
  CHECK_EQ_U64(st.batches, 1);
  CHECK_ST(tent_batch_status(b, rs, 1, NULL), TENT_OK);
  CHECK_ST(tent_transfer_sync(e, &q, 1, NULL, NULL), TENT_OK);

  /* Handles of another live engine. */
  tent_engine *other = new_engine("local");
  CHECK_ST(tent_segment_close(other, s), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_notify_send(other, s, "x", 1), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_free(other, r), TENT_ERR_INVALID_HANDLE);
  tent_request foreign = write_req(buf, s, 4096, 64);
  CHECK_ST(tent_transfer_sync(other, &foreign, 1, NULL, NULL), TENT_ERR_INVALID_HANDLE);
  CHECK_EQ_U64(stats_of(other).batches, 0);
  CHECK_ST(tent_engine_destroy(other), TENT_OK);

  CHECK_ST(tent_batch_destroy(b), TENT_OK);
  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

/* ---- Handles used after their engine was destroyed ---------------------- */

static void test_after_engine_destroy(void) {
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  void *a = NULL;
  tent_region *ar = NULL;
  CHECK_ST(tent_alloc(e, 8192, "cpu", RW, &a, &ar), TENT_OK);
  tent_segment *s = open_self(e);
  tent_request q = write_req(buf, s, 4096, 64);
  tent_batch *b = NULL;
  CHECK_ST(tent_transfer(e, &q, 1, NULL, &b), TENT_OK);
  CHECK_ST(tent_batch_wait(b, 5000), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);

  tent_request_status rs[1];
  CHECK_ST(tent_batch_status(b, rs, 1, NULL), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_wait(b, 100), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_destroy(b), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_segment_close(e, s), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(e, r), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_free(e, ar), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_transfer_sync(e, &q, 1, NULL, NULL), TENT_ERR_INVALID_HANDLE);
  char m[16];
  size_t n = 0;
  CHECK_ST(tent_notify_recv(e, 0, m, sizeof m, &n, NULL, 0), TENT_ERR_INVALID_HANDLE);
  /* The same handles with a new engine (ids are never reused). */
  tent_engine *e2 = new_engine("local");
  CHECK(e2 != e);
  CHECK_ST(tent_segment_close(e2, s), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(e2, r), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_destroy(b), TENT_ERR_INVALID_HANDLE);
  tent_region *r2 = NULL;
  CHECK_ST(tent_register(e2, buf, 1 << 16, "cpu", RW, &r2), TENT_OK); /* e's registration is gone */
  CHECK_ST(tent_unregister(e2, r2), TENT_OK);
  CHECK_ST(tent_engine_destroy(e2), TENT_OK);
  free(buf);
}

/* ---- Misaligned arguments ------------------------------------------------ */

static void test_misaligned(void) {
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  _Alignas(16) unsigned char raw[4096];

  /* Out-parameters at odd addresses: written correctly, not a crash. */
  tent_region **rout = (tent_region **)(void *)(raw + 1);
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, rout), TENT_OK);
  tent_region *r;
  memcpy(&r, raw + 1, sizeof r);
  tent_stats *sout = (tent_stats *)(void *)(raw + 64 + 3);
  tent_stats want;
  memset(&want, 0, sizeof want);
  want.size = sizeof want;
  memcpy(sout, &want, sizeof want);
  CHECK_ST(tent_engine_stats(e, sout), TENT_OK);
  memcpy(&want, sout, sizeof want);
  CHECK_EQ_U64(want.regions, 1);

  tent_segment *s = open_self(e);
  /* A misaligned request array, batch_out, status array and count. */
  tent_request q = write_req(buf, s, 4096, 64);
  tent_request *qs = (tent_request *)(void *)(raw + 1024 + 5);
  memcpy(qs, &q, sizeof q);
  tent_batch **bout = (tent_batch **)(void *)(raw + 2048 + 7);
  tent_status st = tent_transfer(e, qs, 1, NULL, bout);
  CHECK(st == TENT_OK || st == TENT_ERR_INVALID_ARGUMENT);
  if (st == TENT_OK) {
    tent_batch *b;
    memcpy(&b, raw + 2048 + 7, sizeof b);
    CHECK_ST(tent_batch_wait(b, 5000), TENT_OK);
    tent_request_status *rs = (tent_request_status *)(void *)(raw + 3072 + 1);
    size_t *done = (size_t *)(void *)(raw + 3072 + 200 + 3);
    CHECK_ST(tent_batch_status(b, rs, 1, done), TENT_OK);
    size_t d;
    memcpy(&d, done, sizeof d);
    CHECK_EQ_U64(d, 1);
    tent_request_status got;
    memcpy(&got, rs, sizeof got);
    CHECK_EQ_U64(got.bytes, 64);
    CHECK_ST(tent_batch_destroy(b), TENT_OK);
  }
  /* A misaligned descriptor array for a batch registration. */
  tent_region_desc d = {buf + 8192, 64, "cpu"};
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  tent_region_desc *ds = (tent_region_desc *)(void *)(raw + 9);
  memcpy(ds, &d, sizeof d);
  tent_region **routs = (tent_region **)(void *)(raw + 512 + 3);
  CHECK_ST(tent_register_batch(e, ds, 1, RW, routs), TENT_OK);
  memcpy(&r, raw + 512 + 3, sizeof r);
  CHECK_ST(tent_unregister_batch(e, routs, 1), TENT_OK);
  (void)r;
  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_EQ_U64(stats_of(e).handles, 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

/* ---- Absurd values ------------------------------------------------------- */

static void test_absurd_values(void) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  tent_engine *x = NULL;
  o.transports = "local";
  o.timeout_ms = UINT64_MAX;
  CHECK_ST(tent_engine_create(&o, &x), TENT_ERR_INVALID_ARGUMENT);
  o.timeout_ms = 0;
  o.unregister_timeout_ms = UINT64_MAX;
  CHECK_ST(tent_engine_create(&o, &x), TENT_ERR_INVALID_ARGUMENT);
  o.unregister_timeout_ms = 0;
  o.tcp_streams = UINT32_MAX;
  CHECK_ST(tent_engine_create(&o, &x), TENT_ERR_INVALID_ARGUMENT);
  o.tcp_streams = 0;
  o.size = 0;
  CHECK_ST(tent_engine_create(&o, &x), TENT_ERR_INVALID_ARGUMENT);
  o.size = UINT32_MAX;
  CHECK_ST(tent_engine_create(&o, &x), TENT_ERR_INVALID_ARGUMENT);
  o.size = sizeof o;
  CHECK(x == NULL);
  CHECK_ST(tent_log_set_level(INT_MIN), TENT_ERR_INVALID_ARGUMENT);

  /* The longest timeout accepted still works: deadlines far in the future
   * (past what nanoseconds since 1970 can hold) neither overflow nor fail. */
  o.timeout_ms = (uint64_t)(INT64_MAX / 1000000);
  o.transports = NULL;
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 3, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  tent_segment *s = open_self(e);
  tent_request q = write_req(buf, s, 4096, 64);
  CHECK_ST(tent_transfer_sync(e, &q, 1, NULL, NULL), TENT_OK);
  static const char *const ts[] = {"local", "shm", "tcp"};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    tent_transfer_options to = TENT_TRANSFER_OPTIONS_INIT;
    to.transport = ts[i];
    to.timeout_ms = (uint64_t)(INT64_MAX / 1000000);
    tent_request_status rs[1];
    memset(buf + 4096, 0, 64);
    tent_status st = tent_transfer_sync(e, &q, 1, &to, rs);
    CHECK(st == TENT_OK || st == TENT_ERR_UNSUPPORTED || st == TENT_ERR_NOT_FOUND);
    if (st == TENT_OK) CHECK(buf[4096] == 3);
    if (st != TENT_OK) fprintf(stderr, "    (transport %s: %s: %s)\n", ts[i], tent_status_str(st), tent_last_error());
  }
  tent_batch *b = NULL;
  CHECK_ST(tent_transfer(e, &q, 1, NULL, &b), TENT_OK);
  CHECK_ST(tent_batch_wait(b, INT64_MIN), TENT_OK); /* negative: the batch's own deadline */
  CHECK_ST(tent_batch_wait(b, -1), TENT_OK);
  CHECK_ST(tent_batch_destroy(b), TENT_OK);
  CHECK_ST(tent_notify_send(e, s, "m", 1), TENT_OK);
  char m[8];
  size_t n = 0;
  CHECK_ST(tent_notify_recv(e, INT64_MIN, m, sizeof m, &n, NULL, 0), TENT_OK);
  CHECK_EQ_U64(n, 1);

  /* Values the header bounds. */
  tent_transfer_options to = TENT_TRANSFER_OPTIONS_INIT;
  to.timeout_ms = UINT64_MAX;
  CHECK_ST(tent_transfer_sync(e, &q, 1, &to, NULL), TENT_ERR_INVALID_ARGUMENT);
  to.timeout_ms = 0;
  to.notify = buf;
  to.notify_len = 65537;
  CHECK_ST(tent_transfer_sync(e, &q, 1, &to, NULL), TENT_ERR_INVALID_ARGUMENT);
  to.notify_len = 0;
  to.reserved0 = 1;
  to.notify = NULL;
  CHECK_ST(tent_transfer_sync(e, &q, 1, &to, NULL), TENT_ERR_INVALID_ARGUMENT);
  to.reserved0 = 0;
  to.size = 0;
  CHECK_ST(tent_transfer_sync(e, &q, 1, &to, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_notify_send(e, s, buf, 65537), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer_sync(e, &q, 0, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer_sync(e, &q, (size_t)-1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer_sync(e, &q, (size_t)TENT_MAX_BATCH + 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  tent_request bad = q;
  bad.opcode = 2;
  CHECK_ST(tent_transfer_sync(e, &bad, 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  bad = q;
  bad.reserved = 1;
  CHECK_ST(tent_transfer_sync(e, &bad, 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  bad = q;
  bad.length = 0;
  CHECK_ST(tent_transfer_sync(e, &bad, 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  bad = q;
  bad.length = UINT64_MAX;
  tent_status st = tent_transfer_sync(e, &bad, 1, NULL, NULL);
  CHECK(st == TENT_ERR_INVALID_ARGUMENT || st == TENT_ERR_NOT_REGISTERED || st == TENT_ERR_OUT_OF_RANGE);
  bad = q;
  bad.remote_addr = UINT64_MAX - 8; /* remote range wraps */
  tent_request_status rs[1];
  st = tent_transfer_sync(e, &bad, 1, NULL, rs);
  CHECK(st == TENT_ERR_NOT_REGISTERED || st == TENT_ERR_OUT_OF_RANGE || st == TENT_ERR_INVALID_ARGUMENT);
  CHECK(known(st) && st != TENT_OK);
  tent_region *r2 = NULL;
  CHECK_ST(tent_register(e, buf + 8192, 0, "cpu", RW, &r2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, 64, "cpu", 0xffffffffu, &r2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, (void *)(uintptr_t)(UINTPTR_MAX - 4095), 8192, "cpu", RW, &r2), TENT_ERR_INVALID_ARGUMENT);
  void *a = NULL;
  CHECK_ST(tent_alloc(e, 0, "cpu", RW, &a, &r2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(e, (size_t)1 << 62, "cpu", RW, &a, &r2), TENT_ERR_INVALID_ARGUMENT);
  tent_region_info info = {0, 0, 0, 0, {0}};
  CHECK_ST(tent_region_get_info(e, r, &info), TENT_ERR_INVALID_ARGUMENT);
  tent_stats sbad;
  memset(&sbad, 0, sizeof sbad);
  CHECK_ST(tent_engine_stats(e, &sbad), TENT_ERR_INVALID_ARGUMENT);
  size_t need = 0;
  CHECK_ST(tent_engine_name(e, NULL, 0, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK(need > 0);
  CHECK_ST(tent_engine_stats_json(e, NULL, 0, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_ST(tent_batch_status((tent_batch *)(uintptr_t)UINT64_MAX, NULL, 0, NULL), TENT_ERR_INVALID_HANDLE);

  tent_stats st2 = stats_of(e);
  CHECK_EQ_U64(st2.regions, 1);
  CHECK_EQ_U64(st2.batches, 0);
  CHECK_EQ_U64(st2.requests_in_flight, 0);
  CHECK_EQ_U64(st2.allocations, 0);
  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

/* ---- Arrays that run into an unmapped page ------------------------------- */

static void test_arrays_into_unmapped_page(void) {
  unsigned char *pages = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(pages != MAP_FAILED);
  CHECK(mprotect(pages + 4096, 4096, PROT_NONE) == 0);
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  tent_segment *s = open_self(e);

  /* unregister_batch: the first entry readable, the second not: all or
   * none, so the region stays. */
  tent_region **v = (tent_region **)(void *)(pages + 4096 - sizeof *v);
  *v = r;
  CHECK_ST(tent_unregister_batch(e, v, 2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_EQ_U64(stats_of(e).regions, 1);

  /* poll and sync with the second request in the PROT_NONE page. */
  tent_request *q = (tent_request *)(void *)(pages + 4096 - sizeof *q);
  *q = write_req(buf, s, 4096, 64);
  tent_batch *b = (tent_batch *)(uintptr_t)1;
  CHECK_ST(tent_transfer_poll(e, q, 2, NULL, &b), TENT_ERR_INVALID_ARGUMENT);
  CHECK(b == NULL);
  memset(buf + 4096, 0, 64);
  CHECK_ST(tent_transfer_sync(e, q, 2, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK(buf[4096] == 0); /* nothing moved */
  /* A status array with room for one status, asked for two. */
  tent_request two[2] = {write_req(buf, s, 4096, 64), write_req(buf, s, 8192, 64)};
  tent_request_status *rs = (tent_request_status *)(void *)(pages + 4096 - sizeof *rs);
  CHECK_ST(tent_transfer_sync(e, two, 2, NULL, rs), TENT_ERR_INVALID_ARGUMENT);
  CHECK(buf[4096] == 0);
  tent_batch *ok = NULL;
  CHECK_ST(tent_transfer(e, two, 2, NULL, &ok), TENT_OK);
  CHECK_ST(tent_batch_wait(ok, 5000), TENT_OK);
  size_t done = 5;
  CHECK_ST(tent_batch_status(ok, rs, 2, &done), TENT_ERR_INVALID_ARGUMENT);
  CHECK_EQ_U64(done, 5);
  CHECK_ST(tent_batch_status(ok, rs, 1, &done), TENT_OK);
  CHECK_EQ_U64(done, 2);
  CHECK_ST(tent_batch_destroy(ok), TENT_OK);
  /* A string that ends exactly at the page end without a NUL. */
  char *str = (char *)pages + 4096 - 9;
  memcpy(str, "127.0.0.1", 9);
  tent_segment *s2 = NULL;
  CHECK_ST(tent_segment_open(e, str, &s2), TENT_ERR_INVALID_ARGUMENT);
  memcpy(str, "localxxxx", 9);
  CHECK_ST(tent_uninstall(e, str), TENT_ERR_INVALID_ARGUMENT);

  tent_stats st = stats_of(e);
  CHECK_EQ_U64(st.batches, 0);
  CHECK_EQ_U64(st.segments, 1);
  CHECK_EQ_U64(st.regions, 1);
  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  munmap(pages, 2 * 4096);
  free(buf);
}

/* ---- Many threads on an engine being destroyed ---------------------------- */

#define NTHREADS 8
static tent_engine *victim;
static unsigned char *victim_buf;
static tent_segment *victim_seg;
static atomic_int started, unknown_status, iterations;

static int acceptable(tent_status st) {
  return st == TENT_OK || st == TENT_PENDING || st == TENT_ERR_INVALID_HANDLE || st == TENT_ERR_CLOSED ||
         st == TENT_ERR_TIMEOUT || st == TENT_ERR_BUSY || st == TENT_ERR_CANCELED ||
         st == TENT_ERR_NOT_REGISTERED || st == TENT_ERR_OVERLAP || st == TENT_ERR_TRANSPORT;
}

static void note(tent_status st, const char *what) {
  if (!acceptable(st)) {
    atomic_fetch_add(&unknown_status, 1);
    fprintf(stderr, "    %s during destroy: %d %s: %s\n", what, st, tent_status_str(st), tent_last_error());
  } else if (st != TENT_OK && st != TENT_PENDING && tent_last_error()[0] == '\0') {
    atomic_fetch_add(&unknown_status, 1);
    fprintf(stderr, "    %s during destroy: %s without a message\n", what, tent_status_str(st));
  }
}

static void *hammer(void *arg) {
  int id = (int)(intptr_t)arg;
  unsigned char *mine = victim_buf + 0x20000 + id * 4096;
  atomic_fetch_add(&started, 1);
  for (;;) {
    tent_status st;
    int gone = 0;
    switch (id % 4) {
      case 0: {
        tent_request q = write_req(victim_buf, victim_seg, 4096 + id * 64, 64);
        tent_batch *b = NULL;
        st = tent_transfer(victim, &q, 1, NULL, &b);
        note(st, "tent_transfer");
        if (st == TENT_OK) {
          note(tent_batch_wait(b, 2000), "tent_batch_wait");
          tent_status d = tent_batch_destroy(b);
          CHECK(d == TENT_OK || d == TENT_ERR_INVALID_HANDLE);
        }
        break;
      }
      case 1: {
        tent_region *r = NULL;
        st = tent_register(victim, mine, 4096, "cpu", RW, &r);
        note(st, "tent_register");
        if (st == TENT_OK) note(tent_unregister(victim, r), "tent_unregister");
        break;
      }
      case 2: {
        char name[TENT_MAX_NAME_LEN + 1];
        st = tent_engine_name(victim, name, sizeof name, NULL);
        note(st, "tent_engine_name");
        if (st == TENT_OK) {
          tent_segment *s = NULL;
          tent_status o = tent_segment_open(victim, name, &s);
          note(o, "tent_segment_open");
          if (o == TENT_OK) note(tent_segment_close(victim, s), "tent_segment_close");
        }
        break;
      }
      default: {
        char m[16];
        size_t n = 0;
        /* Blocks until a message or the engine closes. */
        st = tent_notify_recv(victim, 60000, m, sizeof m, &n, NULL, 0);
        note(st, "tent_notify_recv");
        if (st == TENT_OK) break;
        gone = st == TENT_ERR_INVALID_HANDLE || st == TENT_ERR_CLOSED;
        break;
      }
    }
    atomic_fetch_add(&iterations, 1);
    if (st == TENT_ERR_INVALID_HANDLE || gone) return NULL;
  }
}

static atomic_int destroy_wins, destroy_losses, go;
static void *destroyer(void *arg) {
  (void)arg;
  while (!atomic_load(&go)) sched_yield();
  tent_status st = tent_engine_destroy(victim);
  if (st == TENT_OK) atomic_fetch_add(&destroy_wins, 1);
  else if (st == TENT_ERR_INVALID_HANDLE && tent_last_error()[0]) atomic_fetch_add(&destroy_losses, 1);
  return NULL;
}

static void test_threads_while_destroying(const char *transports) {
  uint64_t base = process_handles();
  for (int round = 0; round < 5; round++) {
    victim = new_engine(transports);
    victim_buf = aligned_alloc(4096, 1 << 18);
    memset(victim_buf, 1, 1 << 18);
    tent_region *r = NULL;
    CHECK_ST(tent_register(victim, victim_buf, 0x20000, "cpu", RW, &r), TENT_OK);
    victim_seg = open_self(victim);
    atomic_store(&started, 0);
    atomic_store(&iterations, 0);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)i);
    while (atomic_load(&started) < NTHREADS || atomic_load(&iterations) < 50 * (round + 1)) sched_yield();
    CHECK_ST(tent_engine_destroy(victim), TENT_OK);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    free(victim_buf);
  }
  CHECK_EQ_U64(atomic_load(&unknown_status), 0);
  CHECK_EQ_U64(process_handles(), base);

  /* Eight threads destroy one engine: exactly one wins. */
  victim = new_engine("local");
  atomic_store(&destroy_wins, 0);
  atomic_store(&destroy_losses, 0);
  atomic_store(&go, 0);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, destroyer, NULL);
  atomic_store(&go, 1);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  CHECK_EQ_U64(atomic_load(&destroy_wins), 1);
  CHECK_EQ_U64(atomic_load(&destroy_losses), NTHREADS - 1);
  CHECK_EQ_U64(process_handles(), base);
}

/* ---- Many threads on a batch being destroyed ------------------------------ */

static tent_batch *shared_batch;
static atomic_int batch_users_started, batch_bad;

static void *use_batch(void *arg) {
  (void)arg;
  atomic_fetch_add(&batch_users_started, 1);
  for (;;) {
    tent_request_status rs[4];
    size_t done = 0;
    tent_status a = tent_batch_wait(shared_batch, 50);
    tent_status b = tent_batch_status(shared_batch, rs, 4, &done);
    if (!(a == TENT_OK || a == TENT_ERR_INVALID_HANDLE) || !(b == TENT_OK || b == TENT_ERR_INVALID_HANDLE)) {
      atomic_fetch_add(&batch_bad, 1);
      fprintf(stderr, "    batch use during destroy: %s, %s: %s\n", tent_status_str(a), tent_status_str(b),
              tent_last_error());
    }
    if (b == TENT_ERR_INVALID_HANDLE) return NULL;
  }
}

static void test_batch_destroyed_while_used(void) {
  tent_engine *e = new_engine("local");
  unsigned char *buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, 1 << 16, "cpu", RW, &r), TENT_OK);
  tent_segment *s = open_self(e);
  for (int round = 0; round < 20; round++) {
    tent_request q[4];
    for (int i = 0; i < 4; i++) q[i] = write_req(buf, s, 4096 * (i + 1), 4096);
    CHECK_ST(tent_transfer(e, q, 4, NULL, &shared_batch), TENT_OK);
    atomic_store(&batch_users_started, 0);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, use_batch, NULL);
    while (atomic_load(&batch_users_started) < NTHREADS) sched_yield();
    CHECK_ST(tent_batch_destroy(shared_batch), TENT_OK);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  }
  CHECK_EQ_U64(atomic_load(&batch_bad), 0);
  tent_stats st = stats_of(e);
  CHECK_EQ_U64(st.batches, 0);
  CHECK_EQ_U64(st.requests_in_flight, 0);
  CHECK_ST(tent_segment_close(e, s), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

/* ---- No write lands after unregister or destroy returned ----------------- */

static tent_engine *writer;
static tent_segment *writer_seg;
static unsigned char *writer_buf;
static uint64_t target_addr;
static atomic_int writer_stop, writer_attempts[NTHREADS], writer_last, writer_reads, secrets_read;

static void *keep_writing(void *arg) {
  int id = (int)(intptr_t)arg;
  while (!atomic_load(&writer_stop)) {
    tent_request q;
    memset(&q, 0, sizeof q);
    q.opcode = atomic_load(&writer_reads) ? TENT_OP_READ : TENT_OP_WRITE;
    q.local_addr = writer_buf + id * 4096;
    if (q.opcode == TENT_OP_READ) memset(q.local_addr, 0, 4096);
    q.segment = writer_seg;
    q.remote_addr = target_addr + (uint64_t)id * 4096;
    q.length = 4096;
    tent_status st = tent_transfer_sync(writer, &q, 1, NULL, NULL);
    if (!known(st) || st == TENT_PENDING) {
      fprintf(stderr, "    write into a going target: %d\n", st);
      CHECK(0);
    }
    if (st == TENT_OK && q.opcode == TENT_OP_READ && writer_buf[id * 4096] == 0x5A)
      atomic_fetch_add(&secrets_read, 1);
    atomic_store(&writer_last, st);
    atomic_fetch_add(&writer_attempts[id], 1);
  }
  return NULL;
}

/* Waits until every writer tried at least `more` more times. */
static void let_writers_run(int more) {
  for (int i = 0; i < NTHREADS; i++) {
    int until = atomic_load(&writer_attempts[i]) + more;
    while (atomic_load(&writer_attempts[i]) < until) sched_yield();
  }
}

static void test_no_access_after_release(const char *transports, int destroy, int reads) {
  tent_engine *target = new_engine(transports);
  writer = new_engine(transports);
  size_t size = NTHREADS * 4096;
  writer_buf = aligned_alloc(4096, size);
  memset(writer_buf, 0xAB, size);
  unsigned char *tbuf = aligned_alloc(4096, size);
  memset(tbuf, 0, size);
  tent_region *wr = NULL, *tr = NULL;
  CHECK_ST(tent_register(writer, writer_buf, size, "cpu", RW, &wr), TENT_OK);
  CHECK_ST(tent_register(target, tbuf, size, "cpu", RW, &tr), TENT_OK);
  target_addr = (uint64_t)(uintptr_t)tbuf;
  char name[TENT_MAX_NAME_LEN + 1];
  CHECK_ST(tent_engine_name(target, name, sizeof name, NULL), TENT_OK);
  CHECK_ST(tent_segment_open(writer, name, &writer_seg), TENT_OK);
  atomic_store(&writer_stop, 0);
  atomic_store(&writer_reads, 0);
  atomic_store(&secrets_read, 0);
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, keep_writing, (void *)(intptr_t)i);
  let_writers_run(20);
  CHECK(tbuf[0] == 0xAB && tbuf[size - 1] == 0xAB); /* the writes do land before */
  if (reads) {
    atomic_store(&writer_reads, 1); /* from now on the threads read */
    let_writers_run(5);
  }
  if (tbuf[size - 1] != 0xAB)
    fprintf(stderr, "    %s: writes do not land: %s\n", transports, tent_status_str(atomic_load(&writer_last)));
  tent_status st = TENT_ERR_BUSY;
  while (st == TENT_ERR_BUSY) st = destroy ? tent_engine_destroy(target) : tent_unregister(target, tr);
  CHECK_ST(st, TENT_OK);
  /* From here on the memory is the caller's again: it changes only by us,
   * and what it holds now no peer may read. */
  memset(tbuf, reads ? 0x5A : 0x11, size);
  let_writers_run(20);
  atomic_store(&writer_stop, 1);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  size_t changed = 0;
  for (size_t i = 0; i < size; i++) changed += tbuf[i] != (reads ? 0x5A : 0x11);
  if (atomic_load(&secrets_read))
    fprintf(stderr, "    %s: %d reads after release returned its new contents\n", transports, atomic_load(&secrets_read));
  CHECK_EQ_U64(atomic_load(&secrets_read), 0);
  if (changed) fprintf(stderr, "    %s, %s: %zu bytes written after it returned\n", transports,
                       destroy ? "tent_engine_destroy" : "tent_unregister", changed);
  CHECK_EQ_U64(changed, 0);
  CHECK_ST(tent_segment_close(writer, writer_seg), TENT_OK);
  CHECK_ST(tent_unregister(writer, wr), TENT_OK);
  CHECK_ST(tent_engine_destroy(writer), TENT_OK);
  if (!destroy) CHECK_ST(tent_engine_destroy(target), TENT_OK);
  free(writer_buf);
  free(tbuf);
}

/* ---- Log callbacks swapped while lines are delivered ---------------------- */

static atomic_int calls_a, calls_b, stop_logging;
static void count_a(int level, const char *msg, void *user) {
  (void)level, (void)msg;
  CHECK(user == &calls_a);
  atomic_fetch_add(&calls_a, 1);
  /* A tent call from inside: refused at once, never a deadlock. */
  tent_engine *x = NULL;
  tent_status st = tent_engine_create(NULL, &x);
  if (st != TENT_ERR_BUSY) {
    fprintf(stderr, "    tent_engine_create inside a callback: %s\n", tent_status_str(st));
    CHECK(0);
  }
}
/* Every function that enters the library, called from inside a callback:
 * each is refused with BUSY at once (handles need not be valid: the
 * refusal comes first). */
static int every_call_is_busy(void) {
  tent_engine *e = (tent_engine *)(uintptr_t)5;
  tent_region *r = (tent_region *)(uintptr_t)6;
  tent_segment *sg = (tent_segment *)(uintptr_t)7;
  tent_batch *b = (tent_batch *)(uintptr_t)8;
  char buf[64];
  size_t n = 0;
  void *a = NULL;
  tent_region_desc d = {buf, sizeof buf, NULL};
  tent_request q;
  memset(&q, 0, sizeof q);
  tent_request_status rs[1];
  tent_stats st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  tent_status got[] = {
      tent_engine_create(NULL, &e),
      tent_engine_destroy(e),
      tent_engine_name(e, buf, sizeof buf, &n),
      tent_register(e, buf, sizeof buf, NULL, RW, &r),
      tent_register_batch(e, &d, 1, RW, &r),
      tent_unregister(e, r),
      tent_unregister_batch(e, &r, 1),
      tent_region_get_info(e, r, &info),
      tent_engine_transports(e, buf, sizeof buf, &n),
      tent_uninstall(e, NULL),
      tent_engine_stats(e, &st),
      tent_engine_stats_json(e, buf, sizeof buf, &n),
      tent_topology_json(buf, sizeof buf, &n),
      tent_alloc(e, 4096, "cpu", RW, &a, &r),
      tent_free(e, r),
      tent_segment_open(e, "127.0.0.1:1", &sg),
      tent_segment_close(e, sg),
      tent_transfer(e, &q, 1, NULL, &b),
      tent_transfer_poll(e, &q, 1, NULL, &b),
      tent_batch_status(b, rs, 1, &n),
      tent_batch_wait(b, 0),
      tent_batch_destroy(b),
      tent_transfer_sync(e, &q, 1, NULL, rs),
      tent_notify_send(e, sg, "x", 1),
      tent_notify_recv(e, 0, buf, sizeof buf, &n, NULL, 0),
      tent_log_set_level(TENT_LOG_DEBUG),
      tent_log_set_callback(NULL, NULL),
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof got / sizeof got[0]; i++) {
    if (got[i] != TENT_ERR_BUSY) {
      fprintf(stderr, "    call %zu from inside a log callback: %s\n", i, tent_status_str(got[i]));
      bad++;
    }
  }
  return bad;
}

static void count_b(int level, const char *msg, void *user) {
  (void)level, (void)msg;
  CHECK(user == &calls_b);
  atomic_fetch_add(&calls_b, 1);
  CHECK(every_call_is_busy() == 0);
}

static void *logger(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_logging)) {
    tent_engine *x = NULL;
    if (tent_engine_create(NULL, &x) == TENT_OK) tent_engine_destroy(x); /* logs at debug */
  }
  return NULL;
}

static atomic_int calls_c;
static void count_c(int level, const char *msg, void *user) {
  (void)level, (void)msg, (void)user;
  atomic_fetch_add(&calls_c, 1);
}

static void wait_for_more(atomic_int *c) {
  int was = atomic_load(c);
  while (atomic_load(c) == was) sched_yield();
}

static void test_callback_swaps(void) {
  CHECK_ST(tent_log_set_level(TENT_LOG_DEBUG), TENT_OK);
  atomic_store(&stop_logging, 0);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, logger, NULL);
  for (int i = 0; i < 200; i++) {
    CHECK_ST(tent_log_set_callback(count_a, &calls_a), TENT_OK);
    if (i % 50 == 0) wait_for_more(&calls_a);
    CHECK_ST(tent_log_set_callback(count_b, &calls_b), TENT_OK);
    if (i % 50 == 0) wait_for_more(&calls_b);
  }
  /* After the call returns, the previous callback never runs again. */
  CHECK_ST(tent_log_set_callback(count_c, NULL), TENT_OK);
  int a = atomic_load(&calls_a), b = atomic_load(&calls_b);
  wait_for_more(&calls_c);
  wait_for_more(&calls_c);
  CHECK_ST(tent_log_set_level(TENT_LOG_OFF), TENT_OK);
  atomic_store(&stop_logging, 1);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK_EQ_U64(atomic_load(&calls_a), a);
  CHECK_EQ_U64(atomic_load(&calls_b), b);
  CHECK_ST(tent_log_set_callback(NULL, NULL), TENT_OK);
  CHECK_ST(tent_log_set_level(TENT_LOG_WARN), TENT_OK);
}

int main(void) {
  alarm(240); /* a hang is a failure */
  uint64_t base = process_handles();
  test_stale_and_double_release();
  test_every_kind_in_every_slot();
  test_after_engine_destroy();
  test_misaligned();
  test_absurd_values();
  test_arrays_into_unmapped_page();
  test_threads_while_destroying("local");
  test_threads_while_destroying("shm");
  test_threads_while_destroying("tcp");
  test_batch_destroyed_while_used();
  static const char *const kinds[] = {"local", "shm", "tcp"};
  for (int k = 0; k < 3; k++) {
    for (int destroy = 0; destroy < 2; destroy++) {
      test_no_access_after_release(kinds[k], destroy, 0);
      test_no_access_after_release(kinds[k], destroy, 1);
    }
  }
  test_callback_swaps();
  CHECK_EQ_U64(process_handles(), base);
  return check_summary("test_badstate");
}
