/*
 * The resolver behind the generated NVML forwarders (forward_gen.c).
 * Internal to package forward: libtent.so exports none of it (capi/exports.map).
 */
#ifndef TENT_NVML_FORWARD_H
#define TENT_NVML_FORWARD_H

#include "nvml.h"

/* The library the forwarders resolve functions in, opened once. */
#define TENT_NVML_LIBRARY "libnvidia-ml.so.1"

/*
 * tent_nvml_resolve sets *fn to the function name of the NVML library,
 * caching it in *slot. The library is dlopen()ed once, at the first call of
 * any forwarder. It returns NVML_SUCCESS, NVML_ERROR_LIBRARY_NOT_FOUND (no
 * library) or NVML_ERROR_FUNCTION_NOT_FOUND (the library lacks name).
 */
nvmlReturn_t tent_nvml_resolve(const char *name, void **slot, void **fn);

/* What a forwarder returning a string (nvmlErrorString) returns for r. */
const char *tent_nvml_missing_string(nvmlReturn_t r);

/* Whether the library was found (1), not found (0), or not yet looked for (-1). */
int tent_nvml_library_state(void);

#endif /* TENT_NVML_FORWARD_H */
