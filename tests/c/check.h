/*
 * check.h — a tiny test harness for the C tests of libtent.
 *
 *   CHECK(cond)              fails (and continues) if cond is false
 *   CHECK_ST(call, want)     call must return the tent_status want; a
 *                            failure must leave a message in
 *                            tent_last_error(), a success an empty one
 *   CHECK_EQ_U64(a, b)
 *   return check_summary("name");   prints "N passed, M failed", and is
 *                            the exit status (non-zero if any failed)
 *
 * Failures print file:line, the expression, and what was seen.
 */
#ifndef TENT_TESTS_CHECK_H
#define TENT_TESTS_CHECK_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "tent.h"

static atomic_long check_passed;
static atomic_long check_failed;

static void check_fail(const char *file, int line, const char *what) {
  atomic_fetch_add(&check_failed, 1);
  fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
}

#define CHECK(cond)                                 \
  do {                                              \
    if (cond) {                                     \
      atomic_fetch_add(&check_passed, 1);           \
    } else {                                        \
      check_fail(__FILE__, __LINE__, #cond);        \
    }                                               \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                                      \
  do {                                                                                          \
    uint64_t check_a_ = (uint64_t)(a), check_b_ = (uint64_t)(b);                                \
    if (check_a_ == check_b_) {                                                                 \
      atomic_fetch_add(&check_passed, 1);                                                       \
    } else {                                                                                    \
      check_fail(__FILE__, __LINE__, #a " == " #b);                                             \
      fprintf(stderr, "    got %" PRIu64 ", want %" PRIu64 "\n", check_a_, check_b_);           \
    }                                                                                           \
  } while (0)

/* Evaluates to the status; checks code and last-error message. */
static tent_status check_st(const char *file, int line, const char *expr, tent_status got,
                            tent_status want) {
  const char *msg = tent_last_error();
  if (got != want) {
    atomic_fetch_add(&check_failed, 1);
    fprintf(stderr, "%s:%d: FAILED: %s\n    returned %d (%s), want %d (%s)\n    last error: %s\n",
            file, line, expr, got, tent_status_str(got), want, tent_status_str(want), msg);
  } else if (got != TENT_OK && msg[0] == '\0') {
    atomic_fetch_add(&check_failed, 1);
    fprintf(stderr, "%s:%d: FAILED: %s\n    returned %s with an empty tent_last_error()\n", file,
            line, expr, tent_status_str(got));
  } else if (got == TENT_OK && msg[0] != '\0') {
    atomic_fetch_add(&check_failed, 1);
    fprintf(stderr, "%s:%d: FAILED: %s\n    succeeded but tent_last_error() is \"%s\"\n", file,
            line, expr, msg);
  } else {
    atomic_fetch_add(&check_passed, 1);
  }
  return got;
}

#define CHECK_ST(call, want) check_st(__FILE__, __LINE__, #call, (call), (want))

static int check_summary(const char *name) {
  long p = atomic_load(&check_passed), f = atomic_load(&check_failed);
  printf("%s: %ld passed, %ld failed\n", name, p, f);
  return f == 0 ? 0 : 1;
}

#endif /* TENT_TESTS_CHECK_H */
