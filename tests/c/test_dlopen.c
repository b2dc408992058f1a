/*
 * test_dlopen.c — libtent.so loads with dlopen(RTLD_NOW | RTLD_LOCAL), as
 * Python's ctypes loads it (ctypes always adds RTLD_NOW, so any undefined
 * symbol fails the load), every implemented function resolves with dlsym,
 * and the internals (Go exports, cgo glue, the shim's helpers) do not:
 * exports.map keeps them local.
 *
 * Usage: test_dlopen path/to/libtent.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "symbols.h"
#include "tent.h"

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s libtent.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "FAILED: dlopen(RTLD_NOW): %s\n", dlerror());
    printf("test_dlopen: 0 passed, 1 failed\n");
    return 1;
  }
  passed++;

#define TENT_RESOLVE(name)                                        \
  if (dlsym(lib, #name) == NULL) {                                \
    fprintf(stderr, "FAILED: dlsym(%s): %s\n", #name, dlerror()); \
    failed++;                                                     \
  } else {                                                        \
    passed++;                                                     \
  }
  TENT_IMPLEMENTED(TENT_RESOLVE)

  static const char *const hidden[] = {"tentgo_register", "tentgo_engine_create",
                                       "tentshim_set_error", "tentshim_forked", "crosscall2",
                                       "_cgo_panic", "_cgo_topofstack", "x_cgo_init"};
  for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++) {
    if (dlsym(lib, hidden[i]) != NULL) {
      fprintf(stderr, "FAILED: internal symbol %s is exported\n", hidden[i]);
      failed++;
    } else {
      passed++;
    }
  }

  /* Call through the dlsym'd pointers. */
  uint32_t (*version)(void) = (uint32_t(*)(void))dlsym(lib, "tent_version");
  tent_status (*create)(const tent_engine_options *, tent_engine **) =
      (tent_status(*)(const tent_engine_options *, tent_engine **))dlsym(lib, "tent_engine_create");
  tent_status (*destroy)(tent_engine *) = (tent_status(*)(tent_engine *))dlsym(lib, "tent_engine_destroy");
  const char *(*last_error)(void) = (const char *(*)(void))dlsym(lib, "tent_last_error");
  if (version && create && destroy && last_error) {
    tent_engine *e = NULL;
    tent_status st = create(NULL, &e);
    if (version() != TENT_VERSION || st != TENT_OK || destroy(e) != TENT_OK ||
        destroy(e) != TENT_ERR_INVALID_HANDLE || last_error()[0] == '\0') {
      fprintf(stderr, "FAILED: calls through dlsym (create: %d %s)\n", st, last_error());
      failed++;
    } else {
      passed++;
    }
  } else {
    failed++;
  }
  /* Never dlclose: a Go runtime cannot be unloaded (the library is
   * NODELETE anyway). */
  printf("test_dlopen: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
