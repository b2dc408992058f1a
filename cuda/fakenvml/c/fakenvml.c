/*
 * A fake libnvidia-ml.so.1 (see doc.go): the few NVML entry points tent's
 * topology calls, and nothing else, so every other NVML function is one the
 * "driver" lacks. Behaviour comes from the environment, read at each call:
 *   FAKENVML_GPUS        number of GPUs (default 2, at most 8)
 *   FAKENVML_INIT_ERROR  nvmlReturn_t for nvmlInit (default 0)
 *   FAKENVML_FABRIC      0: fabric not supported, 1: registered in a cluster,
 *                        2: registration in progress (default 0)
 *   FAKENVML_NUMA        NUMA node of each GPU, comma-separated ("0,0,1,1";
 *                        "-" for a GPU whose node NVML does not know);
 *                        default: GPU i on node i/4
 * Build: gcc -shared -fPIC -o libnvidia-ml.so.1 fakenvml.c
 * (-DFAKENVML_NO_FABRIC_V: only the older nvmlDeviceGetGpuFabricInfo;
 *  -DFAKENVML_NO_NUMA: no nvmlDeviceGetNumaNodeId).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
	unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

static struct nvmlDevice_st {
	int index;
} devs[8];

static int env(const char *name, int def) {
	const char *s = getenv(name);
	return s && *s ? atoi(s) : def;
}

static int ngpus(void) {
	int n = env("FAKENVML_GPUS", 2);
	return n < 0 ? 0 : n > 8 ? 8 : n;
}

static int dev_index(nvmlDevice_t d) {
	if (d < &devs[0] || d >= &devs[8]) return -1;
	int i = (int)(d - &devs[0]);
	return i < ngpus() ? i : -1;
}

nvmlReturn_t nvmlInit_v2(void) { return env("FAKENVML_INIT_ERROR", 0); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { return 0; }

const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case 0: return "Success";
	case 2: return "Invalid Argument";
	case 3: return "Not Supported";
	case 9: return "Driver Not Loaded";
	case 12: return "NVML Shared Library Not Found";
	case 13: return "Function Not Found";
	case 25: return "Argument version mismatch";
	}
	return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
	snprintf(v, len, "555.42.06");
	return 0;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
	*v = 12050;
	return 0;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	*n = (unsigned int)ngpus();
	return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if ((int)i >= ngpus()) return 2;
	devs[i].index = (int)i;
	*d = &devs[i];
	return 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
	int i = dev_index(d);
	if (i < 0) return 2;
	snprintf(name, len, "NVIDIA Fake H100 %d", i);
	return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
	int i = dev_index(d);
	if (i < 0) return 2;
	snprintf(uuid, len, "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfe%02x", i);
	return 0;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	int i = dev_index(d);
	if (i < 0) return 2;
	memset(p, 0, sizeof *p);
	p->bus = 0x1a + i;
	p->pciDeviceId = 0x233510de; /* device 0x2335 (H200 SXM), vendor 0x10de */
	p->pciSubSystemId = 0x18be10de;
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", (0x1a + i) & 0xff);
	snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", 0x1a + i);
	return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	if (dev_index(d) < 0) return 2;
	m->total = 80ULL << 30;
	m->free = m->total;
	m->used = 0;
	return 0;
}

#ifndef FAKENVML_NO_NUMA
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) {
	int i = dev_index(d);
	if (i < 0) return 2;
	const char *s = getenv("FAKENVML_NUMA");
	if (s == NULL || *s == 0) {
		*node = (unsigned int)(i / 4);
		return 0;
	}
	for (int k = 0; k < i && s != NULL; k++) {
		s = strchr(s, ',');
		if (s != NULL) s++;
	}
	if (s == NULL || *s == 0 || *s == ',' || *s == '-') return 3; /* NVML_ERROR_NOT_SUPPORTED */
	*node = (unsigned int)atoi(s);
	return 0;
}
#endif

typedef struct {
	unsigned char clusterUuid[16];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
} nvmlGpuFabricInfo_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *f) {
	int i = dev_index(d);
	if (i < 0) return 2;
	int mode = env("FAKENVML_FABRIC", 0);
	if (mode == 0) return 3;
	memset(f, 0, sizeof *f);
	for (int k = 0; k < 16; k++) f->clusterUuid[k] = (unsigned char)(0xb0 + k);
	f->cliqueId = 5;
	f->state = mode == 1 ? 3 : 2;
	return 0;
}

#ifndef FAKENVML_NO_FABRIC_V
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfo_v2_t *f) {
	int i = dev_index(d);
	if (i < 0) return 2;
	if ((f->version >> 24) != 2 && (f->version >> 24) != 3) return 25;
	if ((f->version & 0xffffff) < sizeof *f) return 25;
	int mode = env("FAKENVML_FABRIC", 0);
	if (mode == 0) return 3; /* NVML_ERROR_NOT_SUPPORTED */
	unsigned int version = f->version;
	memset(f, 0, sizeof *f);
	f->version = version;
	for (int k = 0; k < 16; k++) f->clusterUuid[k] = (unsigned char)(0xa0 + k);
	f->cliqueId = 7;
	f->status = 0;
	f->state = mode == 1 ? 3 : 2; /* COMPLETED : IN_PROGRESS */
	return 0;
}
#endif
