// dlopen/dlsym bindings of the few NVML entry points nvmlinfo uses.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent_nvml.h"

static void *sym2(void *dl, const char *a, const char *b) {
	void *p = dlsym(dl, a);
	if (p == NULL && b != NULL) p = dlsym(dl, b);
	return p;
}

tent_nvml_api *tent_nvml_open(const char *path, char *err, int errlen, int *not_found) {
	*not_found = 0;
	dlerror();
	// RTLD_LOCAL and dlsym: nothing is bound through the global scope, so
	// a missing library or function never fails the process (unlike
	// link-time references resolved lazily).
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (dl == NULL) {
		const char *e = dlerror();
		snprintf(err, (size_t)errlen, "%s", e ? e : "dlopen failed");
		*not_found = e != NULL && (strstr(e, "No such file") != NULL || strstr(e, "cannot open shared object") != NULL);
		return NULL;
	}
	tent_nvml_api *a = calloc(1, sizeof *a);
	if (a == NULL) {
		snprintf(err, (size_t)errlen, "out of memory");
		return NULL;
	}
	a->init = sym2(dl, "nvmlInit_v2", "nvmlInit");
	a->error_string = sym2(dl, "nvmlErrorString", NULL);
	a->device_count = sym2(dl, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
	a->device_by_index = sym2(dl, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
	a->driver_version = sym2(dl, "nvmlSystemGetDriverVersion", NULL);
	a->cuda_driver_version = sym2(dl, "nvmlSystemGetCudaDriverVersion", NULL);
	a->name = sym2(dl, "nvmlDeviceGetName", NULL);
	a->uuid = sym2(dl, "nvmlDeviceGetUUID", NULL);
	a->pci = sym2(dl, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2");
	a->memory = sym2(dl, "nvmlDeviceGetMemoryInfo", NULL);
	a->numa_node = sym2(dl, "nvmlDeviceGetNumaNodeId", NULL);
	a->fabric_v = sym2(dl, "nvmlDeviceGetGpuFabricInfoV", NULL);
	a->fabric_v1 = sym2(dl, "nvmlDeviceGetGpuFabricInfo", NULL);
	const char *missing = !a->init ? "nvmlInit_v2"
	                      : !a->error_string ? "nvmlErrorString"
	                      : !a->device_count ? "nvmlDeviceGetCount_v2"
	                      : !a->device_by_index ? "nvmlDeviceGetHandleByIndex_v2"
	                      : NULL;
	if (missing != NULL) {
		snprintf(err, (size_t)errlen, "%s lacks %s", path, missing);
		free(a);
		return NULL; // the library stays loaded: never dlclose a driver library
	}
	return a;
}

nvmlReturn_t tent_nvml_init(const tent_nvml_api *a) { return a->init(); }

const char *tent_nvml_error_string(const tent_nvml_api *a, nvmlReturn_t r) {
	const char *s = a->error_string(r);
	return s ? s : "unknown NVML error";
}

#define OPTIONAL(fn, ...) \
	if (a->fn == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND; \
	return a->fn(__VA_ARGS__)

nvmlReturn_t tent_nvml_driver_version(const tent_nvml_api *a, char *v, unsigned int len) {
	OPTIONAL(driver_version, v, len);
}
nvmlReturn_t tent_nvml_cuda_driver_version(const tent_nvml_api *a, int *v) { OPTIONAL(cuda_driver_version, v); }
nvmlReturn_t tent_nvml_device_count(const tent_nvml_api *a, unsigned int *n) { return a->device_count(n); }
nvmlReturn_t tent_nvml_device_by_index(const tent_nvml_api *a, unsigned int i, nvmlDevice_t *d) {
	return a->device_by_index(i, d);
}
nvmlReturn_t tent_nvml_name(const tent_nvml_api *a, nvmlDevice_t d, char *s, unsigned int len) {
	OPTIONAL(name, d, s, len);
}
nvmlReturn_t tent_nvml_uuid(const tent_nvml_api *a, nvmlDevice_t d, char *s, unsigned int len) {
	OPTIONAL(uuid, d, s, len);
}
nvmlReturn_t tent_nvml_pci(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_pci_t *p) { OPTIONAL(pci, d, p); }
nvmlReturn_t tent_nvml_memory(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_memory_t *m) {
	OPTIONAL(memory, d, m);
}
nvmlReturn_t tent_nvml_numa_node(const tent_nvml_api *a, nvmlDevice_t d, unsigned int *node) {
	OPTIONAL(numa_node, d, node);
}

nvmlReturn_t tent_nvml_fabric(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_fabric_v2_t *f) {
	memset(f, 0, sizeof *f);
	if (a->fabric_v != NULL) {
		f->version = (unsigned int)sizeof *f | (2U << 24); /* nvmlGpuFabricInfo_v2 */
		return a->fabric_v(d, f);
	}
	if (a->fabric_v1 != NULL) {
		tent_nvml_fabric_v1_t v1;
		memset(&v1, 0, sizeof v1);
		nvmlReturn_t r = a->fabric_v1(d, &v1);
		memcpy(f->clusterUuid, v1.clusterUuid, sizeof f->clusterUuid);
		f->status = v1.status;
		f->cliqueId = v1.cliqueId;
		f->state = v1.state;
		return r;
	}
	return NVML_ERROR_FUNCTION_NOT_FOUND;
}
