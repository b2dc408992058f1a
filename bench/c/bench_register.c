/*
 * bench_register.c — registration through the C ABI.
 *
 * Measures, in one run:
 *   - the floor: a C -> Go call that does almost nothing (tent_engine_name:
 *     one handle lookup and a short copy) and a pure C call (tent_version);
 *   - register + unregister latency with 1, 1k and 100k regions already
 *     live (O(log n) shows as a slow rise, not a linear one);
 *   - concurrent registration throughput with 1 and 2 threads.
 * Prints a table and one JSON line per figure.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tent.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what, tent_status st) {
  fprintf(stderr, "%s: %s (%s)\n", what, tent_status_str(st), tent_last_error());
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(const char *name, const char *unit, double value) {
  printf("%-48s %12.1f %s\n", name, value, unit);
  fprintf(stderr, "{\"bench\":\"%s\",\"value\":%.3f,\"unit\":\"%s\"}\n", name, value, unit);
}

#define SLOT 64 /* bytes per region in the arena */

static double median_register_ns(tent_engine *e, char *arena, size_t live, size_t iters) {
  double *t = malloc(iters * sizeof *t);
  for (size_t i = 0; i < iters; i++) {
    /* A slot past the live ones, cycling, so the tree keeps its size. */
    char *p = arena + (live + (i % 1024)) * SLOT;
    tent_region *r = NULL;
    double t0 = now_ns();
    tent_status st = tent_register(e, p, SLOT, "cpu", TENT_REMOTE_READ, &r);
    if (st != TENT_OK) die("register", st);
    st = tent_unregister(e, r);
    if (st != TENT_OK) die("unregister", st);
    t[i] = now_ns() - t0;
  }
  qsort(t, iters, sizeof *t, cmp_double);
  double m = t[iters / 2];
  free(t);
  return m;
}

struct worker {
  tent_engine *e;
  char *base;
  size_t n;
  double ops;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  for (size_t i = 0; i < w->n; i++) {
    tent_region *r = NULL;
    if (tent_register(w->e, w->base + (i % 4096) * SLOT, SLOT, "cpu", 0, &r) != TENT_OK) die("register", -1);
    if (tent_unregister(w->e, r) != TENT_OK) die("unregister", -1);
  }
  w->ops = (double)w->n;
  return NULL;
}

static double throughput(tent_engine *e, char *arena, int threads, size_t per_thread) {
  pthread_t th[8];
  struct worker w[8];
  double t0 = now_ns();
  for (int i = 0; i < threads; i++) {
    w[i] = (struct worker){e, arena + (size_t)i * 4096 * SLOT, per_thread, 0};
    pthread_create(&th[i], NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double secs = (now_ns() - t0) / 1e9;
  return (double)threads * (double)per_thread / secs;
}

int main(void) {
  const size_t max_live = 100000;
  char *arena = calloc(max_live + 1024 + 8 * 4096, SLOT);
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "local"; /* registration cost of the index, not of a transport */
  tent_engine *e = NULL;
  tent_status st = tent_engine_create(&o, &e);
  if (st != TENT_OK) die("engine_create", st);

  /* Floors. */
  const int N = 200000;
  double t0 = now_ns();
  volatile uint32_t v = 0;
  for (int i = 0; i < N; i++) v += tent_version();
  report("pure C call (tent_version)", "ns/call", (now_ns() - t0) / N);
  char name_buf[128];
  size_t name_len = 0;
  t0 = now_ns();
  for (int i = 0; i < N; i++) (void)tent_engine_name(e, name_buf, sizeof name_buf, &name_len);
  report("C->Go call (tent_engine_name: lookup + copy)", "ns/call", (now_ns() - t0) / N);

  /* Latency at 1, 1k, 100k live regions. */
  size_t levels[] = {1, 1000, 100000};
  tent_region **live = malloc(max_live * sizeof *live);
  size_t have = 0;
  for (size_t l = 0; l < 3; l++) {
    while (have < levels[l]) {
      st = tent_register(e, arena + have * SLOT, SLOT, "cpu", 0, &live[have]);
      if (st != TENT_OK) die("register live", st);
      have++;
    }
    char name[64];
    snprintf(name, sizeof name, "register+unregister, %zu live", levels[l]);
    report(name, "ns (median)", median_register_ns(e, arena + 0, have, 20000));
  }
  for (size_t i = 0; i < have; i++) tent_unregister(e, live[i]);

  /* Throughput on 1 and 2 threads (disjoint arenas: no overlaps). */
  char *tarena = arena + (max_live + 1024) * SLOT;
  report("register+unregister, 1 thread", "ops/s", throughput(e, tarena, 1, 200000));
  report("register+unregister, 2 threads", "ops/s", throughput(e, tarena, 2, 100000));

  tent_engine_destroy(e);
  free(live);
  free(arena);
  return 0;
}
