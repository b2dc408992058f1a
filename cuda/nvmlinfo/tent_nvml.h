/*
 * Private declarations for nvmlinfo's dlopen'd NVML bindings. The types and
 * layouts are those of nvml.h (NVML API 12/13): only what nvmlinfo reads.
 * Declarations only: the code is in nvml.c.
 */
#ifndef TENT_NVML_H
#define TENT_NVML_H

#include <stddef.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13
};

/* nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3 (and _v2). */
typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} tent_nvml_pci_t;

typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} tent_nvml_memory_t;

/* nvmlGpuFabricInfo_t (nvmlDeviceGetGpuFabricInfo, R525+). */
typedef struct {
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
} tent_nvml_fabric_v1_t;

/* nvmlGpuFabricInfo_v2_t (nvmlDeviceGetGpuFabricInfoV, R550+). */
typedef struct {
	unsigned int version; /* sizeof | 2 << 24 */
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
	unsigned int healthMask;
} tent_nvml_fabric_v2_t;

_Static_assert(sizeof(tent_nvml_pci_t) == 68, "nvmlPciInfo_t is 68 bytes");
_Static_assert(sizeof(tent_nvml_memory_t) == 24, "nvmlMemory_t is 24 bytes");
_Static_assert(sizeof(tent_nvml_fabric_v1_t) == 28, "nvmlGpuFabricInfo_t is 28 bytes");
_Static_assert(sizeof(tent_nvml_fabric_v2_t) == 36, "nvmlGpuFabricInfo_v2_t is 36 bytes");

typedef struct tent_nvml_api {
	/* required */
	nvmlReturn_t (*init)(void);                                 /* nvmlInit_v2, else nvmlInit */
	const char *(*error_string)(nvmlReturn_t r);                /* nvmlErrorString */
	nvmlReturn_t (*device_count)(unsigned int *n);              /* nvmlDeviceGetCount_v2, else v1 */
	nvmlReturn_t (*device_by_index)(unsigned int i, nvmlDevice_t *d); /* _v2, else v1 */
	/* optional */
	nvmlReturn_t (*driver_version)(char *v, unsigned int len);
	nvmlReturn_t (*cuda_driver_version)(int *v);
	nvmlReturn_t (*name)(nvmlDevice_t d, char *s, unsigned int len);
	nvmlReturn_t (*uuid)(nvmlDevice_t d, char *s, unsigned int len);
	nvmlReturn_t (*pci)(nvmlDevice_t d, tent_nvml_pci_t *p); /* _v3, else _v2 */
	nvmlReturn_t (*memory)(nvmlDevice_t d, tent_nvml_memory_t *m);
	nvmlReturn_t (*numa_node)(nvmlDevice_t d, unsigned int *node);
	nvmlReturn_t (*fabric_v)(nvmlDevice_t d, tent_nvml_fabric_v2_t *f);
	nvmlReturn_t (*fabric_v1)(nvmlDevice_t d, tent_nvml_fabric_v1_t *f);
} tent_nvml_api;

/*
 * tent_nvml_open dlopens path and resolves the entry points. It returns
 * NULL with err filled when the library cannot be loaded (*not_found set
 * when it does not exist) or lacks a required entry point.
 */
tent_nvml_api *tent_nvml_open(const char *path, char *err, int errlen, int *not_found);

nvmlReturn_t tent_nvml_init(const tent_nvml_api *a);
const char *tent_nvml_error_string(const tent_nvml_api *a, nvmlReturn_t r);
nvmlReturn_t tent_nvml_driver_version(const tent_nvml_api *a, char *v, unsigned int len);
nvmlReturn_t tent_nvml_cuda_driver_version(const tent_nvml_api *a, int *v);
nvmlReturn_t tent_nvml_device_count(const tent_nvml_api *a, unsigned int *n);
nvmlReturn_t tent_nvml_device_by_index(const tent_nvml_api *a, unsigned int i, nvmlDevice_t *d);
nvmlReturn_t tent_nvml_name(const tent_nvml_api *a, nvmlDevice_t d, char *s, unsigned int len);
nvmlReturn_t tent_nvml_uuid(const tent_nvml_api *a, nvmlDevice_t d, char *s, unsigned int len);
nvmlReturn_t tent_nvml_pci(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_pci_t *p);
nvmlReturn_t tent_nvml_memory(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_memory_t *m);
nvmlReturn_t tent_nvml_numa_node(const tent_nvml_api *a, nvmlDevice_t d, unsigned int *node);

/* Fabric info from whichever query the library has (the v2 layout). */
nvmlReturn_t tent_nvml_fabric(const tent_nvml_api *a, nvmlDevice_t d, tent_nvml_fabric_v2_t *f);

#endif /* TENT_NVML_H */
