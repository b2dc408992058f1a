/*
 * demo_register.c — tent in one page: create an engine, register memory,
 * watch an overlapping registration get rejected, tear down, and check
 * that every count is back at zero.
 *
 *   make demo
 */
#include <stdio.h>
#include <stdlib.h>

#include "tent.h"

/* Prints the failure and exits: status code, its fixed text, and the
 * library's message for this call. */
#define MUST(call)                                                                   \
  do {                                                                               \
    tent_status st_ = (call);                                                        \
    if (st_ != TENT_OK) {                                                            \
      fprintf(stderr, "%s failed: %d (%s): %s\n", #call, st_, tent_status_str(st_), \
              tent_last_error());                                                    \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static void print_stats(const char *when, tent_engine *e) {
  tent_stats s = {.size = sizeof s};
  MUST(tent_engine_stats(e, &s));
  printf("%-28s regions=%llu bytes=%llu reservations=%llu handles=%llu\n", when,
         (unsigned long long)s.regions, (unsigned long long)s.registered_bytes,
         (unsigned long long)s.reservations, (unsigned long long)s.handles);
}

int main(void) {
  if (tent_abi_version() != TENT_ABI_VERSION) {
    fprintf(stderr, "libtent ABI %u, header ABI %u\n", tent_abi_version(), TENT_ABI_VERSION);
    return 1;
  }
  printf("libtent %s\n", tent_version_string());

  tent_engine_options opts = TENT_ENGINE_OPTIONS_INIT;
  tent_engine *engine = NULL;
  MUST(tent_engine_create(&opts, &engine));
  char name[128];
  MUST(tent_engine_name(engine, name, sizeof name, NULL));
  printf("engine \"%s\" created\n", name);

  /* Two KV-cache-like blocks in one batch (all or none), one more alone. */
  size_t block = 1 << 20;
  char *pool = malloc(4 * block);
  tent_region_desc descs[2] = {{pool, block, "cpu"}, {pool + block, block, "cpu"}};
  tent_region *regions[3];
  MUST(tent_register_batch(engine, descs, 2, TENT_REMOTE_READ | TENT_REMOTE_WRITE, regions));
  MUST(tent_register(engine, pool + 2 * block, block, NULL, TENT_REMOTE_READ, &regions[2]));
  print_stats("after registering 3 blocks:", engine);

  /* Half of block 1 and half of block 2: rejected, nothing changes. */
  tent_region *overlap = NULL;
  tent_status st = tent_register(engine, pool + block / 2, block, NULL, TENT_REMOTE_READ, &overlap);
  printf("overlapping registration -> %s (%d): %s\n",
         st == TENT_ERR_OVERLAP ? "TENT_ERR_OVERLAP" : "unexpected", st, tent_status_str(st));
  printf("  message: %s\n", tent_last_error());
  /* Registering exactly block 3 again is reported, not double-counted. */
  st = tent_register(engine, pool + 2 * block, block, NULL, TENT_REMOTE_READ, &overlap);
  printf("duplicate registration   -> %s (%d): %s\n",
         st == TENT_ERR_ALREADY_REGISTERED ? "TENT_ERR_ALREADY_REGISTERED" : "unexpected", st,
         tent_last_error());
  print_stats("after the rejected calls:", engine);

  tent_region_info info = {.size = sizeof info};
  MUST(tent_region_get_info(engine, regions[2], &info));
  printf("region 3: addr=%#llx len=%llu location=%s flags=%#x\n", (unsigned long long)info.addr,
         (unsigned long long)info.len, info.location, info.flags);

  MUST(tent_unregister_batch(engine, regions, 2));
  MUST(tent_unregister(engine, regions[2]));
  print_stats("after unregistering:", engine);
  MUST(tent_engine_destroy(engine));
  free(pool);

  /* The handle is dead now: a use is an error, not a crash. */
  st = tent_unregister(engine, regions[0]);
  printf("using a destroyed engine -> %s (%d): %s\n", tent_status_str(st), st, tent_last_error());
  int ok = st == TENT_ERR_INVALID_HANDLE;
  printf(ok ? "demo: OK, all counts back at zero\n" : "demo: FAILED\n");
  return ok ? 0 : 1;
}
