// The dlopen/dlsym loader and the thin wrappers Go calls. Each wrapper that
// takes a context makes it current around the driver call and restores the
// thread's previous context, inside the same cgo call.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tent_cuda.h"
#include "_cgo_export.h"

static void *sym2(void *dl, const char *a, const char *b) {
	void *p = dlsym(dl, a);
	if (p == NULL && b != NULL) p = dlsym(dl, b);
	return p;
}

void tent_cu_load(const char *path, tent_cu_load_result *out) {
	memset(out, 0, sizeof *out);
	dlerror();
	// RTLD_LOCAL: the driver's symbols stay out of the global scope. If the
	// process already loaded libcuda (PyTorch), this returns the same handle
	// and tent shares its driver instance and primary contexts.
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (dl == NULL) {
		const char *e = dlerror();
		out->dl_failed = 1;
		snprintf(out->dlerr, sizeof out->dlerr, "%s", e ? e : "dlopen failed");
		return;
	}
	tent_cu_api *a = calloc(1, sizeof *a);
	if (a == NULL) {
		snprintf(out->missing, sizeof out->missing, "(out of memory)");
		return;
	}
	// The library stays loaded for the life of the process: unloading a CUDA
	// driver under live allocations is never safe, so there is no dlclose.
#define REQ(field, name, alt)                                                  \
	do {                                                                   \
		a->field = sym2(dl, name, alt);                                \
		if (a->field == NULL && out->missing[0] == 0)                  \
			snprintf(out->missing, sizeof out->missing, "%s", name); \
	} while (0)
#define OPT(field, name, alt) a->field = sym2(dl, name, alt)
	REQ(cuInit, "cuInit", NULL);
	REQ(cuDriverGetVersion, "cuDriverGetVersion", NULL);
	REQ(cuDeviceGetCount, "cuDeviceGetCount", NULL);
	REQ(cuDeviceGet, "cuDeviceGet", NULL);
	REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL);
	REQ(cuDeviceGetName, "cuDeviceGetName", NULL);
	REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
	REQ(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
	REQ(cuCtxSetCurrent, "cuCtxSetCurrent", NULL);
	REQ(cuCtxGetCurrent, "cuCtxGetCurrent", NULL);
	REQ(cuPointerGetAttribute, "cuPointerGetAttribute", NULL);
	REQ(cuMemAlloc, "cuMemAlloc_v2", NULL);
	REQ(cuMemFree, "cuMemFree_v2", NULL);
	REQ(cuMemGetAddressRange, "cuMemGetAddressRange_v2", NULL);
	REQ(cuMemcpy, "cuMemcpy", NULL);
	REQ(cuMemcpyAsync, "cuMemcpyAsync", NULL);
	REQ(cuMemcpyHtoD, "cuMemcpyHtoD_v2", NULL);
	REQ(cuMemcpyDtoH, "cuMemcpyDtoH_v2", NULL);
	REQ(cuMemcpyDtoD, "cuMemcpyDtoD_v2", NULL);
	REQ(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL);
	REQ(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL);
	REQ(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL);
	REQ(cuStreamCreate, "cuStreamCreate", NULL);
	REQ(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
	REQ(cuStreamSynchronize, "cuStreamSynchronize", NULL);
	REQ(cuEventCreate, "cuEventCreate", NULL);
	REQ(cuEventRecord, "cuEventRecord", NULL);
	REQ(cuEventQuery, "cuEventQuery", NULL);
	REQ(cuEventSynchronize, "cuEventSynchronize", NULL);
	REQ(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy");

	OPT(cuGetErrorName, "cuGetErrorName", NULL);
	OPT(cuGetErrorString, "cuGetErrorString", NULL);
	OPT(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", NULL);
	OPT(cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
	OPT(cuDeviceTotalMem, "cuDeviceTotalMem_v2", NULL);
	OPT(cuPointerGetAttributes, "cuPointerGetAttributes", NULL);
	OPT(cuLaunchHostFunc, "cuLaunchHostFunc", NULL);
	OPT(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", NULL);

	OPT(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL);
	OPT(cuMemCreate, "cuMemCreate", NULL);
	OPT(cuMemRelease, "cuMemRelease", NULL);
	OPT(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", NULL);
	OPT(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", NULL);
	OPT(cuMemAddressReserve, "cuMemAddressReserve", NULL);
	OPT(cuMemAddressFree, "cuMemAddressFree", NULL);
	OPT(cuMemMap, "cuMemMap", NULL);
	OPT(cuMemUnmap, "cuMemUnmap", NULL);
	OPT(cuMemSetAccess, "cuMemSetAccess", NULL);
	OPT(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", NULL);
#undef REQ
#undef OPT
	if (out->missing[0] != 0) {
		free(a);
		return;
	}
	out->has_vmm = a->cuMemGetAllocationGranularity && a->cuMemCreate && a->cuMemRelease &&
	               a->cuMemExportToShareableHandle && a->cuMemImportFromShareableHandle &&
	               a->cuMemAddressReserve && a->cuMemAddressFree && a->cuMemMap && a->cuMemUnmap &&
	               a->cuMemSetAccess;
	out->api = a;
}

// ---- context guard ----

typedef struct {
	CUcontext prev;
	int switched;
} ctx_guard;

static CUresult ctx_enter(const tent_cu_api *a, CUcontext ctx, ctx_guard *g) {
	g->prev = NULL;
	g->switched = 0;
	if (ctx == NULL) return CUDA_SUCCESS;
	CUresult r = a->cuCtxGetCurrent(&g->prev);
	if (r != CUDA_SUCCESS) return r | TENT_CU_CTX_FAILED;
	if (g->prev == ctx) return CUDA_SUCCESS;
	r = a->cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) return r | TENT_CU_CTX_FAILED;
	g->switched = 1;
	return CUDA_SUCCESS;
}

static void ctx_leave(const tent_cu_api *a, ctx_guard *g) {
	if (g->switched) a->cuCtxSetCurrent(g->prev);
}

#define WITH_CTX(a, ctx, expr)                                  \
	do {                                                    \
		ctx_guard g_;                                   \
		CUresult r_ = ctx_enter((a), (ctx), &g_);       \
		if (r_ != CUDA_SUCCESS) return r_;              \
		r_ = (expr);                                    \
		ctx_leave((a), &g_);                            \
		return r_;                                      \
	} while (0)

// ---- driver, devices, contexts ----

CUresult tent_cu_init(const tent_cu_api *a) { return a->cuInit(0); }
CUresult tent_cu_driver_version(const tent_cu_api *a, int *v) { return a->cuDriverGetVersion(v); }
CUresult tent_cu_device_count(const tent_cu_api *a, int *n) { return a->cuDeviceGetCount(n); }
CUresult tent_cu_device_get(const tent_cu_api *a, int ordinal, CUdevice *dev) {
	return a->cuDeviceGet(dev, ordinal);
}
CUresult tent_cu_device_attr(const tent_cu_api *a, CUdevice dev, int attr, int *v) {
	return a->cuDeviceGetAttribute(v, attr, dev);
}
CUresult tent_cu_device_name(const tent_cu_api *a, CUdevice dev, char *buf, int len) {
	return a->cuDeviceGetName(buf, len, dev);
}
CUresult tent_cu_device_pci(const tent_cu_api *a, CUdevice dev, char *buf, int len) {
	if (a->cuDeviceGetPCIBusId == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	return a->cuDeviceGetPCIBusId(buf, len, dev);
}
CUresult tent_cu_device_uuid(const tent_cu_api *a, CUdevice dev, unsigned char *out16) {
	if (a->cuDeviceGetUuid == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	CUuuid u;
	memset(&u, 0, sizeof u);
	CUresult r = a->cuDeviceGetUuid(&u, dev);
	if (r == CUDA_SUCCESS) memcpy(out16, u.bytes, 16);
	return r;
}
CUresult tent_cu_device_total_mem(const tent_cu_api *a, CUdevice dev, unsigned long long *bytes) {
	if (a->cuDeviceTotalMem == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	size_t b = 0;
	CUresult r = a->cuDeviceTotalMem(&b, dev);
	*bytes = b;
	return r;
}
CUresult tent_cu_primary_retain(const tent_cu_api *a, CUdevice dev, CUcontext *ctx) {
	return a->cuDevicePrimaryCtxRetain(ctx, dev);
}
CUresult tent_cu_primary_release(const tent_cu_api *a, CUdevice dev) { return a->cuDevicePrimaryCtxRelease(dev); }
CUresult tent_cu_ctx_get_current(const tent_cu_api *a, CUcontext *ctx) { return a->cuCtxGetCurrent(ctx); }
CUresult tent_cu_error_name(const tent_cu_api *a, CUresult r, const char **name) {
	*name = NULL;
	if (a->cuGetErrorName == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	return a->cuGetErrorName(r, name);
}
CUresult tent_cu_error_string(const tent_cu_api *a, CUresult r, const char **text) {
	*text = NULL;
	if (a->cuGetErrorString == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	return a->cuGetErrorString(r, text);
}

// ---- pointers ----

// attr8 reads one optional attribute into a zeroed 8-byte slot, so that it
// does not matter whether the driver writes a 4-byte or an 8-byte value.
static int attr8(const tent_cu_api *a, int attr, CUdeviceptr p, unsigned long long *v) {
	unsigned long long slot = 0;
	if (a->cuPointerGetAttribute(&slot, attr, p) != CUDA_SUCCESS) return 0;
	*v = slot;
	return 1;
}

static CUresult pointer_info(const tent_cu_api *a, CUdeviceptr p, tent_cu_ptr_info *o) {
	memset(o, 0, sizeof *o);
	o->device_ordinal = -1;
	unsigned long long mt = 0, ord = 0, start = 0, size = 0;
	if (a->cuPointerGetAttributes != NULL) {
		// Unlike the singular call this one answers zeros for memory the
		// driver does not know instead of failing.
		int attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
		void *data[4] = {&mt, &ord, &start, &size};
		CUresult r = a->cuPointerGetAttributes(4, attrs, data, p);
		if (r != CUDA_SUCCESS) return r;
	} else {
		CUresult r = a->cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
		if (r == CUDA_ERROR_INVALID_VALUE) return CUDA_SUCCESS; // not a CUDA pointer
		if (r != CUDA_SUCCESS) return r;
		attr8(a, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p, &ord);
		attr8(a, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p, &start);
		attr8(a, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p, &size);
	}
	o->memory_type = (unsigned int)mt;
	if (o->memory_type == 0) return CUDA_SUCCESS;
	o->device_ordinal = (int)(unsigned int)ord;
	o->range_start = start;
	o->range_size = size;
	o->have_allowed_handle_types = attr8(a, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p, &o->allowed_handle_types);
	o->have_legacy_ipc = attr8(a, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p, &o->legacy_ipc);
	o->have_mapped = attr8(a, CU_POINTER_ATTRIBUTE_MAPPED, p, &o->mapped);
	o->have_gdr_capable = attr8(a, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p, &o->gdr_capable);
	o->have_managed = attr8(a, CU_POINTER_ATTRIBUTE_IS_MANAGED, p, &o->managed);
	o->have_mapping = attr8(a, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p, &o->mapping_base) &&
	                  attr8(a, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p, &o->mapping_size);
	return CUDA_SUCCESS;
}

CUresult tent_cu_pointer_info(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, tent_cu_ptr_info *out) {
	WITH_CTX(a, ctx, pointer_info(a, p, out));
}

static CUresult address_range(const tent_cu_api *a, CUdeviceptr p, CUdeviceptr *base, unsigned long long *size) {
	size_t sz = 0;
	CUresult r = a->cuMemGetAddressRange(base, &sz, p);
	*size = sz;
	return r;
}

CUresult tent_cu_address_range(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, CUdeviceptr *base,
                               unsigned long long *size) {
	WITH_CTX(a, ctx, address_range(a, p, base, size));
}

// ---- virtual memory management ----

static void fill_prop(CUmemAllocationProp *prop, int dev, int handle_types, int gdr) {
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = handle_types;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	prop->allocFlags.gpuDirectRDMACapable = gdr ? 1 : 0;
}

static CUresult granularity(const tent_cu_api *a, int dev, int handle_types, int option, unsigned long long *gran) {
	CUmemAllocationProp prop;
	fill_prop(&prop, dev, handle_types, 0);
	size_t g = 0;
	CUresult r = a->cuMemGetAllocationGranularity(&g, &prop, option);
	*gran = g;
	return r;
}

CUresult tent_cu_granularity(const tent_cu_api *a, CUcontext ctx, int dev, int handle_types, int option,
                             unsigned long long *gran) {
	WITH_CTX(a, ctx, granularity(a, dev, handle_types, option, gran));
}

static CUresult mem_create(const tent_cu_api *a, int dev, unsigned long long size, int handle_types, int gdr,
                           CUmemGenericAllocationHandle *h) {
	CUmemAllocationProp prop;
	fill_prop(&prop, dev, handle_types, gdr);
	return a->cuMemCreate(h, (size_t)size, &prop, 0);
}

CUresult tent_cu_mem_create(const tent_cu_api *a, CUcontext ctx, int dev, unsigned long long size,
                            int handle_types, int gdr, CUmemGenericAllocationHandle *h) {
	WITH_CTX(a, ctx, mem_create(a, dev, size, handle_types, gdr, h));
}

CUresult tent_cu_mem_release(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h) {
	WITH_CTX(a, ctx, a->cuMemRelease(h));
}

CUresult tent_cu_export_fd(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h, int *fd) {
	*fd = -1;
	WITH_CTX(a, ctx, a->cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

CUresult tent_cu_import_fd(const tent_cu_api *a, CUcontext ctx, int fd, CUmemGenericAllocationHandle *h) {
	// For POSIX_FILE_DESCRIPTOR the fd itself is passed, cast to a pointer.
	WITH_CTX(a, ctx,
	         a->cuMemImportFromShareableHandle(h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
}

CUresult tent_cu_export_fabric(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h,
                               unsigned char *out64) {
	CUmemFabricHandle fh;
	memset(&fh, 0, sizeof fh);
	ctx_guard g;
	CUresult r = ctx_enter(a, ctx, &g);
	if (r != CUDA_SUCCESS) return r;
	r = a->cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
	ctx_leave(a, &g);
	if (r == CUDA_SUCCESS) memcpy(out64, fh.data, sizeof fh.data);
	return r;
}

CUresult tent_cu_import_fabric(const tent_cu_api *a, CUcontext ctx, const unsigned char *in64,
                               CUmemGenericAllocationHandle *h) {
	// For FABRIC a pointer to the 64-byte CUmemFabricHandle is passed.
	CUmemFabricHandle fh;
	memcpy(fh.data, in64, sizeof fh.data);
	WITH_CTX(a, ctx, a->cuMemImportFromShareableHandle(h, &fh, CU_MEM_HANDLE_TYPE_FABRIC));
}

CUresult tent_cu_retain_handle(const tent_cu_api *a, CUcontext ctx, CUdeviceptr addr,
                               CUmemGenericAllocationHandle *h) {
	if (a->cuMemRetainAllocationHandle == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	WITH_CTX(a, ctx, a->cuMemRetainAllocationHandle(h, (void *)(uintptr_t)addr));
}

CUresult tent_cu_reserve(const tent_cu_api *a, CUcontext ctx, unsigned long long size, unsigned long long align,
                         CUdeviceptr *p) {
	*p = 0;
	WITH_CTX(a, ctx, a->cuMemAddressReserve(p, (size_t)size, (size_t)align, 0, 0));
}

CUresult tent_cu_address_free(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size) {
	WITH_CTX(a, ctx, a->cuMemAddressFree(p, (size_t)size));
}

CUresult tent_cu_map(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size,
                     unsigned long long offset, CUmemGenericAllocationHandle h) {
	WITH_CTX(a, ctx, a->cuMemMap(p, (size_t)size, (size_t)offset, h, 0));
}

CUresult tent_cu_unmap(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size) {
	WITH_CTX(a, ctx, a->cuMemUnmap(p, (size_t)size));
}

static CUresult set_access(const tent_cu_api *a, CUdeviceptr p, unsigned long long size, const int *devs, int ndevs,
                           int flags) {
	CUmemAccessDesc desc[16];
	if (ndevs <= 0 || ndevs > 16) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < ndevs; i++) {
		memset(&desc[i], 0, sizeof desc[i]);
		desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		desc[i].location.id = devs[i];
		desc[i].flags = flags;
	}
	return a->cuMemSetAccess(p, (size_t)size, desc, (size_t)ndevs);
}

CUresult tent_cu_set_access(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size,
                            const int *devs, int ndevs, int flags) {
	WITH_CTX(a, ctx, set_access(a, p, size, devs, ndevs, flags));
}

// ---- plain device memory and copies ----

CUresult tent_cu_mem_alloc(const tent_cu_api *a, CUcontext ctx, unsigned long long size, CUdeviceptr *p) {
	*p = 0;
	WITH_CTX(a, ctx, a->cuMemAlloc(p, (size_t)size));
}

CUresult tent_cu_mem_free(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p) { WITH_CTX(a, ctx, a->cuMemFree(p)); }

CUresult tent_cu_memcpy(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                        unsigned long long n) {
	WITH_CTX(a, ctx, a->cuMemcpy(dst, src, (size_t)n));
}

CUresult tent_cu_memcpy_htod(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, const void *src,
                             unsigned long long n) {
	WITH_CTX(a, ctx, a->cuMemcpyHtoD(dst, src, (size_t)n));
}

CUresult tent_cu_memcpy_dtoh(const tent_cu_api *a, CUcontext ctx, void *dst, CUdeviceptr src,
                             unsigned long long n) {
	WITH_CTX(a, ctx, a->cuMemcpyDtoH(dst, src, (size_t)n));
}

CUresult tent_cu_memcpy_dtod(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                             unsigned long long n) {
	WITH_CTX(a, ctx, a->cuMemcpyDtoD(dst, src, (size_t)n));
}

CUresult tent_cu_memcpy_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                              unsigned long long n, CUstream s) {
	WITH_CTX(a, ctx, a->cuMemcpyAsync(dst, src, (size_t)n, s));
}

CUresult tent_cu_memcpy_htod_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, uintptr_t src,
                                   unsigned long long n, CUstream s) {
	WITH_CTX(a, ctx, a->cuMemcpyHtoDAsync(dst, (const void *)src, (size_t)n, s));
}

CUresult tent_cu_memcpy_dtoh_async(const tent_cu_api *a, CUcontext ctx, uintptr_t dst, CUdeviceptr src,
                                   unsigned long long n, CUstream s) {
	WITH_CTX(a, ctx, a->cuMemcpyDtoHAsync((void *)dst, src, (size_t)n, s));
}

CUresult tent_cu_memcpy_dtod_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                                   unsigned long long n, CUstream s) {
	WITH_CTX(a, ctx, a->cuMemcpyDtoDAsync(dst, src, (size_t)n, s));
}

// ---- streams and events ----

CUresult tent_cu_stream_create(const tent_cu_api *a, CUcontext ctx, unsigned int flags, CUstream *s) {
	*s = NULL;
	WITH_CTX(a, ctx, a->cuStreamCreate(s, flags));
}

CUresult tent_cu_stream_destroy(const tent_cu_api *a, CUcontext ctx, CUstream s) {
	WITH_CTX(a, ctx, a->cuStreamDestroy(s));
}

CUresult tent_cu_stream_sync(const tent_cu_api *a, CUcontext ctx, CUstream s) {
	WITH_CTX(a, ctx, a->cuStreamSynchronize(s));
}

// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
#define TENT_CU_DMA_BUF_FD 1

CUresult tent_cu_dmabuf_fd(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size, int *fd) {
	*fd = -1;
	if (a->cuMemGetHandleForAddressRange == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	WITH_CTX(a, ctx, a->cuMemGetHandleForAddressRange(fd, p, (size_t)size, TENT_CU_DMA_BUF_FD, 0));
}

static void host_trampoline(void *user) { tentCudaHostFn(user); }

CUresult tent_cu_launch_host_func(const tent_cu_api *a, CUcontext ctx, CUstream s, void *user) {
	if (a->cuLaunchHostFunc == NULL) return CUDA_ERROR_NOT_SUPPORTED;
	WITH_CTX(a, ctx, a->cuLaunchHostFunc(s, host_trampoline, user));
}

CUresult tent_cu_event_create(const tent_cu_api *a, CUcontext ctx, unsigned int flags, CUevent *e) {
	*e = NULL;
	WITH_CTX(a, ctx, a->cuEventCreate(e, flags));
}

CUresult tent_cu_event_record(const tent_cu_api *a, CUcontext ctx, CUevent e, CUstream s) {
	WITH_CTX(a, ctx, a->cuEventRecord(e, s));
}

CUresult tent_cu_event_query(const tent_cu_api *a, CUcontext ctx, CUevent e) { WITH_CTX(a, ctx, a->cuEventQuery(e)); }

CUresult tent_cu_event_sync(const tent_cu_api *a, CUcontext ctx, CUevent e) {
	WITH_CTX(a, ctx, a->cuEventSynchronize(e));
}

CUresult tent_cu_event_destroy(const tent_cu_api *a, CUcontext ctx, CUevent e) {
	WITH_CTX(a, ctx, a->cuEventDestroy(e));
}
