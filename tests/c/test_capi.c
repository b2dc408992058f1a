/*
 * test_capi.c — the C ABI of libtent, called as a C program calls it:
 * every implemented function, with good and bad input, checking each
 * documented status code, the last-error message, and that a failed call
 * leaves the engine's state unchanged (tent_engine_stats proves it); then a
 * multi-threaded overlap race through the ABI, and a handle leak check.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "tent.h"

#define RW (TENT_REMOTE_READ | TENT_REMOTE_WRITE)

static tent_stats stats_of(tent_engine *e) {
  tent_stats s;
  memset(&s, 0xff, sizeof s);
  s.size = sizeof s;
  CHECK_ST(tent_engine_stats(e, &s), TENT_OK);
  return s;
}

/* The engine holds exactly this many regions, bytes and handles, and no
 * reservation. */
#define CHECK_STATE(e, nregions, nbytes)                   \
  do {                                                     \
    tent_stats st_ = stats_of(e);                          \
    CHECK_EQ_U64(st_.regions, (nregions));                 \
    CHECK_EQ_U64(st_.registered_bytes, (nbytes));          \
    CHECK_EQ_U64(st_.reservations, 0);                     \
    CHECK_EQ_U64(st_.handles, (nregions));                 \
  } while (0)

static tent_engine *new_engine(const char *name) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.name = name;
  o.unregister_timeout_ms = 500;
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  CHECK(e != NULL);
  return e;
}

static uint64_t process_handles(void) {
  tent_engine *probe = new_engine(NULL);
  uint64_t n = stats_of(probe).process_handles;
  CHECK_ST(tent_engine_destroy(probe), TENT_OK);
  return n;
}

/* ---- Never-failing functions ------------------------------------------ */

static void test_versions_and_strings(void) {
  CHECK_EQ_U64(tent_version(), TENT_VERSION);
  CHECK_EQ_U64(tent_abi_version(), TENT_ABI_VERSION);
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", TENT_VERSION_MAJOR, TENT_VERSION_MINOR,
           TENT_VERSION_PATCH);
  CHECK(strcmp(tent_version_string(), want) == 0);

  CHECK(strcmp(tent_status_str(TENT_OK), "success") == 0);
  CHECK(strcmp(tent_status_str(TENT_ERR_OVERLAP), "memory overlaps a registered or in-flight region") == 0);
  CHECK(strcmp(tent_status_str(12345), "unknown status") == 0);
  CHECK(strcmp(tent_status_str(-23), "unknown status") == 0);
  for (tent_status s = TENT_ERR_VERSION_MISMATCH; s <= TENT_PENDING; s++) {
    CHECK(tent_status_str(s) != NULL && strcmp(tent_status_str(s), "unknown status") != 0);
  }

  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_NONE), "none") == 0);
  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_LOCAL), "local") == 0);
  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_SHM), "shm") == 0);
  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_TCP), "tcp") == 0);
  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_CUDA), "cuda") == 0);
  CHECK(strcmp(tent_transport_name(TENT_TRANSPORT_RDMA), "rdma") == 0);
  CHECK(strcmp(tent_transport_name(77), "unknown") == 0);

  /* They leave the last error alone, so that
   * printf("%s: %s", tent_status_str(st), tent_last_error()) works. */
  CHECK_ST(tent_engine_destroy((tent_engine *)(uintptr_t)0x7777777), TENT_ERR_INVALID_HANDLE);
  const char *before = tent_last_error();
  CHECK(before[0] != '\0');
  (void)tent_status_str(TENT_ERR_BUSY);
  (void)tent_version();
  (void)tent_version_string();
  (void)tent_transport_name(1);
  CHECK(strcmp(tent_last_error(), before) == 0);
  CHECK(tent_last_error() == before);
}

/* ---- Engines ----------------------------------------------------------- */

static void test_engine_create(void) {
  uint64_t base = process_handles();
  tent_engine *e = (tent_engine *)(uintptr_t)0xabc;
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;

  CHECK_ST(tent_engine_create(NULL, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_engine_create(&o, NULL), TENT_ERR_INVALID_ARGUMENT);

  o.size = 8; /* an older or uninitialized struct */
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o.size = 0;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o.size = sizeof o - 1;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.reserved0 = 1;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.reserved1 = 2;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.transports = "";
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o.transports = "local,,tcp";
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o.transports = "no-such-transport";
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_NOT_FOUND);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.secret = NULL;
  o.secret_len = 16;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.name = "";
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.metadata = "zookeeper://x";
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  o.timeout_ms = UINT64_MAX;
  CHECK_ST(tent_engine_create(&o, &e), TENT_ERR_INVALID_ARGUMENT);
  CHECK(e == (tent_engine *)(uintptr_t)0xabc); /* untouched on failure */
  CHECK_EQ_U64(process_handles(), base);

  /* NULL options mean defaults; a secret is copied. */
  CHECK_ST(tent_engine_create(NULL, &e), TENT_OK);
  CHECK(e != (tent_engine *)(uintptr_t)0xabc && e != NULL);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_ERR_INVALID_HANDLE); /* double destroy */
  CHECK_ST(tent_engine_destroy(NULL), TENT_OK);
  o = (tent_engine_options)TENT_ENGINE_OPTIONS_INIT;
  char secret[] = "0123456789abcdef";
  o.secret = secret;
  o.secret_len = 16;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  memset(secret, 0, sizeof secret);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK_EQ_U64(process_handles(), base);
}

static void test_engine_name(void) {
  tent_engine *e = new_engine("demo-engine");
  char buf[64];
  size_t n = 999;
  CHECK_ST(tent_engine_name(e, buf, sizeof buf, &n), TENT_OK);
  CHECK(strcmp(buf, "demo-engine") == 0);
  CHECK_EQ_U64(n, 11);
  CHECK_ST(tent_engine_name(e, buf, sizeof buf, NULL), TENT_OK);

  n = 999;
  CHECK_ST(tent_engine_name(e, NULL, 0, &n), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(n, 11); /* the size query */
  n = 999;
  memset(buf, 'x', sizeof buf);
  CHECK_ST(tent_engine_name(e, buf, 11, &n), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(n, 11);
  CHECK(buf[0] == 'x'); /* nothing written */
  CHECK_ST(tent_engine_name(e, buf, 12, &n), TENT_OK);
  CHECK(strcmp(buf, "demo-engine") == 0);
  n = 999;
  CHECK_ST(tent_engine_name(e, NULL, 10, &n), TENT_ERR_INVALID_ARGUMENT);
  CHECK_EQ_U64(n, 999);
  CHECK_ST(tent_engine_name(NULL, buf, sizeof buf, &n), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK_ST(tent_engine_name(e, buf, sizeof buf, &n), TENT_ERR_INVALID_HANDLE);

  /* No name: the listener's host:port. */
  e = new_engine(NULL);
  CHECK_ST(tent_engine_name(e, buf, sizeof buf, &n), TENT_OK);
  CHECK(strncmp(buf, "127.0.0.1:", 10) == 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
}

/* ---- Registration ------------------------------------------------------ */

static void test_register_bad_input(void) {
  tent_engine *e = new_engine(NULL);
  char *buf = malloc(1 << 16);
  tent_region *r = NULL, *sentinel = (tent_region *)(uintptr_t)0x5555;
  CHECK_ST(tent_register(e, buf, 4096, "cpu", RW, &r), TENT_OK);
  CHECK_STATE(e, 1, 4096);

  tent_region *out = sentinel;
  CHECK_ST(tent_register(NULL, buf + 8192, 64, NULL, RW, &out), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_register(e, NULL, 64, NULL, RW, &out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, 0, NULL, RW, &out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, SIZE_MAX, NULL, RW, &out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, (void *)(UINTPTR_MAX - 15), 32, NULL, RW, &out),
           TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, 64, NULL, 0x4, &out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, 64, NULL, 0x80000000u, &out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register(e, buf + 8192, 64, NULL, RW, NULL), TENT_ERR_INVALID_ARGUMENT);
  const char *bad_locations[] = {"", "gpu", "tpu:0", "cpu:", "cpu:x", "cuda:-1", "cpu:99999999",
                                 "cuda:0:1", " cpu", "CPU"};
  for (size_t i = 0; i < sizeof bad_locations / sizeof bad_locations[0]; i++) {
    CHECK_ST(tent_register(e, buf + 8192, 64, bad_locations[i], RW, &out),
             TENT_ERR_INVALID_ARGUMENT);
  }
  CHECK_ST(tent_register(e, buf + 4095, 2, NULL, RW, &out), TENT_ERR_OVERLAP);
  CHECK_ST(tent_register(e, buf - 1, 2, NULL, RW, &out), TENT_ERR_OVERLAP);
  CHECK_ST(tent_register(e, buf + 100, 10, NULL, RW, &out), TENT_ERR_OVERLAP);
  CHECK_ST(tent_register(e, buf, 4096, NULL, RW, &out), TENT_ERR_ALREADY_REGISTERED);
  CHECK_ST(tent_register(e, buf, 4096, "cpu:0", TENT_REMOTE_READ, &out),
           TENT_ERR_ALREADY_REGISTERED);
  CHECK(out == sentinel);
  CHECK_STATE(e, 1, 4096);

  /* Adjacent is not overlapping. */
  tent_region *adj = NULL;
  CHECK_ST(tent_register(e, buf + 4096, 4096, "cpu:0", TENT_REMOTE_READ, &adj), TENT_OK);
  CHECK_STATE(e, 2, 8192);

  tent_region_info info;
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  CHECK_ST(tent_region_get_info(e, adj, &info), TENT_OK);
  CHECK_EQ_U64(info.addr, (uintptr_t)(buf + 4096));
  CHECK_EQ_U64(info.len, 4096);
  CHECK_EQ_U64(info.flags, TENT_REMOTE_READ);
  CHECK(strcmp(info.location, "cpu:0") == 0);
  CHECK_EQ_U64(info.size, sizeof info);
  CHECK_ST(tent_region_get_info(e, r, &info), TENT_OK);
  CHECK(strcmp(info.location, "cpu") == 0);
  CHECK_EQ_U64(info.flags, RW);
  CHECK_ST(tent_region_get_info(e, r, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_region_get_info(e, NULL, &info), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_region_get_info(NULL, r, &info), TENT_ERR_INVALID_HANDLE);
  info.size = 8;
  info.addr = 42;
  CHECK_ST(tent_region_get_info(e, r, &info), TENT_ERR_INVALID_ARGUMENT);
  CHECK_EQ_U64(info.addr, 42); /* untouched on failure */

  CHECK_ST(tent_unregister(e, adj), TENT_OK);
  CHECK_ST(tent_unregister(e, adj), TENT_ERR_INVALID_HANDLE); /* twice */
  CHECK_ST(tent_region_get_info(e, adj, &info), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(e, NULL), TENT_OK);
  CHECK_ST(tent_unregister(NULL, NULL), TENT_OK);
  CHECK_STATE(e, 1, 4096);
  CHECK_ST(tent_unregister(e, r), TENT_OK);
  CHECK_STATE(e, 0, 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

static void test_handle_confusion(void) {
  tent_engine *a = new_engine(NULL);
  tent_engine *b = new_engine(NULL);
  char *buf = malloc(1 << 16);
  tent_region *ra = NULL, *rb = NULL;
  CHECK_ST(tent_register(a, buf, 1024, NULL, RW, &ra), TENT_OK);
  CHECK_ST(tent_register(b, buf, 1024, NULL, RW, &rb), TENT_OK); /* engines are independent */

  /* A region of engine A passed with engine B. */
  CHECK_ST(tent_unregister(b, ra), TENT_ERR_INVALID_HANDLE);
  tent_region_info info = {sizeof info, 0, 0, 0, {0}};
  CHECK_ST(tent_region_get_info(b, ra, &info), TENT_ERR_INVALID_HANDLE);
  tent_region *pair[2] = {rb, ra};
  CHECK_ST(tent_unregister_batch(b, pair, 2), TENT_ERR_INVALID_HANDLE);

  /* A region handle cast to an engine handle, and the reverse. */
  tent_region *r2 = NULL;
  CHECK_ST(tent_register((tent_engine *)ra, buf + 4096, 64, NULL, RW, &r2), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_engine_destroy((tent_engine *)ra), TENT_ERR_INVALID_HANDLE);
  tent_stats s = {sizeof s, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  CHECK_ST(tent_engine_stats((tent_engine *)ra, &s), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(a, (tent_region *)b), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_region_get_info(a, (tent_region *)a, &info), TENT_ERR_INVALID_HANDLE);
  /* Made-up handles. */
  CHECK_ST(tent_unregister(a, (tent_region *)(uintptr_t)0xdeadbeef), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_engine_stats((tent_engine *)(uintptr_t)-1, &s), TENT_ERR_INVALID_HANDLE);
  CHECK_STATE(a, 1, 1024);
  CHECK_STATE(b, 1, 1024);

  /* Destroying A invalidates its regions; B is unaffected. */
  CHECK_ST(tent_engine_destroy(a), TENT_OK);
  CHECK_ST(tent_unregister(a, ra), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister(b, ra), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_engine_stats(a, &s), TENT_ERR_INVALID_HANDLE);
  CHECK_STATE(b, 1, 1024);
  CHECK_ST(tent_engine_destroy(b), TENT_OK);
  CHECK_ST(tent_unregister(b, rb), TENT_ERR_INVALID_HANDLE);
  free(buf);
}

static void test_batches(void) {
  tent_engine *e = new_engine(NULL);
  char *buf = malloc(1 << 16);
  tent_region *out[4] = {0};
  tent_region_desc d[4] = {
      {buf, 64, NULL}, {buf + 64, 64, "cpu"}, {buf + 4096, 4096, "cpu:0"}, {buf + 8192, 1, NULL}};

  CHECK_ST(tent_register_batch(e, d, 0, RW, out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register_batch(e, NULL, 0, RW, out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register_batch(e, NULL, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register_batch(e, d, 2, RW, NULL), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register_batch(NULL, d, 2, RW, out), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_register_batch(e, d, 2, 0x10, out), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_register_batch(e, d, SIZE_MAX / 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  tent_region_desc dup[2] = {{buf, 64, NULL}, {buf, 64, NULL}};
  CHECK_ST(tent_register_batch(e, dup, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  tent_region_desc inner[2] = {{buf, 64, NULL}, {buf + 32, 64, NULL}};
  CHECK_ST(tent_register_batch(e, inner, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  tent_region_desc badloc[2] = {{buf, 64, NULL}, {buf + 128, 64, "tpu"}};
  CHECK_ST(tent_register_batch(e, badloc, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  tent_region_desc emptyloc[2] = {{buf, 64, NULL}, {buf + 128, 64, ""}};
  CHECK_ST(tent_register_batch(e, emptyloc, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  tent_region_desc zero[2] = {{buf, 64, NULL}, {buf + 128, 0, NULL}};
  CHECK_ST(tent_register_batch(e, zero, 2, RW, out), TENT_ERR_INVALID_ARGUMENT);
  CHECK(out[0] == NULL && out[1] == NULL); /* untouched on failure */
  CHECK_STATE(e, 0, 0);

  CHECK_ST(tent_register_batch(e, d, 4, RW, out), TENT_OK);
  CHECK(out[0] && out[1] && out[2] && out[3]);
  CHECK(out[0] != out[1] && out[1] != out[2] && out[2] != out[3]);
  CHECK_STATE(e, 4, 64 + 64 + 4096 + 1);

  /* All or none: the second entry overlaps, so the first stays free. */
  tent_region *more[2] = {0};
  tent_region_desc part[2] = {{buf + 20000, 64, NULL}, {buf + 4100, 8, NULL}};
  CHECK_ST(tent_register_batch(e, part, 2, RW, more), TENT_ERR_OVERLAP);
  tent_region_desc exact[1] = {{buf + 4096, 4096, NULL}};
  CHECK_ST(tent_register_batch(e, exact, 1, RW, more), TENT_ERR_ALREADY_REGISTERED);
  CHECK(more[0] == NULL);
  CHECK_STATE(e, 4, 64 + 64 + 4096 + 1);
  CHECK_ST(tent_register_batch(e, part, 1, RW, more), TENT_OK); /* the first alone is free */
  CHECK_ST(tent_unregister(e, more[0]), TENT_OK);

  /* Unregister batches. */
  tent_region *twice[3] = {out[0], out[1], out[0]};
  CHECK_ST(tent_unregister_batch(e, twice, 3), TENT_ERR_INVALID_ARGUMENT);
  tent_region *withnull[2] = {out[0], NULL};
  CHECK_ST(tent_unregister_batch(e, withnull, 2), TENT_ERR_INVALID_HANDLE);
  tent_region *withbogus[2] = {out[0], (tent_region *)e};
  CHECK_ST(tent_unregister_batch(e, withbogus, 2), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_unregister_batch(e, out, 0), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_unregister_batch(e, NULL, 3), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_unregister_batch(e, out, SIZE_MAX), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_unregister_batch(NULL, out, 2), TENT_ERR_INVALID_HANDLE);
  CHECK_STATE(e, 4, 64 + 64 + 4096 + 1);

  CHECK_ST(tent_unregister_batch(e, out, 2), TENT_OK);
  CHECK_STATE(e, 2, 4096 + 1);
  CHECK_ST(tent_unregister_batch(e, out + 1, 2), TENT_ERR_INVALID_HANDLE); /* one stale */
  CHECK_STATE(e, 2, 4096 + 1);
  CHECK_ST(tent_unregister_batch(e, out + 2, 2), TENT_OK);
  CHECK_STATE(e, 0, 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  free(buf);
}

/* A pointer argument to unreadable memory fails the call, not the process. */
static void test_bad_pointers(void) {
  tent_engine *e = new_engine(NULL);
  char *buf = malloc(4096);
  void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(page != MAP_FAILED);
  tent_region *r = NULL, *out[2];
  CHECK_ST(tent_register(e, buf, 64, (const char *)page, RW, &r), TENT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tent_last_error(), "invalid memory") != NULL);
  CHECK_ST(tent_register_batch(e, (const tent_region_desc *)page, 2, RW, out),
           TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_unregister_batch(e, (tent_region *const *)page, 2), TENT_ERR_INVALID_ARGUMENT);
  tent_engine_options *o = (tent_engine_options *)page;
  tent_engine *e2 = NULL;
  CHECK_ST(tent_engine_create(o, &e2), TENT_ERR_INVALID_ARGUMENT);
  CHECK_STATE(e, 0, 0);
  CHECK_ST(tent_register(e, buf, 64, NULL, RW, &r), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  munmap(page, 4096);
  free(buf);
}

/* ---- Transports, stats, topology -------------------------------------- */

static void test_uninstall_and_stats(void) {
  tent_engine *e = new_engine(NULL);
  CHECK_ST(tent_uninstall(e, "no-such-transport"), TENT_ERR_NOT_FOUND);
  CHECK_ST(tent_uninstall(e, ""), TENT_ERR_NOT_FOUND);
  CHECK_ST(tent_uninstall(NULL, NULL), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_uninstall(e, NULL), TENT_OK);

  tent_stats s;
  memset(&s, 0, sizeof s);
  CHECK_ST(tent_engine_stats(e, NULL), TENT_ERR_INVALID_ARGUMENT);
  s.size = 4;
  s.regions = 99;
  CHECK_ST(tent_engine_stats(e, &s), TENT_ERR_INVALID_ARGUMENT);
  CHECK_EQ_U64(s.regions, 99);
  s.size = 1 << 20;
  CHECK_ST(tent_engine_stats(e, &s), TENT_ERR_INVALID_ARGUMENT);
  s.size = sizeof s;
  CHECK_ST(tent_engine_stats(e, &s), TENT_OK);
  CHECK_EQ_U64(s.regions, 0);
  CHECK_EQ_U64(s.handles, 0);
  CHECK_EQ_U64(s.segments, 0);
  CHECK_EQ_U64(s.batches, 0);
  CHECK(s.process_handles >= 1);

  char buf[4096];
  size_t n = 0, need = 0;
  CHECK_ST(tent_engine_stats_json(e, NULL, 0, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK(need > 10);
  CHECK_ST(tent_engine_stats_json(e, buf, need, &n), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_ST(tent_engine_stats_json(e, buf, need + 1, &n), TENT_OK);
  CHECK_EQ_U64(n, need);
  CHECK_EQ_U64(strlen(buf), n);
  CHECK(buf[0] == '{' && strstr(buf, "\"regions\":0") != NULL);
  CHECK(strstr(buf, "\"transports\":{") != NULL);
  CHECK_ST(tent_engine_stats_json(e, NULL, 5, &n), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_engine_stats_json(NULL, buf, sizeof buf, &n), TENT_ERR_INVALID_HANDLE);

  CHECK_ST(tent_topology_json(buf, sizeof buf, &n), TENT_OK);
  CHECK(strstr(buf, "\"gpus\":[") != NULL);
  CHECK_ST(tent_topology_json(buf, sizeof buf, NULL), TENT_OK);
  CHECK_ST(tent_topology_json(NULL, 0, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(need, n);
  CHECK_ST(tent_topology_json(NULL, 1, &need), TENT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
}

/* tent_engine_transports: the order asked for, the buffer rules of
 * tent_engine_name, "" once everything is uninstalled. */
static void test_engine_transports(void) {
  tent_engine_options o = TENT_ENGINE_OPTIONS_INIT;
  o.transports = "tcp,local";
  tent_engine *e = NULL;
  CHECK_ST(tent_engine_create(&o, &e), TENT_OK);
  char buf[64];
  size_t n = 0, need = 0;
  CHECK_ST(tent_engine_transports(e, buf, sizeof buf, &n), TENT_OK);
  CHECK(strcmp(buf, "tcp,local") == 0);
  CHECK_EQ_U64(n, strlen("tcp,local"));
  CHECK_ST(tent_engine_transports(e, buf, sizeof buf, NULL), TENT_OK);
  CHECK_ST(tent_engine_transports(e, NULL, 0, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK_EQ_U64(need, n);
  memset(buf, 'x', sizeof buf);
  CHECK_ST(tent_engine_transports(e, buf, n, &need), TENT_ERR_BUFFER_TOO_SMALL);
  CHECK(buf[0] == 'x'); /* nothing written on failure */
  CHECK_ST(tent_engine_transports(e, NULL, 5, &n), TENT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tent_last_error(), "buf is NULL") != NULL);
  CHECK_ST(tent_engine_transports(NULL, buf, sizeof buf, &n), TENT_ERR_INVALID_HANDLE);
  CHECK_ST(tent_uninstall(e, "local"), TENT_OK);
  CHECK_ST(tent_engine_transports(e, buf, sizeof buf, &n), TENT_OK);
  CHECK(strcmp(buf, "tcp") == 0);
  CHECK_ST(tent_uninstall(e, NULL), TENT_OK);
  CHECK_ST(tent_engine_transports(e, buf, sizeof buf, &n), TENT_OK);
  CHECK(strcmp(buf, "") == 0 && n == 0);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  CHECK_ST(tent_engine_transports(e, buf, sizeof buf, &n), TENT_ERR_INVALID_HANDLE);
}

/* ---- The last error is per thread ------------------------------------- */

static pthread_barrier_t err_barrier;

static void *err_thread(void *arg) {
  (void)arg;
  tent_engine *e = NULL;
  /* Wait for the main thread's failure, then succeed here. */
  pthread_barrier_wait(&err_barrier);
  CHECK_ST(tent_engine_create(NULL, &e), TENT_OK);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  pthread_barrier_wait(&err_barrier);
  return NULL;
}

static void test_last_error_per_thread(void) {
  pthread_t t;
  pthread_barrier_init(&err_barrier, NULL, 2);
  pthread_create(&t, NULL, err_thread, NULL);
  CHECK_ST(tent_engine_destroy((tent_engine *)(uintptr_t)123456789), TENT_ERR_INVALID_HANDLE);
  char saved[256];
  snprintf(saved, sizeof saved, "%s", tent_last_error());
  pthread_barrier_wait(&err_barrier);
  pthread_barrier_wait(&err_barrier);
  CHECK(strcmp(tent_last_error(), saved) == 0); /* another thread's success didn't clear it */
  pthread_join(t, NULL);
  pthread_barrier_destroy(&err_barrier);
}

/* ---- Overlap race through the C ABI ------------------------------------ */

#define RACE_THREADS 8
#define RACE_ITERS 2000
#define RACE_BUF (1u << 20)
#define RACE_HELD 8

struct interval {
  uintptr_t start, end;
  int live;
};

static struct {
  tent_engine *e;
  char *buf;
  pthread_mutex_t mu;
  struct interval live[RACE_THREADS * RACE_HELD * 3];
  long ok, overlap, already, busy, other, overlapped;
} race;

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Records a successful registration; fails if it overlaps a live one. */
static void race_add(uintptr_t start, uintptr_t end) {
  pthread_mutex_lock(&race.mu);
  int slot = -1;
  for (size_t i = 0; i < sizeof race.live / sizeof race.live[0]; i++) {
    struct interval *iv = &race.live[i];
    if (iv->live && iv->start < end && start < iv->end) {
      race.overlapped++;
      fprintf(stderr, "overlap admitted: [%#lx, %#lx) and [%#lx, %#lx)\n", (unsigned long)start,
              (unsigned long)end, (unsigned long)iv->start, (unsigned long)iv->end);
    }
    if (!iv->live && slot < 0) {
      slot = (int)i;
    }
  }
  if (slot >= 0) {
    race.live[slot] = (struct interval){start, end, 1};
  } else {
    race.other++; /* table full: cannot happen with RACE_HELD per thread */
  }
  pthread_mutex_unlock(&race.mu);
}

/* Forgets an interval before it is unregistered (so the list never holds
 * memory that is no longer registered). */
static void race_remove(uintptr_t start) {
  pthread_mutex_lock(&race.mu);
  for (size_t i = 0; i < sizeof race.live / sizeof race.live[0]; i++) {
    if (race.live[i].live && race.live[i].start == start) {
      race.live[i].live = 0;
      break;
    }
  }
  pthread_mutex_unlock(&race.mu);
}

static void race_count(tent_status st) {
  pthread_mutex_lock(&race.mu);
  switch (st) {
    case TENT_OK:
      race.ok++;
      break;
    case TENT_ERR_OVERLAP:
      race.overlap++;
      break;
    case TENT_ERR_ALREADY_REGISTERED:
      race.already++;
      break;
    case TENT_ERR_BUSY:
      race.busy++;
      break;
    default:
      race.other++;
      fprintf(stderr, "race: unexpected %s: %s\n", tent_status_str(st), tent_last_error());
  }
  pthread_mutex_unlock(&race.mu);
}

struct held {
  tent_region *r;
  uintptr_t start, end;
};

static void *race_thread(void *arg) {
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(uintptr_t)arg + 1;
  struct held held[RACE_HELD * 3];
  int nheld = 0;
  for (int it = 0; it < RACE_ITERS; it++) {
    uint64_t x = xorshift(&seed);
    if (nheld >= RACE_HELD || (nheld > 0 && x % 3 == 0)) {
      int k = (int)(xorshift(&seed) % (uint64_t)nheld);
      race_remove(held[k].start);
      tent_status st = tent_unregister(race.e, held[k].r);
      if (st != TENT_OK) {
        race_count(st);
      }
      held[k] = held[--nheld];
      continue;
    }
    /* Aligned slots collide exactly (ALREADY_REGISTERED, BUSY); random
     * intervals overlap partially. */
    uintptr_t off, len;
    if (x & 1) {
      off = (xorshift(&seed) % 64) * 4096;
      len = 4096 * (1 + xorshift(&seed) % 2);
    } else {
      off = xorshift(&seed) % (RACE_BUF - 8192);
      len = 1 + xorshift(&seed) % 8192;
    }
    uintptr_t start = (uintptr_t)race.buf + off;
    if (x % 5 == 0) {
      /* A batch of two disjoint entries: both or neither. */
      uintptr_t off2 = xorshift(&seed) % (RACE_BUF - 8192);
      uintptr_t len2 = 1 + xorshift(&seed) % 4096;
      uintptr_t start2 = (uintptr_t)race.buf + off2;
      if (start2 < start + len && start < start2 + len2) {
        continue;
      }
      tent_region_desc d[2] = {{(void *)start, len, NULL}, {(void *)start2, len2, "cpu"}};
      tent_region *rs[2];
      tent_status st = tent_register_batch(race.e, d, 2, RW, rs);
      race_count(st);
      if (st == TENT_OK) {
        race_add(start, start + len);
        race_add(start2, start2 + len2);
        held[nheld++] = (struct held){rs[0], start, start + len};
        held[nheld++] = (struct held){rs[1], start2, start2 + len2};
      }
      continue;
    }
    tent_region *r = NULL;
    tent_status st = tent_register(race.e, (void *)start, len, NULL, RW, &r);
    race_count(st);
    if (st == TENT_OK) {
      race_add(start, start + len);
      held[nheld++] = (struct held){r, start, start + len};
    }
  }
  for (int k = 0; k < nheld; k++) {
    race_remove(held[k].start);
    tent_status st = tent_unregister(race.e, held[k].r);
    if (st != TENT_OK) {
      race_count(st);
    }
  }
  return NULL;
}

static void test_overlap_race(void) {
  memset(&race, 0, sizeof race);
  pthread_mutex_init(&race.mu, NULL);
  race.e = new_engine(NULL);
  race.buf = malloc(RACE_BUF);
  pthread_t t[RACE_THREADS];
  for (uintptr_t i = 0; i < RACE_THREADS; i++) {
    pthread_create(&t[i], NULL, race_thread, (void *)i);
  }
  for (int i = 0; i < RACE_THREADS; i++) {
    pthread_join(t[i], NULL);
  }
  printf("overlap race: %ld ok, %ld overlap, %ld already registered, %ld busy\n", race.ok,
         race.overlap, race.already, race.busy);
  CHECK_EQ_U64(race.overlapped, 0);
  CHECK_EQ_U64(race.other, 0);
  CHECK(race.ok > 100);
  CHECK(race.overlap > 100);
  CHECK(race.already > 0);
  CHECK_STATE(race.e, 0, 0);
  CHECK_ST(tent_engine_destroy(race.e), TENT_OK);
  free(race.buf);
  pthread_mutex_destroy(&race.mu);
}

/* Destroying an engine with registered regions releases them all. */
static void test_destroy_releases(void) {
  tent_engine *e = new_engine(NULL);
  char *buf = malloc(1 << 16);
  tent_region *r[16];
  for (int i = 0; i < 16; i++) {
    CHECK_ST(tent_register(e, buf + i * 1024, 1024, NULL, RW, &r[i]), TENT_OK);
  }
  CHECK_STATE(e, 16, 16 * 1024);
  CHECK_ST(tent_engine_destroy(e), TENT_OK);
  for (int i = 0; i < 16; i++) {
    CHECK_ST(tent_unregister(e, r[i]), TENT_ERR_INVALID_HANDLE);
  }
  free(buf);
}

int main(void) {
  uint64_t base = process_handles();
  test_versions_and_strings();
  test_engine_create();
  test_engine_name();
  test_register_bad_input();
  test_handle_confusion();
  test_batches();
  test_bad_pointers();
  test_uninstall_and_stats();
  test_engine_transports();
  test_last_error_per_thread();
  test_overlap_race();
  test_destroy_releases();
  /* Leak check: every handle created above is gone. */
  CHECK_EQ_U64(process_handles(), base);
  return check_summary("test_capi");
}
