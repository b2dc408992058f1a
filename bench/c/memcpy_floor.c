/*
 * memcpy_floor.c — the floor for shm-class engines: the same copies as the
 * engines in bench/compare make, done with nothing but memcpy in C.
 *
 *   memcpy_floor [--block-size 4K,16K,1M] [--batch 128] [--threads 1,2]
 *                [--span 256M] [--seconds 0.3] [--json FILE]
 *
 * Each thread copies batches of --batch blocks between two buffers laid
 * out as bench/sweep/sweep.py lays out an engine's requests: a thread's
 * blocks are consecutive, wrapping within min(--span, block x batch x
 * threads) bytes, the same offsets on both sides, so at 4-16 KiB x 128 the
 * copies stay within the CPU caches exactly as the engines' do. A point
 * runs three rounds of --seconds / 3, all threads started together, and
 * reports the best round's aggregate rate: what the machine can copy when
 * nothing else runs, with no per-call cost but memcpy's own (a Python
 * ctypes.memmove costs 0.1-0.3 us a call, as much as a 4 KiB copy).
 *
 * Output: one JSON line per block size x thread count to --json FILE
 * (default stdout), {"type": "limit", "kind": "memcpy", ...}, and a table on
 * stderr. Exit status 0, 2 for bad usage.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_args.h"

enum { MAX_LIST = 32, MAX_THREADS = 16, ROUNDS = 3 };

struct copier {
  pthread_t th;
  pthread_barrier_t *start;
  char *src, *dst;
  size_t slots, block, batch, first;  // first: this thread's first slot
  double seconds;
  double bytes;  // copied in the round, by this thread
  double took;   // seconds the round took this thread
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static char *map_touched(size_t n, int fill) {
  char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  memset(p, fill, n);  // every page touched: no first-touch faults in the timed loop
  return p;
}

/* One round: whole batches until --seconds / ROUNDS have passed (at least one). */
static void *copy_round(void *arg) {
  struct copier *c = arg;
  pthread_barrier_wait(c->start);
  double t0 = now_s(), end = t0 + c->seconds / ROUNDS, bytes = 0;
  size_t slot = c->first;
  do {
    for (size_t i = 0; i < c->batch; i++) {
      size_t off = ((slot + i) % c->slots) * c->block;
      memcpy(c->dst + off, c->src + off, c->block);
    }
    bytes += (double)c->batch * (double)c->block;
  } while (now_s() < end);
  c->took = now_s() - t0;
  c->bytes = bytes;
  return NULL;
}

static int parse_size(const char *s, uint64_t *out) { return bench_parse_size(s, out, 1ull << 36); }

static int parse_list(char *text, uint64_t *out, int max, int sizes) {
  int n = 0;
  for (char *save = NULL, *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) return -1;
    if (sizes) {
      if (parse_size(tok, &out[n]) != 0) return -1;
    } else {
      char *end;
      long v = strtol(tok, &end, 10);
      if (end == tok || *end != '\0' || v < 1 || v > MAX_THREADS) return -1;
      out[n] = (uint64_t)v;
    }
    n++;
  }
  return n;
}

/* The best round's aggregate GB/s of threads copying block x batch each. */
static double measure(uint64_t block, uint64_t batch, int threads, uint64_t span, double seconds, size_t *used) {
  uint64_t want = block * batch * (uint64_t)threads;
  size_t n = (size_t)(want < span ? want : span);
  if (n < block) n = (size_t)block;
  *used = n;
  char *src = map_touched(n, 1), *dst = map_touched(n, 2);
  struct copier c[MAX_THREADS];
  pthread_barrier_t start;
  double best = 0;
  for (int r = 0; r < ROUNDS; r++) {
    if (pthread_barrier_init(&start, NULL, (unsigned)threads) != 0) die("pthread_barrier_init");
    for (int t = 0; t < threads; t++) {
      c[t] = (struct copier){.start = &start, .src = src, .dst = dst, .slots = n / block, .block = block,
                             .batch = batch, .first = (size_t)t * batch, .seconds = seconds};
      if (t > 0 && pthread_create(&c[t].th, NULL, copy_round, &c[t]) != 0) die("pthread_create");
    }
    copy_round(&c[0]);
    double bytes = c[0].bytes, took = c[0].took;
    for (int t = 1; t < threads; t++) {
      pthread_join(c[t].th, NULL);
      bytes += c[t].bytes;
      if (c[t].took > took) took = c[t].took;
    }
    pthread_barrier_destroy(&start);
    double g = bytes / took / 1e9;
    if (g > best) best = g;
  }
  munmap(src, n);
  munmap(dst, n);
  return best;
}

static const char *usage =
    "usage: memcpy_floor [--block-size 4K,16K] [--batch 128] [--threads 1,2] [--span 256M]\n"
    "                    [--seconds 0.3] [--json FILE]\n";

int main(int argc, char **argv) {
  uint64_t blocks[MAX_LIST] = {4 << 10}, threads[MAX_LIST] = {1}, span = 256 << 20;
  int nblocks = 1, nthreads = 1;
  long batch = 128;
  double seconds = 0.3;
  const char *json = "-";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = v != NULL;
    if (ok && strcmp(a, "--block-size") == 0) ok = (nblocks = parse_list(v, blocks, MAX_LIST, 1)) > 0;
    else if (ok && strcmp(a, "--threads") == 0) ok = (nthreads = parse_list(v, threads, MAX_LIST, 0)) > 0;
    else if (ok && strcmp(a, "--batch") == 0) ok = (batch = strtol(v, NULL, 10)) > 0 && batch < (1 << 20);
    else if (ok && strcmp(a, "--span") == 0) ok = parse_size(v, &span) == 0;
    else if (ok && strcmp(a, "--seconds") == 0) ok = (seconds = strtod(v, NULL)) > 0 && isfinite(seconds) && seconds < 3600;
    else if (ok && strcmp(a, "--json") == 0) json = v;
    else ok = 0;
    if (!ok) {
      fprintf(stderr, "memcpy_floor: bad argument %s%s%s\n%s", a, v ? " " : "", v ? v : "", usage);
      return 2;
    }
    i++;
  }
  FILE *out = strcmp(json, "-") == 0 ? stdout : fopen(json, "w");
  if (!out) die(json);
  fprintf(stderr, "%8s %5s %3s %10s %9s\n", "block", "batch", "thr", "span", "GB/s");
  for (int b = 0; b < nblocks; b++) {
    for (int t = 0; t < nthreads; t++) {
      size_t used;
      double g = measure(blocks[b], (uint64_t)batch, (int)threads[t], span, seconds, &used);
      fprintf(out,
              "{\"type\": \"limit\", \"kind\": \"memcpy\", \"impl\": \"c\", \"block_size\": %llu, \"batch\": %ld, "
              "\"threads\": %d, \"span\": %zu, \"gbps\": %.6f}\n",
              (unsigned long long)blocks[b], batch, (int)threads[t], used, g);
      fflush(out);
      fprintf(stderr, "%8llu %5ld %3d %10zu %9.3f\n", (unsigned long long)blocks[b], batch, (int)threads[t], used, g);
    }
  }
  if (out != stdout) fclose(out);
  return 0;
}
