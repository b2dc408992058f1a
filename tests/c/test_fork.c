/*
 * test_fork.c — in a child forked after libtent was loaded, every function
 * that would enter the Go runtime returns TENT_ERR_FORKED at once (the
 * runtime does not survive fork: entering it would hang), with a message
 * that mentions fork; the parent keeps working.
 *
 * Scenarios: fork right after load without any call (argv[1] = "early",
 * run by re-executing this program); fork with an engine and regions in
 * the parent; fork while other threads are inside the library.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tent.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* In the child: one call must return FORKED, mention fork, and be quick. */
static int child_failures;

static void child_expect(const char *what, tent_status st) {
  const char *msg = tent_last_error();
  if (st != TENT_ERR_FORKED || strstr(msg, "fork") == NULL) {
    child_failures++;
    fprintf(stderr, "child: %s returned %d (%s), message \"%s\"\n", what, st, tent_status_str(st),
            msg);
  }
}

/* Calls every exported function that enters Go; e and r may be stale. */
static void child_calls(tent_engine *e, tent_region *r, void *buf) {
  double t0 = now_s();
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  tent_engine *e2 = NULL;
  tent_region *r2 = NULL, *rs[1] = {NULL};
  tent_region_desc d = {buf, 64, NULL};
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  tent_stats s = {sizeof s, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  char out[256];
  size_t n;
  child_expect("tent_engine_create", tent_engine_create(&o, &e2));
  child_expect("tent_engine_create(NULL)", tent_engine_create(NULL, &e2));
  child_expect("tent_engine_name", tent_engine_name(e, out, sizeof out, &n));
  child_expect("tent_register", tent_register(e, (char *)buf + 128, 64, NULL, RW, &r2));
  child_expect("tent_register_batch", tent_register_batch(e, &d, 1, RW, rs));
  child_expect("tent_region_get_info", tent_region_get_info(e, r, &info));
  child_expect("tent_engine_transports", tent_engine_transports(e, out, sizeof out, &n));
  child_expect("tent_uninstall", tent_uninstall(e, NULL));
  child_expect("tent_engine_stats", tent_engine_stats(e, &s));
  child_expect("tent_engine_stats_json", tent_engine_stats_json(e, out, sizeof out, &n));
  child_expect("tent_topology_json", tent_topology_json(out, sizeof out, &n));
  {
    void *addr = NULL;
    tent_region *ar = NULL;
    tent_segment *seg = NULL;
    tent_batch *b = NULL;
    tent_request req = {TENT_OP_WRITE, 0, buf, NULL, 0, 1};
    tent_request_status rs_out[1];
    size_t len = 0;
    child_expect("tent_alloc", tent_alloc(e, 4096, "cpu", RW, &addr, &ar));
    child_expect("tent_free", tent_free(e, ar));
    child_expect("tent_free(NULL)", tent_free(e, NULL));
    child_expect("tent_segment_open", tent_segment_open(e, "127.0.0.1:1", &seg));
    child_expect("tent_segment_close", tent_segment_close(e, seg));
    child_expect("tent_segment_close(NULL)", tent_segment_close(e, NULL));
    child_expect("tent_transfer", tent_transfer(e, &req, 1, NULL, &b));
    child_expect("tent_transfer_sync", tent_transfer_sync(e, &req, 1, NULL, rs_out));
    child_expect("tent_batch_status", tent_batch_status(b, rs_out, 1, &len));
    child_expect("tent_batch_wait", tent_batch_wait(b, 0));
    child_expect("tent_batch_destroy", tent_batch_destroy(b));
    child_expect("tent_batch_destroy(NULL)", tent_batch_destroy(NULL));
    child_expect("tent_notify_send", tent_notify_send(e, seg, "x", 1));
    child_expect("tent_notify_recv", tent_notify_recv(e, 0, out, sizeof out, &len, NULL, 0));
  }
  child_expect("tent_unregister_batch", tent_unregister_batch(e, &r, 1));
  child_expect("tent_unregister", tent_unregister(e, r));
  child_expect("tent_unregister(NULL)", tent_unregister(e, NULL));
  child_expect("tent_engine_destroy", tent_engine_destroy(e));
  child_expect("tent_engine_destroy(NULL)", tent_engine_destroy(NULL));
  /* Plain C functions still work. */
  if (tent_version() != TENT_VERSION || strcmp(tent_status_str(TENT_ERR_FORKED), "unknown status") == 0) {
    child_failures++;
  }
  if (now_s() - t0 > 1.0) {
    child_failures++;
    fprintf(stderr, "child: the calls took %.2f s\n", now_s() - t0);
  }
}

/* Forks; the child runs child_calls and exits with its failure count. The
 * parent waits at most 10 s (a hang fails the test instead of hanging it). */
static void fork_and_check(const char *scenario, tent_engine *e, tent_region *r, void *buf) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    CHECK(pid >= 0);
    return;
  }
  if (pid == 0) {
    alarm(5); /* the child's own backstop */
    child_calls(e, r, buf);
    _exit(child_failures > 100 ? 100 : child_failures);
  }
  int wstatus = 0;
  double deadline = now_s() + 10;
  pid_t w;
  while ((w = waitpid(pid, &wstatus, WNOHANG)) == 0 && now_s() < deadline) {
    usleep(5000);
  }
  if (w == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    fprintf(stderr, "%s: the child hung\n", scenario);
    CHECK(!"child hung");
    return;
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    fprintf(stderr, "%s: child %s %d\n", scenario, WIFEXITED(wstatus) ? "exited with" : "killed by",
            WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : WTERMSIG(wstatus));
  }
  CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
}

/* The parent still works after its children. */
static void parent_works(void) {
  char *buf = malloc(4096);
  tent_engine *e = NULL;
  tent_region *r = NULL;
  CHECK_ST(tent_engine_create(NULL, &e), TENT_OK);
  CHECK_ST(tent_register(e, buf, 4096, NULL, RW, &r), TENT_OK);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

static atomic_int busy_stop;
static tent_engine *busy_engine;

static void *busy_thread(void *arg) {
  char *buf = malloc(4096);
  (void)arg;
  while (!atomic_load(&busy_stop)) {
    tent_region *r = NULL;
    if (tent_register(busy_engine, buf, 4096, NULL, RW, &r) == TENT_OK) {
      tent_unregister(busy_engine, r);
    }
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  char buf[4096];
  if (argc > 1 && strcmp(argv[1], "early") == 0) {
    /* Loaded (linked), nothing called yet: fork at once. */
    fork_and_check("fork before any call", NULL, NULL, buf);
    parent_works();
    return check_summary("test_fork (early)");
  }

  /* Run the early scenario in a fresh process. */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "early", (char *)NULL);
    _exit(127);
  }
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);

  /* An engine and a region in the parent. */
  tent_engine *e = NULL;
  tent_region *r = NULL;
  CHECK_ST(tent_engine_create(NULL, &e), TENT_OK);
  CHECK_ST(tent_register(e, buf, 1024, NULL, RW, &r), TENT_OK);
  fork_and_check("fork with an engine", e, r, buf);
  tent_stats s = {sizeof s, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  CHECK_ST(tent_engine_stats(e, &s), TENT_OK);
  CHECK_EQ_U64(s.regions, 1);
  CHECK_ST(tent_unregister(e, r), TENT_OK);

  /* Threads inside the library while forking. */
  busy_engine = e;
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    pthread_create(&t[i], NULL, busy_thread, NULL);
  }
  for (int i = 0; i < 5; i++) {
    usleep(2000);
    fork_and_check("fork with busy threads", e, NULL, buf + 2048);
  }
  atomic_store(&busy_stop, 1);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
  }
  CHECK_ST(tent_engine_stats(e, &s), TENT_OK);
  CHECK_EQ_U64(s.regions, 0);
  CHECK_EQ_U64(s.reservations, 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  parent_works();
  return check_summary("test_fork");
}
