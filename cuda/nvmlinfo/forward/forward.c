// The resolver behind the generated forwarders (see forward.h, doc.go).

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include "forward.h"

static pthread_once_t library_once = PTHREAD_ONCE_INIT;
static void *library; /* written once, under library_once */
static int library_state = -1; /* -1 not yet looked for, 0 not found, 1 found */

static void open_library(void) {
	// RTLD_LOCAL, and every function found with dlsym on this handle: a
	// missing library or function is an NVML return code, never a failed
	// load or a "symbol lookup error" that kills the process. The handle is
	// never closed (a driver library is not meant to be unloaded).
	library = dlopen(TENT_NVML_LIBRARY, RTLD_NOW | RTLD_LOCAL);
	__atomic_store_n(&library_state, library != NULL, __ATOMIC_RELEASE);
}

int tent_nvml_library_state(void) { return __atomic_load_n(&library_state, __ATOMIC_ACQUIRE); }

nvmlReturn_t tent_nvml_resolve(const char *name, void **slot, void **fn) {
	void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (p != NULL) {
		*fn = p;
		return NVML_SUCCESS;
	}
	pthread_once(&library_once, open_library);
	if (library == NULL) return NVML_ERROR_LIBRARY_NOT_FOUND;
	p = dlsym(library, name);
	if (p == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
	// Two threads may both look it up: dlsym answers the same.
	__atomic_store_n(slot, p, __ATOMIC_RELEASE);
	*fn = p;
	return NVML_SUCCESS;
}

const char *tent_nvml_missing_string(nvmlReturn_t r) {
	switch (r) {
	case NVML_ERROR_LIBRARY_NOT_FOUND:
		return "NVML library not found (" TENT_NVML_LIBRARY ")";
	case NVML_ERROR_FUNCTION_NOT_FOUND:
		return "function not found in the NVML library";
	default:
		return "unknown NVML error";
	}
}
