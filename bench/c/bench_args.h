/*
 * bench_args.h — the size arguments of the C bench tools (tcp_pingpong,
 * memcpy_floor): "4096", "4K", "64KiB", "1M", "2G", as sweep.py takes them.
 */
#ifndef TENT_BENCH_ARGS_H
#define TENT_BENCH_ARGS_H

#include <stdint.h>
#include <stdlib.h>

/* Parses s into *out: at least one byte and at most max. Returns 0, or -1
 * for anything else (no number, an unknown suffix, out of range). */
static inline int bench_parse_size(const char *s, uint64_t *out, uint64_t max) {
  char *end;
  double v = strtod(s, &end);
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1 << 10, end++;
  else if (*end == 'M' || *end == 'm') mul = 1 << 20, end++;
  else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
  if (*end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (end == s || *end != '\0' || !(v * (double)mul >= 1) || v * (double)mul > (double)max) return -1;
  *out = (uint64_t)(v * (double)mul);
  return 0;
}

#endif
