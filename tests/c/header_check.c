/*
 * header_check.c — include/tent.h compiles cleanly as C11 and as C++17
 * (-Wall -Wextra -Werror -pedantic), the struct layouts are the ABI's,
 * and every exported function links: its address is taken below, so a
 * function missing from libtent.so fails the link. The list of functions
 * is tests/c/symbols.h.
 */
#include "tent.h"

#include <stddef.h>
#include <stdio.h>

#include "symbols.h"

#ifdef __cplusplus
#define TENT_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define TENT_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* The ABI on LP64: a change here needs a TENT_ABI_VERSION bump (and the
 * Python and C++ wrappers follow). */
TENT_STATIC_ASSERT(sizeof(tent_engine_options) == 88, "tent_engine_options layout");
TENT_STATIC_ASSERT(offsetof(tent_engine_options, secret_len) == 56, "tent_engine_options layout");
TENT_STATIC_ASSERT(offsetof(tent_engine_options, reserved1) == 84, "tent_engine_options layout");
TENT_STATIC_ASSERT(sizeof(tent_region_desc) == 24, "tent_region_desc layout");
TENT_STATIC_ASSERT(sizeof(tent_region_info) == 56, "tent_region_info layout");
TENT_STATIC_ASSERT(offsetof(tent_region_info, location) == 24, "tent_region_info layout");
TENT_STATIC_ASSERT(sizeof(tent_stats) == 80, "tent_stats layout");
TENT_STATIC_ASSERT(offsetof(tent_stats, process_handles) == 72, "tent_stats layout");
TENT_STATIC_ASSERT(sizeof(tent_request) == 40, "tent_request layout");
TENT_STATIC_ASSERT(sizeof(tent_transfer_options) == 40, "tent_transfer_options layout");
TENT_STATIC_ASSERT(sizeof(tent_request_status) == 24, "tent_request_status layout");
/* nic and nics took the place of `reserved`: the size and every older
 * field's offset are what they were. */
TENT_STATIC_ASSERT(offsetof(tent_request_status, flags) == 16, "tent_request_status layout");
TENT_STATIC_ASSERT(offsetof(tent_request_status, nic) == 20, "tent_request_status layout");
TENT_STATIC_ASSERT(offsetof(tent_request_status, nics) == 22, "tent_request_status layout");
TENT_STATIC_ASSERT(sizeof(tent_status) == 4, "tent_status is int32_t");

/* void (*)(void) is the generic function pointer type: casts to it are
 * exempt from -Wcast-function-type in both languages. */
typedef void (*tent_any_fn)(void);

#define TENT_ADDRESS(name) (tent_any_fn) & name,
#define TENT_NAME(name) #name,

static const tent_any_fn functions[] = {TENT_IMPLEMENTED(TENT_ADDRESS)};
static const char *const names[] = {TENT_IMPLEMENTED(TENT_NAME)};

int main(void) {
  int failed = 0, passed = 0;
  /* The initializers compile (all fields, no missing-initializer warning). */
  tent_engine_options eo = TENT_ENGINE_OPTIONS_INIT;
  tent_transfer_options to = TENT_TRANSFER_OPTIONS_INIT;
  if (eo.size != sizeof eo || to.size != sizeof to) {
    fprintf(stderr, "FAILED: *_INIT size fields\n");
    failed++;
  } else {
    passed++;
  }
  for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++) {
    if (functions[i] == NULL) {
      fprintf(stderr, "FAILED: %s has no address\n", names[i]);
      failed++;
    } else {
      passed++;
    }
  }
  if (tent_version() != TENT_VERSION || tent_abi_version() != TENT_ABI_VERSION) {
    fprintf(stderr, "FAILED: header %u/%u, library %u/%u\n", (unsigned)TENT_VERSION,
            (unsigned)TENT_ABI_VERSION, (unsigned)tent_version(), (unsigned)tent_abi_version());
    failed++;
  } else {
    passed++;
  }
#ifdef __cplusplus
  const char *lang = "header_check (C++17)";
#else
  const char *lang = "header_check (C11)";
#endif
  printf("%s: %d passed, %d failed\n", lang, passed, failed);
  return failed != 0;
}
