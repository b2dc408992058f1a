/*
 * tcp_pingpong.c — the floor for tcp: the same workload as the engines in
 * bench/compare, done with nothing but loopback TCP sockets in C.
 *
 *   tcp_pingpong [--op write,read] [--block-size 4K,64K,1M] [--batch 128]
 *                [--threads 1] [--duration 2] [--span 256M] [--json FILE]
 *
 * Two processes (this one and a forked server), one TCP connection per
 * initiator thread, TCP_NODELAY on both ends. A batch is one 16-byte header
 * (op, block size, count) and then, for WRITE, the count blocks and an
 * 8-byte acknowledgement back; for READ, the count blocks sent back by the
 * server. Blocks move with writev/readv straight from and into their place
 * (up to IOV_MAX blocks a call; the WRITE header rides in the first writev),
 * the fewest system calls sockets allow. Blocks come from and go to memory cycling
 * within --span bytes, as the engines' requests do. Timed per batch (header
 * to the last byte or the acknowledgement) for --duration seconds per
 * point after one untimed batch, so batch 1 at 4 KiB is a ping-pong round
 * trip and batch 128 the socket's streaming rate with one round trip per
 * batch: what no engine over tcp can beat on this machine.
 *
 * Output: the JSON lines of bench/sweep/sweep.py ("meta", one "point" per
 * op x block size, "summary") to --json FILE (default stdout) and a table
 * on stderr. No data check: there is no engine to check; the kernel copies.
 * Exit status 0, 1 on a socket error, 2 for bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_args.h"

enum { OP_WRITE = 1, OP_READ = 2, OP_QUIT = 3, MAX_LIST = 32, MAX_THREADS = 16 };

struct header {
  uint32_t op;
  uint32_t count;
  uint64_t block;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
  fprintf(stderr, "tcp_pingpong: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

static int recv_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n > 0) {
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Moves every byte of iov[0..n) (sending when out), advancing past partial
 * transfers; the iovecs are consumed. */
static int vec_all(int fd, struct iovec *iov, int n, int out) {
  while (n > 0) {
    int k = n < IOV_MAX ? n : IOV_MAX;
    ssize_t got;
    if (out) {
      struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
      got = sendmsg(fd, &m, MSG_NOSIGNAL);
    } else {
      got = readv(fd, iov, k);
    }
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    size_t left = (size_t)got;
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + left;
      iov->iov_len -= left;
    }
  }
  return 0;
}

/* The iovecs of a batch: count blocks cycling within span (at most
 * 1 + count entries: the first may be a header). */
static struct iovec *batch_iov(struct iovec *iov, char *mem, size_t span, uint64_t block, uint32_t count) {
  size_t slots = span / block ? span / block : 1;
  for (uint32_t i = 0; i < count; i++) {
    iov[i].iov_base = mem + (i % slots) * block;
    iov[i].iov_len = block;
  }
  return iov;
}

static void nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
}

static char *map_span(size_t span) {
  char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  memset(p, 0x5a, span);  // every page touched: no first-touch faults in the timed loop
  return p;
}

/* ---- the server: one thread per connection ---------------------------------------- */

struct conn {
  int fd;
  size_t span;
};

static void *serve(void *arg) {
  struct conn *c = arg;
  char *mem = map_span(c->span);
  struct header h;
  uint64_t ack = 0;
  struct iovec *iov = NULL;
  uint32_t cap = 0;
  while (recv_all(c->fd, &h, sizeof h) == 0 && h.op != OP_QUIT && h.block > 0) {
    if (h.count > cap) {
      cap = h.count;
      iov = realloc(iov, cap * sizeof *iov);
      if (!iov) die("realloc");
    }
    batch_iov(iov, mem, c->span, h.block, h.count);
    if (vec_all(c->fd, iov, (int)h.count, h.op == OP_READ) != 0) break;
    if (h.op == OP_WRITE && send_all(c->fd, &ack, sizeof ack) != 0) break;
  }
  free(iov);
  munmap(mem, c->span);
  close(c->fd);
  return NULL;
}

static void server_main(int lfd, int conns, size_t span) {
  pthread_t th[MAX_THREADS];
  struct conn cs[MAX_THREADS];
  for (int i = 0; i < conns; i++) {
    cs[i].fd = accept(lfd, NULL, NULL);
    if (cs[i].fd < 0) die("accept");
    nodelay(cs[i].fd);
    cs[i].span = span;
    pthread_create(&th[i], NULL, serve, &cs[i]);
  }
  for (int i = 0; i < conns; i++) pthread_join(th[i], NULL);
  _exit(0);
}

/* ---- the initiator ------------------------------------------------------------------ */

struct worker {
  int fd;
  char *mem;
  size_t span;
  uint32_t op, batch;
  uint64_t block;
  double end;
  double *lat;
  size_t nlat, cap;
  struct iovec *iov;  // 1 + batch entries
  int failed;
};

static int one_batch(struct worker *w) {
  struct header h = {w->op, w->batch, w->block};
  uint64_t ack;
  batch_iov(w->iov + 1, w->mem, w->span, w->block, w->batch);
  if (w->op == OP_WRITE) {
    w->iov[0].iov_base = &h;
    w->iov[0].iov_len = sizeof h;
    if (vec_all(w->fd, w->iov, (int)w->batch + 1, 1) != 0) return -1;
    return recv_all(w->fd, &ack, sizeof ack);
  }
  if (send_all(w->fd, &h, sizeof h) != 0) return -1;
  return vec_all(w->fd, w->iov + 1, (int)w->batch, 0);
}

static void *run_worker(void *arg) {
  struct worker *w = arg;
  if (one_batch(w) != 0) {  // warm-up
    w->failed = 1;
    return NULL;
  }
  for (;;) {
    double t1 = now_s();
    if (one_batch(w) != 0) {
      w->failed = 1;
      return NULL;
    }
    double t2 = now_s();
    if (w->nlat == w->cap) {
      w->cap = w->cap ? w->cap * 2 : 4096;
      w->lat = realloc(w->lat, w->cap * sizeof *w->lat);
      if (!w->lat) die("realloc");
    }
    w->lat[w->nlat++] = t2 - t1;
    if (t2 >= w->end) return NULL;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double rank(const double *s, size_t n, double q) {
  size_t i = (size_t)ceil(q * (double)n);
  i = i == 0 ? 0 : i - 1;
  return s[i < n ? i : n - 1] * 1e6;
}

static int parse_size(const char *s, uint64_t *out) { return bench_parse_size(s, out, 1ull << 40); }

static int parse_list(char *text, uint64_t *out, int max, int sizes) {
  int n = 0;
  for (char *save = NULL, *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) return -1;
    if (sizes) {
      if (parse_size(tok, &out[n]) != 0) return -1;
    } else if (strcmp(tok, "write") == 0 || strcmp(tok, "WRITE") == 0) {
      out[n] = OP_WRITE;
    } else if (strcmp(tok, "read") == 0 || strcmp(tok, "READ") == 0) {
      out[n] = OP_READ;
    } else {
      return -1;
    }
    n++;
  }
  return n;
}

static const char *usage =
    "usage: tcp_pingpong [--op write,read] [--block-size 4K,64K] [--batch 128] [--threads 1]\n"
    "                    [--duration 2] [--span 256M] [--json FILE]\n";

int main(int argc, char **argv) {
  uint64_t ops[MAX_LIST] = {OP_WRITE}, blocks[MAX_LIST] = {64 << 10}, span = 256 << 20;
  int nops = 1, nblocks = 1, threads = 1;
  long batch = 128;
  double duration = 2.0;
  const char *json = "-";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = v != NULL;
    if (ok && strcmp(a, "--op") == 0) ok = (nops = parse_list(v, ops, MAX_LIST, 0)) > 0;
    else if (ok && strcmp(a, "--block-size") == 0) ok = (nblocks = parse_list(v, blocks, MAX_LIST, 1)) > 0;
    else if (ok && strcmp(a, "--batch") == 0) ok = (batch = strtol(v, NULL, 10)) > 0 && batch < (1 << 20);
    else if (ok && strcmp(a, "--threads") == 0) ok = (threads = atoi(v)) > 0 && threads <= MAX_THREADS;
    else if (ok && strcmp(a, "--duration") == 0) ok = (duration = strtod(v, NULL)) > 0 && isfinite(duration);
    else if (ok && strcmp(a, "--span") == 0) ok = parse_size(v, &span) == 0;
    else if (ok && strcmp(a, "--json") == 0) json = v;
    else ok = 0;
    if (!ok) {
      fprintf(stderr, "tcp_pingpong: bad argument %s%s%s\n%s", a, v ? " " : "", v ? v : "", usage);
      return 2;
    }
    i++;
  }
  uint64_t biggest = 0;
  for (int i = 0; i < nblocks; i++) {
    uint64_t s = blocks[i] * (uint64_t)batch;
    if (s > span) s = span;
    if (s < blocks[i]) s = blocks[i];
    if (s > biggest) biggest = s;
  }
  FILE *out = strcmp(json, "-") == 0 ? stdout : fopen(json, "w");
  if (!out) die(json);

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof addr;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, MAX_THREADS) != 0 ||
      getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0)
    die("listen on 127.0.0.1");
  fflush(NULL);
  pid_t server = fork();
  if (server < 0) die("fork");
  if (server == 0) server_main(lfd, threads, (size_t)biggest);
  close(lfd);

  struct worker w[MAX_THREADS];
  memset(w, 0, sizeof w);
  for (int t = 0; t < threads; t++) {
    w[t].fd = socket(AF_INET, SOCK_STREAM, 0);
    if (w[t].fd < 0 || connect(w[t].fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("connect");
    nodelay(w[t].fd);
    w[t].span = (size_t)biggest;
    w[t].mem = map_span(w[t].span);
  }
  fprintf(out, "{\"type\": \"meta\", \"tool\": \"tcp_pingpong\", \"impl\": \"c\", \"threads\": %d}\n", threads);
  fprintf(stderr, "%-5s %8s %5s %3s %9s %10s %10s %10s\n", "op", "block", "batch", "thr", "GB/s", "p50 us",
          "p99 us", "batches");
  int failures = 0;
  for (int o = 0; o < nops; o++) {
    for (int b = 0; b < nblocks; b++) {
      pthread_t th[MAX_THREADS];
      double t0 = now_s();
      for (int t = 0; t < threads; t++) {
        w[t].op = (uint32_t)ops[o];
        w[t].batch = (uint32_t)batch;
        w[t].block = blocks[b];
        w[t].span = (size_t)(blocks[b] * (uint64_t)batch < biggest ? blocks[b] * (uint64_t)batch : biggest);
        if (w[t].span < blocks[b]) w[t].span = (size_t)blocks[b];
        w[t].end = t0 + duration;
        w[t].nlat = 0;
        w[t].iov = realloc(w[t].iov, ((size_t)batch + 1) * sizeof *w[t].iov);
        if (!w[t].iov) die("realloc");
        pthread_create(&th[t], NULL, run_worker, &w[t]);
      }
      size_t n = 0;
      for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        n += w[t].nlat;
        failures += w[t].failed;
      }
      double secs = now_s() - t0;
      if (failures) {
        fprintf(stderr, "tcp_pingpong: a connection failed\n");
        return 1;
      }
      double *all = malloc(n * sizeof *all), sum = 0;
      if (!all) die("malloc");
      size_t k = 0;
      for (int t = 0; t < threads; t++)
        for (size_t i = 0; i < w[t].nlat; i++) sum += (all[k++] = w[t].lat[i]);
      qsort(all, n, sizeof *all, cmp_double);
      double bytes = (double)n * (double)batch * (double)blocks[b];
      const char *opn = ops[o] == OP_WRITE ? "WRITE" : "READ";
      fprintf(out,
              "{\"type\": \"point\", \"transport\": \"tcp\", \"mem\": \"register\", \"op\": \"%s\", "
              "\"block_size\": %llu, \"batch\": %ld, \"threads\": %d, \"batches\": %zu, \"requests\": %zu, "
              "\"bytes\": %.0f, \"seconds\": %.6f, \"gbps\": %.6f, \"requests_per_s\": %.1f, "
              "\"batch_us\": {\"avg\": %.3f, \"p50\": %.3f, \"p99\": %.3f, \"p999\": %.3f, \"max\": %.3f}}\n",
              opn, (unsigned long long)blocks[b], batch, threads, n, n * (size_t)batch, bytes, secs,
              bytes / secs / 1e9, (double)n * (double)batch / secs, sum / (double)n * 1e6, rank(all, n, 0.5),
              rank(all, n, 0.99), rank(all, n, 0.999), all[n - 1] * 1e6);
      fflush(out);
      fprintf(stderr, "%-5s %8llu %5ld %3d %9.3f %10.1f %10.1f %10zu\n", opn, (unsigned long long)blocks[b], batch,
              threads, bytes / secs / 1e9, rank(all, n, 0.5), rank(all, n, 0.99), n);
      free(all);
    }
  }
  for (int t = 0; t < threads; t++) {
    struct header q = {OP_QUIT, 0, 0};
    send_all(w[t].fd, &q, sizeof q);
    close(w[t].fd);
    munmap(w[t].mem, (size_t)biggest);
    free(w[t].lat);
    free(w[t].iov);
  }
  int st = 0;
  waitpid(server, &st, 0);
  fprintf(out, "{\"type\": \"summary\", \"failures\": 0, \"target_crashes\": %d}\n",
          WIFSIGNALED(st) ? 1 : 0);
  if (out != stdout) fclose(out);
  return 0;
}
