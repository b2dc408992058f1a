/*
 * Test-control API of libfakecuda.so, the fake CUDA driver (see doc.go).
 * The CUDA entry points themselves (cuInit, cuMemCreate, ...) are declared
 * in fakecuda.c with the driver's ABI.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Live objects (first group) and running totals (second group). */
typedef struct fakecuda_counters {
	long long handles;      /* allocation handles not yet cuMemRelease'd */
	long long allocations;  /* physical allocations alive (held by a handle or a mapping) */
	long long reservations; /* cuMemAddressReserve ranges not yet freed */
	long long mappings;     /* cuMemMap mappings not yet unmapped */
	long long fds;          /* file descriptors the fake holds (one memfd per allocation) */
	long long streams;      /* streams not yet destroyed */
	long long events;       /* events not yet destroyed */
	long long contexts;     /* primary context retains not yet released */
	long long mem_allocs;   /* cuMemAlloc blocks not yet freed */

	long long exported_fds; /* file descriptors handed out by exports (total) */
	long long calls;        /* CUDA API calls (total) */
	long long failures;     /* injected failures that fired (total) */
} fakecuda_counters_t;

/* Copies the counters. */
void fakecuda_counters(fakecuda_counters_t *out);

/*
 * Makes the nth call (1 = the next one) from now to the CUDA function fn
 * fail with cuda_error, without side effects. fn is the symbol name; a
 * trailing "_v2" is ignored on both sides ("cuMemcpyDtoD" matches
 * cuMemcpyDtoD_v2). fakecuda_fail_times makes `times` consecutive calls
 * fail from the nth on. Returns 0, or -1 when the table (32 entries) is full.
 */
int fakecuda_fail(const char *fn, int nth, int cuda_error);
int fakecuda_fail_times(const char *fn, int nth, int times, int cuda_error);

/* Drops every armed failure. */
void fakecuda_clear_failures(void);

/*
 * Frees every live object (unmaps, closes, frees), zeroes the counters and
 * clears the armed failures. The configuration and cuInit state stay.
 */
void fakecuda_reset(void);

/*
 * Sets the number of devices, the allocation granularity (a power of two,
 * at least the page size) and whether fabric handles work; a negative value
 * (0 for granularity) keeps the current one. Call it before cuInit.
 */
void fakecuda_config(int devices, unsigned long long granularity, int fabric);

/* Writes a description of the live objects into buf (for test failures). */
void fakecuda_describe(char *buf, int len);
/* The device p is memory of, or -1. */
int fakecuda_device_of(unsigned long long p);

#ifdef __cplusplus
}
#endif
#endif /* FAKECUDA_H */
