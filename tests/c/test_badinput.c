/*
 * test_badinput.c — the bad-input matrix: every function of tent.h, with
 * every pointer argument (and pointer field of an input struct) set in turn
 * to NULL, a near-NULL pointer, a pointer into a PROT_NONE page, a pointer
 * into a read-only page, and a pointer 4 bytes before a PROT_NONE page; and
 * absurd sizes and counts. Each case runs in a fresh process (this program
 * re-executed with --case N: tent cannot be used in a child forked after it
 * was loaded), so a crash is counted, not fatal.
 *
 * A case passes when the call returns a known status code (an error with a
 * message in tent_last_error(), or TENT_OK where the case allows it and
 * then releases what it got; a NULL that is not allowed is
 * TENT_ERR_INVALID_ARGUMENT saying "<arg> is NULL"), the engine's counters (regions, handles,
 * segments, batches, allocations, requests, process handles) are back at
 * their baseline, and the engine still destroys cleanly.
 *
 * Every function of symbols.h's TENT_IMPLEMENTED must have at least one
 * case: a new export without one fails the suite.
 *
 * Usage: test_badinput            run the matrix
 *        test_badinput --list     print the cases
 *        test_badinput --case N   run case N in this process
 */
#define _GNU_SOURCE
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symbols.h"
#include "tent.h"

extern char **environ;

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

/* ---- Bad pointers -------------------------------------------------------- */

enum { K_NULL, K_NEAR, K_NONE, K_RO, K_EDGE, K_VALUE, NKINDS };
static const char *const kind_names[NKINDS] = {"NULL", "(void*)8", "PROT_NONE", "read-only",
                                               "4 bytes before PROT_NONE", "value"};
#define PTRS ((1u << K_NULL) | (1u << K_NEAR) | (1u << K_NONE) | (1u << K_RO) | (1u << K_EDGE))
#define VALUE (1u << K_VALUE)
#define OK_NULL (1u << K_NULL)
#define OK_RO (1u << K_RO)
#define OK_NONE (1u << K_NONE)
#define OK_EDGE (1u << K_EDGE)
#define OK_ALL (PTRS | VALUE)

/* page 0: read-write, filled with 0xA5 (no NUL: strings run into page 1);
 * page 1: PROT_NONE; page 2: read-only zeros. */
static unsigned char *pages;

static void *bad(int kind) {
  switch (kind) {
    case K_NEAR:
      return (void *)8;
    case K_NONE:
      return pages + 4096;
    case K_RO:
      return pages + 8192;
    case K_EDGE:
      return pages + 4096 - 4;
  }
  return NULL;
}

/* ---- The world each case starts from ------------------------------------- */

static tent_engine *e;
static tent_region *region;     /* 64 KiB registered, RW */
static unsigned char *buf;
static tent_segment *self_seg;  /* the engine's own segment */
static tent_batch *batch;       /* one finished write into the region */
static char name[TENT_MAX_NAME_LEN + 1];

static tent_request good_request(void) {
  tent_request r;
  memset(&r, 0, sizeof r);
  r.opcode = TENT_OP_WRITE;
  r.local_addr = buf;
  r.segment = self_seg;
  r.remote_addr = (uint64_t)(uintptr_t)(buf + 4096);
  r.length = 64;
  return r;
}

static int setup(void) {
  pages = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) return -1;
  memset(pages, 0xA5, 4096);
  memset(pages + 8192, 0, 4096);
  if (mprotect(pages + 4096, 4096, PROT_NONE) || mprotect(pages + 8192, 4096, PROT_READ)) return -1;

  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.unregister_timeout_ms = 500;
  o.timeout_ms = 2000;
  if (tent_engine_create(&o, &e) != TENT_OK) return -1;
  buf = aligned_alloc(4096, 1 << 16);
  memset(buf, 1, 1 << 16);
  if (tent_register(e, buf, 1 << 16, "cpu", RW, &region) != TENT_OK) return -1;
  size_t n = 0;
  if (tent_engine_name(e, name, sizeof name, &n) != TENT_OK) return -1;
  if (tent_segment_open(e, name, &self_seg) != TENT_OK) return -1;
  tent_request r = good_request();
  if (tent_transfer(e, &r, 1, NULL, &batch) != TENT_OK) return -1;
  if (tent_batch_wait(batch, 5000) != TENT_OK) return -1;
  return 0;
}

/* ---- The cases ----------------------------------------------------------- */

typedef tent_status (*case_fn)(void *p);

/* Runs a call that is not expected to succeed; if it does, releases what it
 * made so the counters can come back. */
#define KEEP_ENGINE(call)                 \
  tent_engine *out_ = NULL;               \
  tent_status st_ = (call);               \
  if (st_ == TENT_OK) tent_engine_destroy(out_); \
  return st_

static tent_status c_version(void *p) {
  (void)p;
  return tent_version() == TENT_VERSION && tent_abi_version() == TENT_ABI_VERSION ? TENT_OK
                                                                                   : TENT_ERR_INTERNAL;
}
static tent_status c_version_string(void *p) {
  (void)p;
  return tent_version_string() != NULL ? TENT_OK : TENT_ERR_INTERNAL;
}
static tent_status c_status_str(void *p) {
  (void)p;
  return tent_status_str(INT32_MIN) && tent_status_str(INT32_MAX) && tent_status_str(12345)
             ? TENT_OK
             : TENT_ERR_INTERNAL;
}
static tent_status c_last_error(void *p) {
  (void)p;
  return tent_last_error() != NULL ? TENT_OK : TENT_ERR_INTERNAL;
}
static tent_status c_transport_name(void *p) {
  (void)p;
  return tent_transport_name(UINT32_MAX) != NULL ? TENT_OK : TENT_ERR_INTERNAL;
}

/* Engines */
static tent_status c_create_opts(void *p) { KEEP_ENGINE(tent_engine_create(p, &out_)); }
static tent_status c_create_out(void *p) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  return tent_engine_create(&o, p);
}
static tent_engine_options opts_with(void) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "local";
  return o;
}
static tent_status c_create_name(void *p) {
  tent_engine_options o = opts_with();
  o.name = p;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_listen(void *p) {
  tent_engine_options o = opts_with();
  o.listen_addr = p;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_metadata(void *p) {
  tent_engine_options o = opts_with();
  o.metadata = p;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_prefix(void *p) {
  tent_engine_options o = opts_with();
  o.metadata_prefix = p;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_transports(void *p) {
  tent_engine_options o = opts_with();
  o.transports = p;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_secret(void *p) {
  tent_engine_options o = opts_with();
  o.secret = p;
  o.secret_len = 16;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_create_sizes(void *p) {
  (void)p;
  tent_engine_options o = opts_with();
  o.secret = "s";
  o.secret_len = SIZE_MAX;
  KEEP_ENGINE(tent_engine_create(&o, &out_));
}
static tent_status c_destroy(void *p) { return tent_engine_destroy(p); }
static tent_status c_name_buf(void *p) { return tent_engine_name(e, p, 64, NULL); }
static tent_status c_name_len(void *p) {
  char b[TENT_MAX_NAME_LEN + 1];
  return tent_engine_name(e, b, sizeof b, p);
}
static tent_status c_name_cap(void *p) {
  (void)p;
  /* A cap larger than the buffer, which ends at PROT_NONE. */
  return tent_engine_name(e, bad(K_EDGE), SIZE_MAX, NULL);
}

/* Registration: `other` is memory no case leaves registered. */
static char other[8192];
static tent_status c_register_addr(void *p) {
  tent_region *r = NULL;
  tent_status st = tent_register(e, p, 4096, "cpu", RW, &r);
  if (st == TENT_OK) tent_unregister(e, r);
  return st;
}
static tent_status c_register_loc(void *p) {
  tent_region *r = NULL;
  tent_status st = tent_register(e, other, 64, p, RW, &r);
  if (st == TENT_OK) tent_unregister(e, r);
  return st;
}
static tent_status c_register_out(void *p) {
  return tent_register(e, other, 64, NULL, RW, p);
}
static tent_status c_register_len(void *p) {
  (void)p;
  tent_region *r = NULL;
  return tent_register(e, buf, SIZE_MAX, NULL, RW, &r);
}
/* A location naming a device that is not there (no GPU here; on a GPU
 * machine host memory is not GPU memory either way). */
static tent_status register_at(const char *loc) {
  tent_region *r = NULL;
  tent_status st = tent_register(e, other, 64, loc, RW, &r);
  if (st == TENT_OK) tent_unregister(e, r);
  return st;
}
static tent_status c_register_cuda(void *p) { (void)p; return register_at("cuda"); }
static tent_status c_register_cuda0(void *p) { (void)p; return register_at("cuda:0"); }
static tent_status c_register_cuda99(void *p) { (void)p; return register_at("cuda:99"); }
static tent_status c_register_numa(void *p) { (void)p; return register_at("cpu:65535"); }
static tent_status c_rbatch_cuda(void *p) {
  (void)p;
  tent_region_desc d[2] = {{other, 64, "cpu"}, {other + 4096, 64, "cuda:0"}};
  tent_region *r[2];
  tent_status st = tent_register_batch(e, d, 2, RW, r);
  if (st == TENT_OK) tent_unregister_batch(e, r, 2);
  return st;
}
static tent_status c_rbatch_descs(void *p) {
  tent_region *r[1];
  tent_status st = tent_register_batch(e, p, 1, RW, r);
  if (st == TENT_OK) tent_unregister(e, r[0]);
  return st;
}
static tent_status c_rbatch_loc(void *p) {
  tent_region_desc d = {other, 64, p};
  tent_region *r[1];
  tent_status st = tent_register_batch(e, &d, 1, RW, r);
  if (st == TENT_OK) tent_unregister(e, r[0]);
  return st;
}
static tent_status c_rbatch_out(void *p) {
  tent_region_desc d = {other, 64, NULL};
  return tent_register_batch(e, &d, 1, RW, p);
}
static tent_status c_rbatch_n(void *p) {
  (void)p;
  tent_region_desc d = {other, 64, NULL};
  tent_region *r[1];
  return tent_register_batch(e, &d, 1ull << 40, RW, r);
}
static tent_status c_rbatch_n_edge(void *p) {
  (void)p;
  /* n = 2 but the array ends at a PROT_NONE page after one entry. */
  tent_region_desc *d = (tent_region_desc *)(void *)(pages + 4096 - sizeof *d);
  d->addr = other;
  d->len = 64;
  d->location = NULL;
  tent_region *r[2];
  return tent_register_batch(e, d, 2, RW, r);
}
static tent_status c_unregister(void *p) { return tent_unregister(e, p); }
static tent_status c_ubatch_regions(void *p) { return tent_unregister_batch(e, p, 1); }
static tent_status c_ubatch_n(void *p) {
  (void)p;
  return tent_unregister_batch(e, &region, 1ull << 40);
}
static tent_status c_info(void *p) { return tent_region_get_info(e, region, p); }
static tent_status c_info_handle(void *p) {
  tent_region_info i = {sizeof i, 0, 0, 0, {0}};
  return tent_region_get_info(e, p, &i);
}

/* Allocation */
static tent_status c_alloc_loc(void *p) {
  void *a = NULL;
  tent_region *r = NULL;
  tent_status st = tent_alloc(e, 4096, p, RW, &a, &r);
  if (st == TENT_OK) tent_free(e, r);
  return st;
}
static tent_status c_alloc_addr_out(void *p) {
  tent_region *r = NULL;
  return tent_alloc(e, 4096, "cpu", RW, p, &r);
}
static tent_status c_alloc_region_out(void *p) {
  void *a = NULL;
  return tent_alloc(e, 4096, "cpu", RW, &a, p);
}
static tent_status c_alloc_size(void *p) {
  (void)p;
  void *a = NULL;
  tent_region *r = NULL;
  return tent_alloc(e, SIZE_MAX, "cpu", RW, &a, &r);
}
static tent_status c_free(void *p) { return tent_free(e, p); }

/* Transports and statistics */
static tent_status c_uninstall(void *p) { return tent_uninstall(e, p); }
static tent_status c_stats(void *p) { return tent_engine_stats(e, p); }
static tent_status c_stats_json_buf(void *p) { return tent_engine_stats_json(e, p, 65536, NULL); }
static tent_status c_stats_json_len(void *p) {
  static char b[65536];
  return tent_engine_stats_json(e, b, sizeof b, p);
}
static tent_status c_transports_buf(void *p) { return tent_engine_transports(e, p, 64, NULL); }
static tent_status c_transports_len(void *p) {
  char b[64];
  return tent_engine_transports(e, b, sizeof b, p);
}
static tent_status c_transports_cap(void *p) {
  (void)p;
  return tent_engine_transports(e, bad(K_EDGE), SIZE_MAX, NULL);
}
static tent_status c_transports_handle(void *p) {
  char b[64];
  return tent_engine_transports(p, b, sizeof b, NULL);
}
static tent_status c_topology_buf(void *p) { return tent_topology_json(p, 65536, NULL); }
static tent_status c_topology_len(void *p) {
  static char b[65536];
  return tent_topology_json(b, sizeof b, p);
}

/* Logging */
static tent_status c_log_level_neg(void *p) { (void)p; return tent_log_set_level(-1); }
static tent_status c_log_level_big(void *p) { (void)p; return tent_log_set_level(INT_MAX); }
static tent_status c_log_get_level(void *p) {
  (void)p;
  int l = tent_log_get_level();
  return l >= TENT_LOG_DEBUG && l <= TENT_LOG_OFF ? TENT_OK : TENT_ERR_INTERNAL;
}
static void ignore_line(int level, const char *msg, void *user) { (void)level, (void)msg, (void)user; }
/* The library never dereferences user: any value is passed through. A line
 * is logged with it (an engine created and destroyed at debug). */
static tent_status c_log_callback_user(void *p) {
  tent_status st = tent_log_set_callback(ignore_line, p);
  if (st != TENT_OK) return st;
  tent_log_set_level(TENT_LOG_DEBUG);
  tent_engine *tmp = NULL;
  if (tent_engine_create(NULL, &tmp) == TENT_OK) tent_engine_destroy(tmp);
  tent_log_set_level(TENT_LOG_WARN);
  return tent_log_set_callback(NULL, p);
}

/* Segments */
static tent_status c_open_name(void *p) {
  tent_segment *s = NULL;
  tent_status st = tent_segment_open(e, p, &s);
  if (st == TENT_OK) tent_segment_close(e, s);
  return st;
}
static tent_status c_open_out(void *p) { return tent_segment_open(e, name, p); }
static tent_status open_str(const char *n) {
  tent_segment *s = NULL;
  tent_status st = tent_segment_open(e, n, &s);
  if (st == TENT_OK) tent_segment_close(e, s);
  return st;
}
static tent_status c_open_port_big(void *p) { (void)p; return open_str("127.0.0.1:99999"); }
static tent_status c_open_port_neg(void *p) { (void)p; return open_str("127.0.0.1:-1"); }
static tent_status c_open_port_hex(void *p) { (void)p; return open_str("127.0.0.1:12ab"); }
static tent_status c_open_port_zero(void *p) { (void)p; return open_str("127.0.0.1:0"); }
static tent_status c_open_long(void *p) {
  (void)p;
  static char n[TENT_MAX_NAME_LEN + 2];
  memset(n, 'a', TENT_MAX_NAME_LEN + 1);
  return open_str(n);
}
static tent_status c_close(void *p) { return tent_segment_close(e, p); }

/* Transfers */
static tent_status transfer_with(const tent_request *r, size_t n, const tent_transfer_options *o) {
  tent_batch *b = NULL;
  tent_status st = tent_transfer(e, r, n, o, &b);
  if (st == TENT_OK) {
    tent_batch_wait(b, 5000);
    tent_batch_destroy(b);
  }
  return st;
}
static tent_status c_transfer_reqs(void *p) { return transfer_with(p, 1, NULL); }
static tent_status c_transfer_opts(void *p) {
  tent_request r = good_request();
  return transfer_with(&r, 1, p);
}
static tent_status c_transfer_notify(void *p) {
  tent_request r = good_request();
  tent_transfer_options o = TENT_TRANSFER_OPTIONS_INIT;
  o.notify = p;
  o.notify_len = 16;
  return transfer_with(&r, 1, &o);
}
static tent_status c_transfer_transport(void *p) {
  tent_request r = good_request();
  tent_transfer_options o = TENT_TRANSFER_OPTIONS_INIT;
  o.transport = p;
  return transfer_with(&r, 1, &o);
}
static tent_status c_transfer_local(void *p) {
  tent_request r = good_request();
  r.local_addr = p;
  return transfer_with(&r, 1, NULL);
}
static tent_status c_transfer_segment(void *p) {
  tent_request r = good_request();
  r.segment = p;
  return transfer_with(&r, 1, NULL);
}
static tent_status c_transfer_out(void *p) {
  tent_request r = good_request();
  return tent_transfer(e, &r, 1, NULL, p);
}
/* tent_transfer_poll: the batch, when one was made, is waited for and
 * released here; its outcome is the case's. */
static tent_status poll_with(const tent_request *r, size_t n, const tent_transfer_options *o) {
  tent_batch *b = (tent_batch *)(uintptr_t)1; /* not NULL: the call must set it */
  tent_status st = tent_transfer_poll(e, r, n, o, &b);
  if (b == NULL) return st == TENT_OK || st == TENT_PENDING ? TENT_ERR_INTERNAL : st;
  if (st == TENT_PENDING) st = tent_batch_wait(b, 5000);
  tent_batch_destroy(b);
  return st;
}
static tent_status c_poll_reqs(void *p) { return poll_with(p, 1, NULL); }
static tent_status c_poll_opts(void *p) {
  tent_request r = good_request();
  return poll_with(&r, 1, p);
}
static tent_status c_poll_local(void *p) {
  tent_request r = good_request();
  r.local_addr = p;
  return poll_with(&r, 1, NULL);
}
static tent_status c_poll_out(void *p) {
  tent_request r = good_request();
  return tent_transfer_poll(e, &r, 1, NULL, p);
}
static tent_status c_poll_n(void *p) {
  (void)p;
  tent_request r = good_request();
  return poll_with(&r, 1ull << 40, NULL);
}
static tent_status c_transfer_n(void *p) {
  (void)p;
  tent_request r = good_request();
  return transfer_with(&r, 1ull << 40, NULL);
}
static tent_status c_transfer_n_edge(void *p) {
  (void)p;
  tent_request *r = (tent_request *)(void *)(pages + 4096 - sizeof *r);
  *r = good_request();
  return transfer_with(r, 2, NULL);
}
static tent_status c_status_out(void *p) { return tent_batch_status(batch, p, 1, NULL); }
static tent_status c_status_completed(void *p) {
  tent_request_status s[1];
  return tent_batch_status(batch, s, 1, p);
}
static tent_status c_status_n(void *p) {
  (void)p;
  tent_request_status s[1];
  size_t done = 0;
  return tent_batch_status(batch, s, SIZE_MAX, &done);
}
static tent_status c_status_handle(void *p) {
  tent_request_status s[1];
  return tent_batch_status(p, s, 1, NULL);
}
static tent_status c_wait(void *p) { return tent_batch_wait(p, 10); }
static tent_status c_wait_timeout(void *p) {
  (void)p;
  return tent_batch_wait(batch, INT64_MAX);
}
static tent_status c_batch_destroy(void *p) { return tent_batch_destroy(p); }
static tent_status c_sync_reqs(void *p) { return tent_transfer_sync(e, p, 1, NULL, NULL); }
static tent_status c_sync_opts(void *p) {
  tent_request r = good_request();
  return tent_transfer_sync(e, &r, 1, p, NULL);
}
/* A bad statuses_out is found before anything moves. */
static tent_status c_sync_out(void *p) {
  tent_request r = good_request();
  r.local_addr = buf + 8192;
  memset(buf + 8192, 7, 64);
  tent_status st = tent_transfer_sync(e, &r, 1, NULL, p);
  if (st != TENT_OK && buf[4096] == 7) {
    fprintf(stderr, "    the call failed (%s) but moved the data\n", tent_status_str(st));
    return TENT_ERR_INTERNAL;
  }
  return st;
}
static tent_status c_sync_n(void *p) {
  (void)p;
  tent_request r = good_request();
  tent_request_status s[1];
  return tent_transfer_sync(e, &r, 1ull << 40, NULL, s);
}

/* The message of the case's call when the case made more calls after it. */
static char case_msg[512];
static int case_msg_set;

/* tent_transfer_columns(_sync): one good write of 64 bytes from buf to
 * buf + 4096, as three columns; each case replaces one of its arguments.
 * The batch, when one was made, is waited for and released; its outcome
 * is the case's, and a failed call must have set *batch_out to NULL. */
static uint64_t col_local[1], col_remote[1], col_len[1];
static void good_columns(void) {
  col_local[0] = (uint64_t)(uintptr_t)buf;
  col_remote[0] = (uint64_t)(uintptr_t)(buf + 4096);
  col_len[0] = 64;
}
static tent_status columns_with(uint32_t op, tent_segment *s, const uint64_t *l, const uint64_t *r,
                                const uint64_t *n, size_t count, const tent_transfer_options *o) {
  tent_batch *b = (tent_batch *)(uintptr_t)1; /* not NULL: the call must set it */
  tent_status st = tent_transfer_columns(e, op, s, l, r, n, count, o, &b);
  if (b == NULL) return st == TENT_OK || st == TENT_PENDING ? TENT_ERR_INTERNAL : st;
  if (b == (tent_batch *)(uintptr_t)1) {
    fprintf(stderr, "    batch_out was left unset\n");
    return TENT_ERR_INTERNAL;
  }
  if (st == TENT_PENDING) st = tent_batch_wait(b, 5000);
  snprintf(case_msg, sizeof case_msg, "%s", tent_last_error()); /* before destroy clears it */
  case_msg_set = 1;
  tent_batch_destroy(b);
  return st;
}
static tent_status c_cols_local(void *p) {
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, p, col_remote, col_len, 1, NULL);
}
static tent_status c_cols_remote(void *p) {
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, col_local, p, col_len, 1, NULL);
}
static tent_status c_cols_lengths(void *p) {
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, col_local, col_remote, p, 1, NULL);
}
static tent_status c_cols_opts(void *p) {
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1, p);
}
static tent_status c_cols_segment(void *p) {
  good_columns();
  return columns_with(TENT_OP_WRITE, p, col_local, col_remote, col_len, 1, NULL);
}
static tent_status c_cols_out(void *p) {
  good_columns();
  return tent_transfer_columns(e, TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1, NULL, p);
}
static tent_status c_cols_n(void *p) {
  (void)p;
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1ull << 40, NULL);
}
static tent_status c_cols_n_zero(void *p) {
  (void)p;
  good_columns();
  return columns_with(TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 0, NULL);
}
static tent_status c_cols_opcode(void *p) {
  (void)p;
  good_columns();
  return columns_with(7, self_seg, col_local, col_remote, col_len, 1, NULL);
}
static tent_status c_cols_zero_len(void *p) {
  (void)p;
  good_columns();
  col_len[0] = 0;
  return columns_with(TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1, NULL);
}
/* The lengths column's second word lies in the PROT_NONE page. */
static tent_status c_cols_n_edge(void *p) {
  (void)p;
  good_columns();
  uint64_t *l = (uint64_t *)(void *)(pages + 4096 - sizeof(uint64_t));
  *l = 64;
  uint64_t two_local[2] = {col_local[0], col_local[0]}, two_remote[2] = {col_remote[0], col_remote[0]};
  return columns_with(TENT_OP_WRITE, self_seg, two_local, two_remote, l, 2, NULL);
}
static tent_status c_csync_local(void *p) {
  good_columns();
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, p, col_remote, col_len, 1, NULL, NULL);
}
static tent_status c_csync_remote(void *p) {
  good_columns();
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, col_local, p, col_len, 1, NULL, NULL);
}
static tent_status c_csync_lengths(void *p) {
  good_columns();
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, col_local, col_remote, p, 1, NULL, NULL);
}
static tent_status c_csync_opts(void *p) {
  good_columns();
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1, p, NULL);
}
static tent_status c_csync_segment(void *p) {
  good_columns();
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, p, col_local, col_remote, col_len, 1, NULL, NULL);
}
/* A bad statuses_out is found before anything moves. */
static tent_status c_csync_out(void *p) {
  good_columns();
  col_local[0] = (uint64_t)(uintptr_t)(buf + 8192);
  memset(buf + 8192, 7, 64);
  tent_status st = tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1,
                                              NULL, p);
  if (st != TENT_OK && buf[4096] == 7) {
    fprintf(stderr, "    the call failed (%s) but moved the data\n", tent_status_str(st));
    return TENT_ERR_INTERNAL;
  }
  return st;
}
static tent_status c_csync_n(void *p) {
  (void)p;
  good_columns();
  tent_request_status s[1];
  return tent_transfer_columns_sync(e, TENT_OP_WRITE, self_seg, col_local, col_remote, col_len, 1ull << 40,
                                    NULL, s);
}

/* Notifications */
static tent_status c_send_msg(void *p) { return tent_notify_send(e, self_seg, p, 16); }
static tent_status c_send_len(void *p) {
  (void)p;
  return tent_notify_send(e, self_seg, buf, SIZE_MAX);
}
static tent_status c_send_handle(void *p) { return tent_notify_send(e, p, "x", 1); }

/* The receive cases queue a message first; a failed receive must keep it
 * queued (the case then drains it). */
static tent_status recv_with(void *b, size_t cap, size_t *len_out, char *from, size_t from_cap) {
  if (tent_notify_send(e, self_seg, "0123456789abcdef", 16) != TENT_OK) return TENT_ERR_INTERNAL;
  tent_status st = tent_notify_recv(e, 5000, b, cap, len_out, from, from_cap);
  snprintf(case_msg, sizeof case_msg, "%s", tent_last_error());
  case_msg_set = 1;
  if (st != TENT_OK) {
    char m[64], f[TENT_MAX_NAME_LEN + 1];
    size_t n = 0;
    if (tent_notify_recv(e, 5000, m, sizeof m, &n, f, sizeof f) != TENT_OK || n != 16 ||
        memcmp(m, "0123456789abcdef", 16) != 0) {
      fprintf(stderr, "    the message was lost by the failed receive\n");
      return TENT_ERR_INTERNAL;
    }
  }
  return st;
}
static tent_status c_recv_buf(void *p) {
  size_t n;
  return recv_with(p, 64, &n, NULL, 0);
}
static tent_status c_recv_len(void *p) {
  char b[64];
  return recv_with(b, sizeof b, p, NULL, 0);
}
static tent_status c_recv_from(void *p) {
  char b[64];
  size_t n;
  return recv_with(b, sizeof b, &n, p, TENT_MAX_NAME_LEN + 1);
}
static tent_status c_recv_cap(void *p) {
  (void)p;
  size_t n;
  return recv_with(bad(K_EDGE), SIZE_MAX, &n, NULL, 0);
}

/* A function pointer that is not code is refused when it is set, not
 * called (and crashing) on the next line logged. */
static tent_status c_log_callback_fn(void *p) {
  tent_status st = tent_log_set_callback((tent_log_fn)p, NULL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", tent_last_error());
  tent_log_set_level(TENT_LOG_DEBUG);
  tent_engine *tmp = NULL;
  if (tent_engine_create(NULL, &tmp) == TENT_OK) tent_engine_destroy(tmp);
  tent_log_set_level(TENT_LOG_WARN);
  tent_log_set_callback(NULL, NULL);
  snprintf(case_msg, sizeof case_msg, "%s", msg);
  case_msg_set = 1;
  return st;
}

/* ---- The table ----------------------------------------------------------- */

struct entry {
  const char *fn;    /* the tent.h function */
  const char *arg;   /* the argument (or field) varied */
  unsigned kinds;    /* which bad values to try */
  unsigned ok;       /* kinds for which TENT_OK is a correct answer */
  tent_status want;  /* if not 0: the exact status every failing kind must return */
  case_fn run;
};

static const struct entry table[] = {
    {"tent_version", "(none)", VALUE, OK_ALL, 0, c_version},
    {"tent_abi_version", "(none)", VALUE, OK_ALL, 0, c_version},
    {"tent_version_string", "(none)", VALUE, OK_ALL, 0, c_version_string},
    {"tent_status_str", "status out of range", VALUE, OK_ALL, 0, c_status_str},
    {"tent_last_error", "(none)", VALUE, OK_ALL, 0, c_last_error},
    {"tent_transport_name", "transport out of range", VALUE, OK_ALL, 0, c_transport_name},

    {"tent_engine_create", "opts", PTRS, OK_NULL, 0, c_create_opts},
    {"tent_engine_create", "engine_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_create_out},
    {"tent_engine_create", "opts.name", PTRS, OK_NULL, 0, c_create_name},
    {"tent_engine_create", "opts.listen_addr", PTRS, OK_NULL, 0, c_create_listen},
    {"tent_engine_create", "opts.metadata", PTRS, OK_NULL, 0, c_create_metadata},
    {"tent_engine_create", "opts.metadata_prefix", PTRS, OK_NULL, 0, c_create_prefix},
    {"tent_engine_create", "opts.transports", PTRS, OK_NULL, 0, c_create_transports},
    {"tent_engine_create", "opts.secret", PTRS, OK_RO, 0, c_create_secret},
    {"tent_engine_create", "opts.secret_len = SIZE_MAX", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_create_sizes},
    {"tent_engine_destroy", "engine (as a handle)", PTRS & ~(1u << K_NULL), 0, TENT_ERR_INVALID_HANDLE, c_destroy},
    {"tent_engine_name", "buf", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_name_buf},
    {"tent_engine_name", "len_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_name_len},
    {"tent_engine_name", "cap = SIZE_MAX, short buf", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_name_cap},

    /* Registration does not touch the memory: unmapped memory may be
     * registered (a transfer touching it fails); the NULL page may not. */
    {"tent_register", "addr", PTRS, OK_NONE | OK_RO | OK_EDGE, TENT_ERR_INVALID_ARGUMENT, c_register_addr},
    {"tent_register", "location", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_register_loc},
    {"tent_register", "region_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_register_out},
    {"tent_register", "len = SIZE_MAX", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_register_len},
    {"tent_register", "location \"cuda\" on host memory", VALUE, 0, 0, c_register_cuda},
    {"tent_register", "location \"cuda:0\" on host memory", VALUE, 0, 0, c_register_cuda0},
    {"tent_register", "location \"cuda:99\"", VALUE, 0, 0, c_register_cuda99},
    {"tent_register", "location \"cpu:65535\"", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_register_numa},
    {"tent_register_batch", "descs[1].location \"cuda:0\" on host memory", VALUE, 0, 0, c_rbatch_cuda},
    {"tent_register_batch", "descs", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_rbatch_descs},
    {"tent_register_batch", "descs[0].location", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_rbatch_loc},
    {"tent_register_batch", "regions_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_rbatch_out},
    {"tent_register_batch", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_rbatch_n},
    {"tent_register_batch", "n = 2, array ends at PROT_NONE", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_rbatch_n_edge},
    {"tent_unregister", "region (as a handle)", PTRS, OK_NULL, TENT_ERR_INVALID_HANDLE, c_unregister},
    {"tent_unregister_batch", "regions", PTRS, 0, 0, c_ubatch_regions},
    {"tent_unregister_batch", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_ubatch_n},
    {"tent_region_get_info", "info", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_info},
    {"tent_region_get_info", "region (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_info_handle},

    {"tent_alloc", "location", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_alloc_loc},
    {"tent_alloc", "addr_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_alloc_addr_out},
    {"tent_alloc", "region_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_alloc_region_out},
    {"tent_alloc", "size = SIZE_MAX", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_alloc_size},
    {"tent_free", "region (as a handle)", PTRS, OK_NULL, TENT_ERR_INVALID_HANDLE, c_free},

    {"tent_uninstall", "transport_name", PTRS, OK_NULL, 0, c_uninstall},
    {"tent_engine_stats", "out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_stats},
    {"tent_engine_stats_json", "buf", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_stats_json_buf},
    {"tent_engine_stats_json", "len_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_stats_json_len},
    {"tent_engine_transports", "buf", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_transports_buf},
    {"tent_engine_transports", "len_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_transports_len},
    {"tent_engine_transports", "cap = SIZE_MAX, short buf", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_transports_cap},
    {"tent_engine_transports", "engine (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_transports_handle},
    {"tent_topology_json", "buf", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_topology_buf},
    {"tent_topology_json", "len_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_topology_len},

    {"tent_log_set_level", "level = -1", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_log_level_neg},
    {"tent_log_set_level", "level = INT_MAX", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_log_level_big},
    {"tent_log_get_level", "(none)", VALUE, OK_ALL, 0, c_log_get_level},
    {"tent_log_set_callback", "user", PTRS, OK_ALL, 0, c_log_callback_user},
    {"tent_log_set_callback", "fn (not code)", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_log_callback_fn},

    {"tent_segment_open", "name", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_open_name},
    {"tent_segment_open", "segment_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_open_out},
    {"tent_segment_open", "name \"127.0.0.1:99999\"", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_open_port_big},
    {"tent_segment_open", "name \"127.0.0.1:-1\"", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_open_port_neg},
    {"tent_segment_open", "name \"127.0.0.1:12ab\"", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_open_port_hex},
    {"tent_segment_open", "name \"127.0.0.1:0\"", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_open_port_zero},
    {"tent_segment_open", "name of TENT_MAX_NAME_LEN + 1 bytes", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_open_long},
    {"tent_segment_close", "segment (as a handle)", PTRS, OK_NULL, TENT_ERR_INVALID_HANDLE, c_close},

    {"tent_transfer", "requests", PTRS, 0, 0, c_transfer_reqs},
    {"tent_transfer", "opts", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_transfer_opts},
    {"tent_transfer", "opts.notify", PTRS, OK_RO, TENT_ERR_INVALID_ARGUMENT, c_transfer_notify},
    {"tent_transfer", "opts.transport", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_transfer_transport},
    {"tent_transfer", "requests[0].local_addr", PTRS, 0, 0, c_transfer_local},
    {"tent_transfer", "requests[0].segment (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_transfer_segment},
    {"tent_transfer", "batch_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_transfer_out},
    {"tent_transfer", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_transfer_n},
    {"tent_transfer", "n = 2, array ends at PROT_NONE", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_transfer_n_edge},
    {"tent_transfer_poll", "requests", PTRS, 0, 0, c_poll_reqs},
    {"tent_transfer_poll", "opts", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_poll_opts},
    {"tent_transfer_poll", "requests[0].local_addr", PTRS, 0, 0, c_poll_local},
    {"tent_transfer_poll", "batch_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_poll_out},
    {"tent_transfer_poll", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_poll_n},
    {"tent_batch_status", "out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_status_out},
    {"tent_batch_status", "completed_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_status_completed},
    {"tent_batch_status", "n = SIZE_MAX", VALUE, VALUE, 0, c_status_n},
    {"tent_batch_status", "batch (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_status_handle},
    {"tent_batch_wait", "batch (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_wait},
    {"tent_batch_wait", "timeout_ms = INT64_MAX", VALUE, VALUE, 0, c_wait_timeout},
    {"tent_batch_destroy", "batch (as a handle)", PTRS, OK_NULL, TENT_ERR_INVALID_HANDLE, c_batch_destroy},
    {"tent_transfer_sync", "requests", PTRS, 0, 0, c_sync_reqs},
    {"tent_transfer_sync", "opts", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_sync_opts},
    {"tent_transfer_sync", "statuses_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_sync_out},
    {"tent_transfer_sync", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_sync_n},

    {"tent_transfer_columns", "local_addrs", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_local},
    {"tent_transfer_columns", "remote_addrs", PTRS, 0, 0, c_cols_remote},
    {"tent_transfer_columns", "lengths", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_lengths},
    {"tent_transfer_columns", "opts", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_cols_opts},
    {"tent_transfer_columns", "segment (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_cols_segment},
    {"tent_transfer_columns", "batch_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_out},
    {"tent_transfer_columns", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_n},
    {"tent_transfer_columns", "n = 0", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_n_zero},
    {"tent_transfer_columns", "opcode = 7", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_opcode},
    {"tent_transfer_columns", "lengths[0] = 0", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_zero_len},
    {"tent_transfer_columns", "n = 2, lengths ends at PROT_NONE", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_cols_n_edge},
    {"tent_transfer_columns_sync", "local_addrs", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_csync_local},
    {"tent_transfer_columns_sync", "remote_addrs", PTRS, 0, 0, c_csync_remote},
    {"tent_transfer_columns_sync", "lengths", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_csync_lengths},
    {"tent_transfer_columns_sync", "opts", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_csync_opts},
    {"tent_transfer_columns_sync", "segment (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_csync_segment},
    {"tent_transfer_columns_sync", "statuses_out", PTRS, OK_NULL, TENT_ERR_INVALID_ARGUMENT, c_csync_out},
    {"tent_transfer_columns_sync", "n = 2^40", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_csync_n},

    {"tent_notify_send", "msg", PTRS, OK_RO, TENT_ERR_INVALID_ARGUMENT, c_send_msg},
    {"tent_notify_send", "len = SIZE_MAX", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_send_len},
    {"tent_notify_send", "segment (as a handle)", PTRS, 0, TENT_ERR_INVALID_HANDLE, c_send_handle},
    {"tent_notify_recv", "buf", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_recv_buf},
    {"tent_notify_recv", "len_out", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_recv_len},
    {"tent_notify_recv", "from", PTRS, 0, TENT_ERR_INVALID_ARGUMENT, c_recv_from},
    {"tent_notify_recv", "cap = SIZE_MAX, short buf", VALUE, 0, TENT_ERR_INVALID_ARGUMENT, c_recv_cap},
};
#define NENTRIES (sizeof table / sizeof table[0])

/* Case i is entry case_entry(i) with kind case_kind(i). */
static int ncases(void) {
  int n = 0;
  for (size_t i = 0; i < NENTRIES; i++) n += __builtin_popcount(table[i].kinds);
  return n;
}
static int case_at(int c, int *kind) {
  for (size_t i = 0; i < NENTRIES; i++) {
    for (int k = 0; k < NKINDS; k++) {
      if ((table[i].kinds & (1u << k)) && c-- == 0) {
        *kind = k;
        return (int)i;
      }
    }
  }
  return -1;
}

/* ---- One case, in this process ------------------------------------------- */

struct counts {
  uint64_t v[8];
};
static const char *const count_names[8] = {"regions", "reservations", "handles", "segments",
                                           "batches", "requests_in_flight", "allocations",
                                           "process_handles"};

static int counts(struct counts *c) {
  tent_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  if (tent_engine_stats(e, &s) != TENT_OK) return -1;
  uint64_t v[8] = {s.regions, s.reservations, s.handles, s.segments,
                   s.batches, s.requests_in_flight, s.allocations, s.process_handles};
  memcpy(c->v, v, sizeof v);
  return 0;
}

/* The one rule for NULL (tent.h, Conventions): an argument that must not
 * be NULL fails with a message that names it, "<arg> is NULL". Applies to
 * the entries whose arg is a plain parameter name. */
static int plain_arg(const char *arg) {
  for (const char *c = arg; *c; c++) {
    if (!((*c >= 'a' && *c <= 'z') || *c == '_')) return 0;
  }
  return 1;
}
static int names_null(const char *msg, const char *arg) {
  char want[128];
  snprintf(want, sizeof want, "%s is NULL", arg);
  return strstr(msg, want) != NULL;
}

static int known_status(tent_status st) {
  return st == TENT_OK || st == TENT_PENDING || strcmp(tent_status_str(st), "unknown status") != 0;
}

static int run_case(int c) {
  int kind;
  int i = case_at(c, &kind);
  if (i < 0) return 2;
  const struct entry *t = &table[i];
  alarm(60); /* a hang is a failure too (SIGALRM) */
  if (setup() != 0) {
    fprintf(stderr, "    setup failed: %s\n", tent_last_error());
    return 1;
  }
  struct counts before, after;
  if (counts(&before) != 0) return 1;
  tent_status st = t->run(bad(kind));
  char msg[512];
  snprintf(msg, sizeof msg, "%s", case_msg_set ? case_msg : tent_last_error());
  int failed = 0;
  if (!known_status(st)) {
    fprintf(stderr, "    returned %d, not a tent_status\n", st);
    failed = 1;
  } else if (st == TENT_OK && !(t->ok & (1u << kind))) {
    fprintf(stderr, "    returned TENT_OK for a bad argument\n");
    failed = 1;
  } else if (st != TENT_OK && msg[0] == '\0') {
    fprintf(stderr, "    returned %s without a message\n", tent_status_str(st));
    failed = 1;
  } else if (st != TENT_OK && t->want != 0 && st != t->want) {
    fprintf(stderr, "    returned %d (%s), want %d (%s): %s\n", st, tent_status_str(st), t->want,
            tent_status_str(t->want), msg);
    failed = 1;
  } else if (st != TENT_OK && kind == K_NULL && plain_arg(t->arg) &&
             (st != TENT_ERR_INVALID_ARGUMENT || !names_null(msg, t->arg))) {
    fprintf(stderr, "    NULL %s: returned %s \"%s\", want TENT_ERR_INVALID_ARGUMENT \"%s is NULL...\"\n", t->arg,
            tent_status_str(st), msg, t->arg);
    failed = 1;
  }
  if (counts(&after) != 0) {
    fprintf(stderr, "    tent_engine_stats failed after the call: %s\n", tent_last_error());
    return 1;
  }
  for (int k = 0; k < 8; k++) {
    if (before.v[k] != after.v[k]) {
      fprintf(stderr, "    %s: %llu before, %llu after\n", count_names[k],
              (unsigned long long)before.v[k], (unsigned long long)after.v[k]);
      failed = 1;
    }
  }
  tent_batch_destroy(batch);
  tent_segment_close(e, self_seg);
  tent_status dst = tent_engine_destroy(e);
  if (dst != TENT_OK && !(t->run == c_destroy)) {
    fprintf(stderr, "    tent_engine_destroy afterwards: %s: %s\n", tent_status_str(dst), tent_last_error());
    failed = 1;
  }
  if (getenv("TENT_BADINPUT_VERBOSE")) {
    fprintf(stderr, "    -> %s: %s\n", tent_status_str(st), msg);
  }
  return failed;
}

/* ---- The matrix ---------------------------------------------------------- */

static const char *const implemented[] = {
#define TENT_NAME(name) #name,
    TENT_IMPLEMENTED(TENT_NAME)
#undef TENT_NAME
};
#define NIMPLEMENTED (sizeof implemented / sizeof implemented[0])

/* Every implemented function has a case. */
static int check_coverage(void) {
  int missing = 0;
  for (size_t i = 0; i < sizeof implemented / sizeof implemented[0]; i++) {
    int found = 0;
    for (size_t j = 0; j < NENTRIES && !found; j++) found = strcmp(table[j].fn, implemented[i]) == 0;
    if (!found) {
      fprintf(stderr, "FAILED: %s has no case in the bad-input matrix\n", implemented[i]);
      missing++;
    }
  }
  return missing;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--case") == 0) {
    return run_case(atoi(argv[2]));
  }
  int n = ncases();
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (int c = 0; c < n; c++) {
      int kind;
      int i = case_at(c, &kind);
      printf("%d %s %s = %s\n", c, table[i].fn, table[i].arg, kind_names[kind]);
    }
    return 0;
  }
  int missing = check_coverage();
  int passed = 0, failed = 0, crashed = 0;
  for (int c = 0; c < n; c++) {
    int kind;
    int i = case_at(c, &kind);
    char num[16];
    snprintf(num, sizeof num, "%d", c);
    char *args[] = {argv[0], "--case", num, NULL};
    pid_t pid;
    fflush(stderr);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0) {
      perror("posix_spawn");
      return 1;
    }
    int ws = 0;
    if (waitpid(pid, &ws, 0) != pid) {
      perror("waitpid");
      return 1;
    }
    const char *what = NULL;
    char sig[64];
    if (WIFSIGNALED(ws)) {
      snprintf(sig, sizeof sig, "CRASHED (signal %d, %s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
      what = sig;
      crashed++;
    } else if (WEXITSTATUS(ws) != 0) {
      what = "FAILED";
      failed++;
    } else {
      passed++;
    }
    if (what) {
      fprintf(stderr, "%s: case %d: %s(%s = %s)\n", what, c, table[i].fn, table[i].arg, kind_names[kind]);
    }
  }
  printf("test_badinput: %d cases over %zu arguments of %zu functions: %d passed, %d failed, %d crashed",
         n, NENTRIES, NIMPLEMENTED, passed, failed, crashed);
  printf("%s\n", missing ? ", and functions without a case" : "");
  return failed || crashed || missing ? 1 : 0;
}
