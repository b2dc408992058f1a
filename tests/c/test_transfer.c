/*
 * test_transfer.c — transfers through the C ABI: two engines in this process
 * (local transport), and a peer in another process (this program re-executed
 * with --peer) over TCP. Bad input for every transfer function, handle
 * misuse, notifications, a killed peer, and leak checks at the end.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (unsigned char)x;
  }
}

static tent_stats stats(tent_engine *e) {
  tent_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  tent_engine_stats(e, &s);
  return s;
}

static tent_request req(uint32_t op, void *local, tent_segment *seg, uint64_t remote, uint64_t len) {
  tent_request r;
  memset(&r, 0, sizeof r);
  r.opcode = op;
  r.local_addr = local;
  r.segment = seg;
  r.remote_addr = remote;
  r.length = len;
  return r;
}

/* ---- The peer process ---------------------------------------------------- */

/* Registers a buffer filled with fill(seed 7), prints "name addr len", and
 * serves until stdin closes. */
static int run_peer(size_t len) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "tcp";
  tent_engine *e = NULL;
  if (tent_engine_create(&o, &e) != TENT_OK) {
    fprintf(stderr, "peer: %s\n", tent_last_error());
    return 2;
  }
  unsigned char *buf = malloc(len);
  fill(buf, len, 7);
  tent_region *r = NULL;
  if (tent_register(e, buf, len, "cpu", RW, &r) != TENT_OK) {
    fprintf(stderr, "peer: %s\n", tent_last_error());
    return 2;
  }
  char name[256];
  tent_engine_name(e, name, sizeof name, NULL);
  printf("%s %llu %zu\n", name, (unsigned long long)(uintptr_t)buf, len);
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin) != NULL) {
    /* "sum": a checksum of the buffer, so the initiator can verify writes. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
      h = (h ^ buf[i]) * 1099511628211ull;
    }
    printf("%llu\n", (unsigned long long)h);
    fflush(stdout);
  }
  tent_unregister(e, r);
  tent_engine_destroy(e);
  free(buf);
  return 0;
}

typedef struct peer {
  pid_t pid;
  FILE *in, *out;
  char name[256];
  uint64_t addr;
  size_t len;
} peer;

static int start_peer(const char *self, size_t len, peer *p) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) {
    return -1;
  }
  fflush(NULL);
  p->pid = fork();
  if (p->pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    char arg[32];
    snprintf(arg, sizeof arg, "%zu", len);
    execl(self, self, "--peer", arg, (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  p->in = fdopen(to[1], "w");
  p->out = fdopen(from[0], "r");
  unsigned long long addr = 0;
  if (fscanf(p->out, "%255s %llu %zu", p->name, &addr, &p->len) != 3) {
    return -1;
  }
  p->addr = addr;
  return 0;
}

static uint64_t peer_sum(peer *p) {
  unsigned long long h = 0;
  fprintf(p->in, "sum\n");
  fflush(p->in);
  if (fscanf(p->out, "%llu", &h) != 1) {
    return 0;
  }
  return h;
}

static uint64_t fnv(const unsigned char *b, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

static void stop_peer(peer *p, int sig) {
  if (sig) {
    kill(p->pid, sig);
  }
  fclose(p->in);
  fclose(p->out);
  int ws;
  waitpid(p->pid, &ws, 0);
}

/* ---- In-process transfers (local transport) ------------------------------- */

static void test_local(void) {
  tent_engine *a = NULL, *b = NULL;
  CHECK_ST(tent_engine_create(NULL, &a), TENT_OK);
  CHECK_ST(tent_engine_create(NULL, &b), TENT_OK);
  tent_stats base = stats(a);

  size_t n = 1 << 20;
  unsigned char *src = malloc(n), *dst = malloc(n);
  fill(src, n, 1);
  memset(dst, 0, n);
  tent_region *rs = NULL, *rd = NULL;
  CHECK_ST(tent_register(a, src, n, NULL, 0, &rs), TENT_OK);
  CHECK_ST(tent_register(b, dst, n, "cpu", RW, &rd), TENT_OK);

  char name[256];
  size_t nlen = 0;
  CHECK_ST(tent_engine_name(b, name, sizeof name, &nlen), TENT_OK);
  tent_segment *seg = NULL;
  CHECK_ST(tent_segment_open(a, name, &seg), TENT_OK);

  /* Async batch of 64 unaligned writes. */
  tent_request reqs[64];
  for (int i = 0; i < 64; i++) {
    reqs[i] = req(TENT_OP_WRITE, src + i * 1000 + 1, seg, (uint64_t)(uintptr_t)(dst + i * 1000 + 3), 999);
  }
  tent_batch *batch = NULL;
  CHECK_ST(tent_transfer(a, reqs, 64, NULL, &batch), TENT_OK);
  CHECK_ST(tent_batch_wait(batch, 10000), TENT_OK);
  tent_request_status st[64];
  size_t done = 0;
  CHECK_ST(tent_batch_status(batch, st, 64, &done), TENT_OK);
  CHECK_EQ_U64(done, 64);
  CHECK_EQ_U64(st[5].transport, TENT_TRANSPORT_LOCAL);
  CHECK_EQ_U64(st[5].bytes, 999);
  CHECK_EQ_U64(st[5].status, TENT_OK);
  CHECK(strcmp(tent_transport_name(st[5].transport), "local") == 0);
  /* No NIC carried it: no TENT_STATUS_NIC, and the space stays zero. */
  CHECK_EQ_U64(st[5].flags & TENT_STATUS_NIC, 0);
  CHECK_EQ_U64(st[5].nic, 0);
  CHECK_EQ_U64(st[5].nics, 0);
  int same = 1;
  for (int i = 0; i < 64; i++) {
    same &= memcmp(src + i * 1000 + 1, dst + i * 1000 + 3, 999) == 0;
  }
  CHECK(same);
  /* Fewer statuses than requests is fine. */
  CHECK_ST(tent_batch_status(batch, st, 2, &done), TENT_OK);
  CHECK_ST(tent_batch_status(batch, NULL, 0, NULL), TENT_OK);
  CHECK_ST(tent_batch_destroy(batch), TENT_OK);
  CHECK_ST(tent_batch_destroy(batch), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_wait(batch, 0), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_batch_status(batch, st, 1, NULL), TENT_ERR_INVALID_HANDLE);

  /* Sync read back of everything, with a notification. */
  memset(src, 0, n);
  tent_request all = req(TENT_OP_READ, src, seg, (uint64_t)(uintptr_t)dst, n);
  tent_transfer_options to = TENT_TRANSFER_OPTIONS_INIT;
  to.notify = "kv block 1";
  to.notify_len = 10;
  to.transport = "local";
  CHECK_ST(tent_transfer_sync(a, &all, 1, &to, st), TENT_OK);
  CHECK(memcmp(src, dst, n) == 0);
  CHECK_EQ_U64(st[0].bytes, n);

  /* The notification: too small a buffer keeps it queued. */
  char msg[64], from[8];
  size_t mlen = 0;
  CHECK_ST(tent_notify_recv(b, 1000, msg, 4, &mlen, NULL, 0), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(mlen, 10);
  CHECK_ST(tent_notify_recv(b, 1000, msg, sizeof msg, &mlen, from, sizeof from), TENT_ERR_BUFFER_TOO_SMALL);
  char from_big[256];
  CHECK_ST(tent_notify_recv(b, 1000, msg, sizeof msg, &mlen, from_big, sizeof from_big), TENT_OK);
  CHECK(mlen == 10 && memcmp(msg, "kv block 1", 10) == 0);
  char aname[256];
  tent_engine_name(a, aname, sizeof aname, NULL);
  CHECK(strcmp(from_big, aname) == 0);
  CHECK_ST(tent_notify_recv(b, 0, msg, sizeof msg, &mlen, NULL, 0), TENT_ERR_TIMEOUT);
  CHECK_ST(tent_notify_send(a, seg, "hi", 2), TENT_OK);
  CHECK_ST(tent_notify_recv(b, 1000, msg, sizeof msg, &mlen, NULL, 0), TENT_OK);
  CHECK_ST(tent_notify_send(a, seg, NULL, 0), TENT_OK);
  CHECK_ST(tent_notify_recv(b, 1000, NULL, 0, &mlen, NULL, 0), TENT_OK);
  CHECK_EQ_U64(mlen, 0);

  /* Remote failures are per request; permission is the target's. */
  tent_region *ro = NULL;
  unsigned char *robuf = malloc(4096);
  CHECK_ST(tent_register(b, robuf, 4096, NULL, TENT_REMOTE_READ, &ro), TENT_OK);
  tent_request mixed[2] = {req(TENT_OP_READ, src, seg, (uint64_t)(uintptr_t)robuf, 8),
                           req(TENT_OP_WRITE, src, seg, (uint64_t)(uintptr_t)robuf, 8)};
  CHECK_ST(tent_transfer_sync(a, mixed, 2, NULL, st), TENT_ERR_PERMISSION_DENIED);
  CHECK_EQ_U64(st[0].status, TENT_OK);
  CHECK_EQ_U64((uint64_t)(int64_t)st[1].status, (uint64_t)(int64_t)TENT_ERR_PERMISSION_DENIED);
  tent_request outside = req(TENT_OP_READ, src, seg, (uint64_t)(uintptr_t)robuf + 4090, 8);
  CHECK_ST(tent_transfer_sync(a, &outside, 1, NULL, NULL), TENT_ERR_OUT_OF_RANGE);
  tent_request nowhere = req(TENT_OP_READ, src, seg, 0x1000, 8);
  CHECK_ST(tent_transfer_sync(a, &nowhere, 1, NULL, NULL), TENT_ERR_NOT_REGISTERED);
  CHECK_ST(tent_unregister(b, ro), TENT_OK);
  CHECK_ST(tent_transfer_sync(a, mixed, 1, NULL, NULL), TENT_ERR_NOT_REGISTERED);
  free(robuf);

  /* tent_transfer_poll: the batch's state without waiting, and the batch
   * itself the caller's whatever its requests' outcome. */
  fill(src, 4096, 9);
  memset(dst, 0, 4096);
  tent_request w = req(TENT_OP_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 4096);
  tent_batch *pb = NULL;
  tent_status ps = tent_transfer_poll(a, &w, 1, NULL, &pb);
  CHECK(ps == TENT_OK || ps == TENT_PENDING);
  CHECK(pb != NULL);
  if (ps == TENT_OK) CHECK(memcmp(src, dst, 4096) == 0); /* done means done, before any wait */
  CHECK_ST(tent_batch_wait(pb, 10000), TENT_OK);
  CHECK(memcmp(src, dst, 4096) == 0);
  CHECK_EQ_U64(stats(a).batches, 1);
  CHECK_ST(tent_batch_destroy(pb), TENT_OK);
  unsigned char *robuf2 = malloc(4096);
  tent_region *ro2 = NULL;
  CHECK_ST(tent_register(b, robuf2, 4096, NULL, TENT_REMOTE_READ, &ro2), TENT_OK);
  tent_request denied = req(TENT_OP_WRITE, src, seg, (uint64_t)(uintptr_t)robuf2, 8);
  pb = NULL;
  ps = tent_transfer_poll(a, &denied, 1, NULL, &pb);
  CHECK(ps == TENT_PENDING || ps == TENT_ERR_PERMISSION_DENIED);
  CHECK(pb != NULL);
  CHECK_ST(tent_batch_wait(pb, 10000), TENT_ERR_PERMISSION_DENIED);
  CHECK_ST(tent_batch_destroy(pb), TENT_OK);
  CHECK_ST(tent_unregister(b, ro2), TENT_OK);
  free(robuf2);
  tent_request zero = req(TENT_OP_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 0);
  pb = (tent_batch *)(uintptr_t)1; /* must be overwritten with NULL */
  CHECK_ST(tent_transfer_poll(a, &zero, 1, NULL, &pb), TENT_ERR_INVALID_ARGUMENT);
  CHECK(pb == NULL);
  pb = (tent_batch *)(uintptr_t)1;
  CHECK_ST(tent_transfer_poll(a, NULL, 1, NULL, &pb), TENT_ERR_INVALID_ARGUMENT);
  CHECK(pb == NULL);
  CHECK_ST(tent_transfer_poll(a, &w, 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer_poll(NULL, &w, 1, NULL, &pb), TENT_ERR_INVALID_HANDLE);
  CHECK_EQ_U64(stats(a).batches, 0);
  CHECK_EQ_U64(stats(a).requests_in_flight, 0);

  /* Bad input fails the call, nothing submitted. */
  tent_request good = req(TENT_OP_WRITE, src, seg, (uint64_t)(uintptr_t)dst, 8);
  tent_request bad;
  CHECK_ST(tent_transfer(a, NULL, 1, NULL, &batch), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer(a, &good, 0, NULL, &batch), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer(a, &good, 1, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer(NULL, &good, 1, NULL, &batch), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_transfer((tent_engine *)seg, &good, 1, NULL, &batch), TENT_ERR_INVALID_HANDLE);
  bad = good;
  bad.opcode = 9;
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_INVALID_ARGUMENT);
  bad = good;
  bad.reserved = 1;
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_INVALID_ARGUMENT);
  bad = good;
  bad.length = 0;
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_INVALID_ARGUMENT);
  bad = good;
  bad.local_addr = dst; /* registered with b, not a */
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_NOT_REGISTERED);
  bad = good;
  bad.local_addr = src + n - 4;
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_OUT_OF_RANGE);
  bad = good;
  bad.segment = NULL;
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_INVALID_HANDLE);
  bad = good;
  bad.segment = (tent_segment *)rs; /* a region handle */
  CHECK_ST(tent_transfer(a, &bad, 1, NULL, &batch), TENT_ERR_INVALID_HANDLE);
  tent_transfer_options o = TENT_TRANSFER_OPTIONS_INIT;
  o.size = 4;
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_transfer_options)TENT_TRANSFER_OPTIONS_INIT;
  o.notify_len = 3;
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_transfer_options)TENT_TRANSFER_OPTIONS_INIT;
  o.notify = "x";
  o.notify_len = 65537;
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_transfer_options)TENT_TRANSFER_OPTIONS_INIT;
  o.transport = "pigeon";
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_INVALID_ARGUMENT);
  /* cuda is installed only where it can serve; elsewhere the stats say why. */
  char js[8192];
  CHECK_ST(tent_engine_stats_json(a, js, sizeof js, NULL), TENT_OK);
  const char *why = strstr(js, "\"unavailable\":{");
  int cuda_listed = strstr(js, "\"cuda\":{") != NULL;
  int cuda_absent = why != NULL && strstr(why, "\"cuda\":\"") != NULL;
  CHECK(why != NULL);
  CHECK(cuda_listed != cuda_absent);
  CHECK_ST(tent_uninstall(a, "shm"), TENT_OK);
  CHECK_ST(tent_uninstall(a, "shm"), TENT_ERR_NOT_FOUND);
  o.transport = "shm"; /* a real name, but no longer installed */
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_NOT_FOUND);
  o = (tent_transfer_options)TENT_TRANSFER_OPTIONS_INIT;
  o.reserved0 = 1;
  CHECK_ST(tent_transfer(a, &good, 1, &o, &batch), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_transfer_sync(a, &bad, 0, NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_batch_wait((tent_batch *)a, 0), TENT_ERR_INVALID_HANDLE);

  /* Segments: bad input and stale handles. */
  tent_segment *s2 = NULL;
  CHECK_ST(tent_segment_open(a, NULL, &s2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_segment_open(a, name, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_segment_open(a, "", &s2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_segment_open(b, name, &s2), TENT_OK); /* an engine opens itself */
  CHECK_ST(tent_segment_close(a, s2), TENT_ERR_INVALID_HANDLE); /* belongs to b */
  CHECK_ST(tent_segment_close(b, s2), TENT_OK);
  CHECK_ST(tent_segment_close(b, s2), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_notify_send(a, s2, "x", 1), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_notify_send(a, seg, NULL, 3), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_notify_send(a, seg, msg, 65537), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_notify_recv(b, 0, NULL, 0, NULL, NULL, 0), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_notify_recv(b, 0, NULL, 5, &mlen, NULL, 0), TENT_ERR_INVALID_ARGUMENT);

  /* Allocations. */
  void *mem = NULL;
  tent_region *ar = NULL;
  CHECK_ST(tent_alloc(b, 10000, NULL, RW, &mem, &ar), TENT_OK);
  CHECK(mem != NULL);
  memset(mem, 0xab, 10000);
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  CHECK_ST(tent_region_get_info(b, ar, &info), TENT_OK);
  CHECK(info.len >= 10000 && info.addr == (uint64_t)(uintptr_t)mem);
  CHECK_ST(tent_transfer_sync(a, &(tent_request){TENT_OP_READ, 0, src, seg, (uint64_t)(uintptr_t)mem, 100}, 1, NULL, NULL),
           TENT_OK);
  CHECK(src[0] == 0xab && src[99] == 0xab);
  CHECK_ST(tent_unregister(b, ar), TENT_ERR_INVALID_ARGUMENT); /* use tent_free */
  CHECK_ST(tent_free(b, rd), TENT_ERR_INVALID_ARGUMENT);        /* not allocated */
  CHECK_ST(tent_free(a, ar), TENT_ERR_INVALID_HANDLE);          /* other engine */
  CHECK_ST(tent_free(b, ar), TENT_OK);
  CHECK_ST(tent_free(b, ar), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_alloc(b, 0, NULL, RW, &mem, &ar), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(b, 64, "tpu", RW, &mem, &ar), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(b, 64, "", RW, &mem, &ar), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(b, 64, NULL, 0x80, &mem, &ar), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(b, 64, NULL, RW, NULL, &ar), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_alloc(b, 64, "cuda:0", RW, &mem, &ar), TENT_ERR_UNSUPPORTED);

  /* Everything released: counts back to the baseline. */
  CHECK_ST(tent_segment_close(a, seg), TENT_OK);
  CHECK_ST(tent_unregister(a, rs), TENT_OK);
  CHECK_ST(tent_unregister(b, rd), TENT_OK);
  tent_stats end = stats(a);
  CHECK_EQ_U64(end.regions, base.regions);
  CHECK_EQ_U64(end.batches, 0);
  CHECK_EQ_U64(end.segments, 0);
  CHECK_EQ_U64(end.requests_in_flight, 0);
  CHECK_EQ_U64(end.handles, base.handles);
  CHECK_EQ_U64(stats(b).allocations, 0);
  CHECK_ST(tent_engine_destroy(a), TENT_OK);
  CHECK_ST(tent_engine_destroy(b), TENT_OK);
  free(src);
  free(dst);
}

/* ---- Another process over TCP --------------------------------------------- */

struct destroyer {
  tent_engine *e;
  tent_status st;
};

static void *destroy_later(void *arg) {
  struct destroyer *d = arg;
  usleep(100 * 1000);
  d->st = tent_engine_destroy(d->e);
  return NULL;
}

static void test_tcp(const char *self) {
  const size_t n = 8 << 20;
  peer p;
  if (start_peer(self, n, &p) != 0) {
    CHECK(!"peer started");
    return;
  }
  tent_engine_options opt = TENT_ENGINE_OPTIONS_INIT;
  opt.transports = "tcp";
  opt.timeout_ms = 5000;
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&opt, &e), TENT_OK);
  unsigned char *buf = malloc(n);
  tent_region *r = NULL;
  CHECK_ST(tent_register(e, buf, n, NULL, 0, &r), TENT_OK);
  tent_segment *seg = NULL;
  CHECK_ST(tent_segment_open(e, p.name, &seg), TENT_OK);

  /* READ all of the peer's pattern, in 128 requests of 64 KiB. */
  tent_request reqs[128];
  for (int i = 0; i < 128; i++) {
    reqs[i] = req(TENT_OP_READ, buf + i * 65536, seg, p.addr + (uint64_t)i * 65536, 65536);
  }
  tent_request_status st[128];
  CHECK_ST(tent_transfer_sync(e, reqs, 128, NULL, st), TENT_OK);
  CHECK_EQ_U64(st[127].transport, TENT_TRANSPORT_TCP);
  unsigned char *want = malloc(n);
  fill(want, n, 7);
  CHECK(memcmp(buf, want, n) == 0);

  /* WRITE new content, check the peer's checksum. */
  fill(buf, n, 99);
  tent_request w = req(TENT_OP_WRITE, buf, seg, p.addr, n);
  CHECK_ST(tent_transfer_sync(e, &w, 1, NULL, st), TENT_OK);
  CHECK_EQ_U64(peer_sum(&p), fnv(buf, n));

  /* The peer dies mid-batch: the requests fail by their deadline. */
  tent_batch *b = NULL;
  tent_request big[16];
  for (int i = 0; i < 16; i++) {
    big[i] = req(TENT_OP_WRITE, buf, seg, p.addr, n);
  }
  double t0 = now_s();
  CHECK_ST(tent_transfer(e, big, 16, NULL, &b), TENT_OK);
  stop_peer(&p, SIGKILL);
  tent_status ws = tent_batch_wait(b, 20000);
  CHECK(ws != TENT_OK && ws != TENT_PENDING && ws != TENT_ERR_INVALID_HANDLE);
  CHECK(now_s() - t0 < 8.0);
  CHECK_ST(tent_batch_destroy(b), TENT_OK);

  /* A stopped (not dead) peer: destroy the engine from another thread while
   * a batch is in flight; the batch handle becomes stale, nothing hangs. */
  peer q;
  if (start_peer(self, n, &q) == 0) {
    tent_segment *s2 = NULL;
    CHECK_ST(tent_segment_open(e, q.name, &s2), TENT_OK);
    kill(q.pid, SIGSTOP);
    for (int i = 0; i < 16; i++) {
      big[i] = req(TENT_OP_WRITE, buf, s2, q.addr, n);
    }
    CHECK_ST(tent_transfer(e, big, 16, NULL, &b), TENT_OK);
    struct destroyer d = {e, -999};
    pthread_t th;
    t0 = now_s();
    pthread_create(&th, NULL, destroy_later, &d);
    pthread_join(th, NULL);
    CHECK_ST(d.st, TENT_OK);
    CHECK(now_s() - t0 < 10.0);
    CHECK_ST(tent_batch_wait(b, 0), TENT_ERR_INVALID_HANDLE);
    CHECK_ST(tent_batch_destroy(b), TENT_ERR_INVALID_HANDLE);
    kill(q.pid, SIGCONT);
    stop_peer(&q, 0);
  } else {
    CHECK(!"second peer started");
    tent_engine_destroy(e);
  }
  free(buf);
  free(want);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--peer") == 0) {
    return run_peer((size_t)strtoull(argv[2], NULL, 10));
  }
  signal(SIGPIPE, SIG_IGN);
  tent_stats dummy;
  (void)dummy;
  test_local();
  test_tcp(argv[0]);
  return check_summary("test_transfer");
}
