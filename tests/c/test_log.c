/*
 * test_log.c — the log level and callback of the C ABI: get/set and bad
 * levels, a callback that sees a transfer's transport choice and teardown at
 * debug, NULL restoring stderr, and tent calls from inside the callback
 * failing with TENT_ERR_BUSY instead of deadlocking.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

/* ---- What the callback saw (it runs on library threads too) ----------- */

static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static char *seen;      /* every line, '\n'-separated */
static size_t seen_len;
static long seen_calls;
static int seen_bad_level; /* a level outside TENT_LOG_DEBUG..TENT_LOG_ERROR */
static int seen_bad_user;
static int marker;

static void collect(int level, const char *msg, void *user) {
  pthread_mutex_lock(&seen_mu);
  size_t n = strlen(msg);
  seen = realloc(seen, seen_len + n + 2);
  memcpy(seen + seen_len, msg, n);
  seen_len += n;
  seen[seen_len++] = '\n';
  seen[seen_len] = '\0';
  seen_calls++;
  seen_bad_level |= level < TENT_LOG_DEBUG || level > TENT_LOG_ERROR;
  seen_bad_user |= user != &marker;
  pthread_mutex_unlock(&seen_mu);
}

/* Does some seen line contain every one of the parts (NULL-terminated)? */
static int seen_line(const char *const *parts) {
  pthread_mutex_lock(&seen_mu);
  int found = 0;
  for (char *line = seen; line && *line && !found;) {
    char *end = strchr(line, '\n');
    *end = '\0';
    found = 1;
    for (const char *const *p = parts; *p; p++) {
      found &= strstr(line, *p) != NULL;
    }
    *end = '\n';
    line = end + 1;
  }
  pthread_mutex_unlock(&seen_mu);
  return found;
}

static long calls(void) {
  pthread_mutex_lock(&seen_mu);
  long n = seen_calls;
  pthread_mutex_unlock(&seen_mu);
  return n;
}

/* ---- A transfer between two tcp engines of this process ---------------- */

static tent_engine *tcp_engine(void) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "tcp";
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  return e;
}

/* Moves 64 KiB from a to b over tcp in nreq requests (at most 64) and
 * destroys both; b's name goes into name. */
static void transfer_and_teardown(char *name, size_t cap, size_t nreq) {
  tent_engine *a = tcp_engine(), *b = tcp_engine();
  size_t n = 64 << 10;
  unsigned char *src = malloc(n), *dst = calloc(1, n);
  memset(src, 0x5a, n);
  tent_region *rs = NULL, *rd = NULL;
  CHECK_ST(tent_register(a, src, n, NULL, 0, &rs), TENT_OK);
  CHECK_ST(tent_register(b, dst, n, NULL, RW, &rd), TENT_OK);
  CHECK_ST(tent_engine_name(b, name, cap, NULL), TENT_OK);
  tent_segment *seg = NULL;
  CHECK_ST(tent_segment_open(a, name, &seg), TENT_OK);
  tent_request r[64];
  tent_request_status st[64];
  memset(r, 0, sizeof r);
  size_t each = n / nreq;
  for (size_t i = 0; i < nreq; i++) {
    r[i].opcode = TENT_OP_WRITE;
    r[i].local_addr = src + i * each;
    r[i].segment = seg;
    r[i].remote_addr = (uint64_t)(uintptr_t)(dst + i * each);
    r[i].length = each;
  }
  CHECK_ST(tent_transfer_sync(a, r, nreq, NULL, st), TENT_OK);
  CHECK_EQ_U64(st[0].transport, TENT_TRANSPORT_TCP);
  CHECK(memcmp(src, dst, n) == 0);
  CHECK_ST(tent_segment_close(a, seg), TENT_OK);
  CHECK_ST(tent_engine_destroy(a), TENT_OK);
  CHECK_ST(tent_engine_destroy(b), TENT_OK);
  free(src);
  free(dst);
}

/* ---- Reentrancy --------------------------------------------------------- */

static tent_engine *probe_engine;
static atomic_int reentered; /* 1 once the probe has run */
static tent_status from_cb_set_level, from_cb_set_callback, from_cb_stats;
static int from_cb_get_level;
static char from_cb_error[512];

/* Calls tent from inside the callback, once. */
static void reenter(int level, const char *msg, void *user) {
  (void)level, (void)msg, (void)user;
  if (atomic_exchange(&reentered, 1)) {
    return;
  }
  from_cb_set_level = tent_log_set_level(TENT_LOG_ERROR);
  snprintf(from_cb_error, sizeof from_cb_error, "%s", tent_last_error());
  from_cb_set_callback = tent_log_set_callback(NULL, NULL);
  tent_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  from_cb_stats = tent_engine_stats(probe_engine, &s);
  from_cb_get_level = tent_log_get_level();
}

/* ---- Tests -------------------------------------------------------------- */

static void test_levels(void) {
  if (getenv("TENT_LOG") == NULL) {
    CHECK_EQ_U64(tent_log_get_level(), TENT_LOG_WARN); /* the default */
  }
  int levels[] = {TENT_LOG_DEBUG, TENT_LOG_INFO, TENT_LOG_WARN, TENT_LOG_ERROR, TENT_LOG_OFF};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
    CHECK_ST(tent_log_set_level(levels[i]), TENT_OK);
    CHECK_EQ_U64(tent_log_get_level(), levels[i]);
  }
  int bad[] = {-1, 5, 100, -2147483647 - 1, 2147483647};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_ST(tent_log_set_level(bad[i]), TENT_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tent_last_error(), "log level") != NULL);
    CHECK_EQ_U64(tent_log_get_level(), TENT_LOG_OFF); /* unchanged */
  }
}

static void test_callback_sees_transfer(void) {
  CHECK_ST(tent_log_set_level(TENT_LOG_DEBUG), TENT_OK);
  CHECK_ST(tent_log_set_callback(collect, &marker), TENT_OK);
  char name[256];
  transfer_and_teardown(name, sizeof name, 1);
  char peer[300];
  snprintf(peer, sizeof peer, "peer=%s", name);
  const char *chosen[] = {"msg=\"transport chosen\"", peer, "transport=tcp", "epoch=", "reason=", NULL};
  CHECK(seen_line(chosen));
  const char *uninstalled[] = {"msg=\"transport uninstalled\"", "transport=tcp", NULL};
  CHECK(seen_line(uninstalled));
  const char *closed[] = {"msg=\"engine closed\"", NULL};
  CHECK(seen_line(closed));
  const char *conn[] = {"connection", "tcp", NULL};
  CHECK(seen_line(conn));
  pthread_mutex_lock(&seen_mu);
  CHECK(!seen_bad_level);
  CHECK(!seen_bad_user);
  pthread_mutex_unlock(&seen_mu);

  /* At info, no line is per request: 64 requests log what 1 does (engine
   * setup and teardown); at warn, a clean transfer logs nothing. */
  CHECK_ST(tent_log_set_level(TENT_LOG_INFO), TENT_OK);
  long before = calls();
  transfer_and_teardown(name, sizeof name, 1);
  long one = calls() - before;
  transfer_and_teardown(name, sizeof name, 64);
  CHECK(one > 0);
  CHECK_EQ_U64(calls() - before - one, one);
  CHECK_ST(tent_log_set_level(TENT_LOG_WARN), TENT_OK);
  before = calls();
  transfer_and_teardown(name, sizeof name, 64);
  CHECK_EQ_U64(calls(), before);
  CHECK_ST(tent_log_set_level(TENT_LOG_DEBUG), TENT_OK);
}

/* After tent_log_set_callback(NULL, ...), lines go to stderr again. */
static void test_null_restores_stderr(void) {
  long before = calls();
  CHECK_ST(tent_log_set_callback(NULL, NULL), TENT_OK);
  fflush(stderr);
  int saved = dup(2);
  FILE *tmp = tmpfile();
  CHECK(saved >= 0 && tmp != NULL);
  dup2(fileno(tmp), 2);
  tent_engine *e = tcp_engine();
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  dup2(saved, 2);
  close(saved);
  CHECK_EQ_U64(calls(), before); /* the callback is not called any more */
  char out[65536];
  rewind(tmp);
  size_t n = fread(out, 1, sizeof out - 1, tmp);
  out[n] = '\0';
  fclose(tmp);
  CHECK(strstr(out, "level=INFO msg=\"engine closed\"") != NULL);
}

static void test_reentrancy_is_busy(void) {
  CHECK_ST(tent_log_set_level(TENT_LOG_WARN), TENT_OK);
  probe_engine = tcp_engine();
  CHECK_ST(tent_log_set_level(TENT_LOG_DEBUG), TENT_OK);
  CHECK_ST(tent_log_set_callback(reenter, NULL), TENT_OK);
  tent_engine *e = tcp_engine(); /* logs "engine created": runs the probe */
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK(atomic_load(&reentered));
  CHECK_EQ_U64((uint64_t)(int64_t)from_cb_set_level, (uint64_t)(int64_t)TENT_ERR_BUSY);
  CHECK(strstr(from_cb_error, "inside a tent_log_fn callback") != NULL);
  CHECK_EQ_U64((uint64_t)(int64_t)from_cb_set_callback, (uint64_t)(int64_t)TENT_ERR_BUSY);
  CHECK_EQ_U64((uint64_t)(int64_t)from_cb_stats, (uint64_t)(int64_t)TENT_ERR_BUSY);
  CHECK_EQ_U64(from_cb_get_level, TENT_LOG_DEBUG);
  CHECK_EQ_U64(tent_log_get_level(), TENT_LOG_DEBUG); /* the refused set changed nothing */
  /* Outside the callback the same calls work. */
  CHECK_ST(tent_log_set_callback(NULL, NULL), TENT_OK);
  CHECK_ST(tent_log_set_level(TENT_LOG_WARN), TENT_OK);
  CHECK_ST(tent_engine_destroy(probe_engine), TENT_OK);
}

int main(void) {
  test_levels();
  test_callback_sees_transfer();
  test_null_restores_stderr();
  test_reentrancy_is_busy();
  free(seen);
  return check_summary("test_log");
}
