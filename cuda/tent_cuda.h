/*
 * Private declarations for tent's dlopen'd CUDA driver bindings.
 *
 * No CUDA header exists on the build machines, so the few types, enum values
 * and struct layouts tent needs are declared here from the public CUDA driver
 * API documentation (cuda.h of CUDA 12.x). Only declarations live in this
 * header (it is included by a Go file with //export); the code is in
 * driver.c. The fake driver (fakecuda/fakecuda.c) declares the same ABI on
 * its own, as an independent second reading of the documentation.
 *
 * Layout facts (x86_64 / aarch64 Linux, LP64):
 *   CUdeviceptr, CUmemGenericAllocationHandle: unsigned long long (8 bytes)
 *   CUmemLocation        { int type; int id; }                     8 bytes
 *   CUmemAllocationProp  { int type; int requestedHandleTypes;
 *                          CUmemLocation location;                 @8
 *                          void *win32HandleMetaData;              @16
 *                          { uchar compressionType;
 *                            uchar gpuDirectRDMACapable;
 *                            ushort usage; uchar reserved[4]; } allocFlags; @24 }
 *                                                                  32 bytes
 *   CUmemAccessDesc      { CUmemLocation location; int flags; }    12 bytes
 *   CUmemFabricHandle    { unsigned char data[64]; }               64 bytes
 */
#ifndef TENT_CUDA_H
#define TENT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef void (*CUhostFn)(void *userData);

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

/* CUresult values used by tent's Go code and by the fake driver. */
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_STUB_LIBRARY = 34,
	CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_ALREADY_MAPPED = 208,
	CUDA_ERROR_NOT_MAPPED = 211,
	CUDA_ERROR_ECC_UNCORRECTABLE = 214,
	CUDA_ERROR_OPERATING_SYSTEM = 304,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_SYSTEM_NOT_READY = 802,
	CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
	CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
	CUDA_ERROR_TIMEOUT = 909,
	CUDA_ERROR_UNKNOWN = 999
};

/* CUdevice_attribute (the ones tent reads). */
enum {
	CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
	CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
	CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
	CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
	CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
	CU_DEVICE_ATTRIBUTE_NUMA_ID = 131,
	CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134
};

/* CUpointer_attribute. */
enum {
	CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
	CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_POINTER_ATTRIBUTE_MAPPED = 13,
	CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
	CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
	CU_POINTER_ATTRIBUTE_ACCESS_FLAGS = 16,
	CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
	CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19
};

/* CUmemorytype. */
enum {
	CU_MEMORYTYPE_HOST = 1,
	CU_MEMORYTYPE_DEVICE = 2,
	CU_MEMORYTYPE_ARRAY = 3,
	CU_MEMORYTYPE_UNIFIED = 4
};

/* CUmemAllocationHandleType (a bit mask). */
enum {
	CU_MEM_HANDLE_TYPE_NONE = 0x0,
	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
	CU_MEM_HANDLE_TYPE_WIN32 = 0x2,
	CU_MEM_HANDLE_TYPE_WIN32_KMT = 0x4,
	CU_MEM_HANDLE_TYPE_FABRIC = 0x8
};

/* CUmemAccess_flags. */
enum {
	CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
	CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
};

/* CUmemLocationType. */
enum {
	CU_MEM_LOCATION_TYPE_INVALID = 0x0,
	CU_MEM_LOCATION_TYPE_DEVICE = 0x1
};

/* CUmemAllocationType. */
enum {
	CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
	CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
};

/* CUmemAllocationGranularity_flags. */
enum {
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
	CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
};

/* CUstream_flags / CUevent_flags. */
enum {
	CU_STREAM_DEFAULT = 0x0,
	CU_STREAM_NON_BLOCKING = 0x1,
	CU_EVENT_DEFAULT = 0x0,
	CU_EVENT_BLOCKING_SYNC = 0x1,
	CU_EVENT_DISABLE_TIMING = 0x2
};

#define TENT_CU_IPC_HANDLE_SIZE 64

typedef struct CUmemLocation_st {
	int type; /* CUmemLocationType */
	int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
	int type;                 /* CUmemAllocationType */
	int requestedHandleTypes; /* CUmemAllocationHandleType mask */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct CUmemFabricHandle_st {
	unsigned char data[TENT_CU_IPC_HANDLE_SIZE];
} CUmemFabricHandle;

/* Compile-time checks of the layouts above (C11). */
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation is 8 bytes");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "location at 8");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "win32HandleMetaData at 16");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "allocFlags at 24");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");
_Static_assert(sizeof(CUmemFabricHandle) == 64, "CUmemFabricHandle is 64 bytes");

/*
 * The resolved driver entry points. A NULL member is a symbol the library
 * lacks; tent_cu_load fails only when a required one is missing.
 */
typedef struct tent_cu_api {
	/* required */
	CUresult (*cuInit)(unsigned int flags);
	CUresult (*cuDriverGetVersion)(int *version);
	CUresult (*cuDeviceGetCount)(int *count);
	CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
	CUresult (*cuDeviceGetAttribute)(int *pi, int attrib, CUdevice dev);
	CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev); /* _v2, else v1 */
	CUresult (*cuCtxSetCurrent)(CUcontext ctx);
	CUresult (*cuCtxGetCurrent)(CUcontext *pctx);
	CUresult (*cuPointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
	CUresult (*cuMemAlloc)(CUdeviceptr *dptr, size_t bytesize);             /* _v2 */
	CUresult (*cuMemFree)(CUdeviceptr dptr);                                /* _v2 */
	CUresult (*cuMemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr p); /* _v2 */
	CUresult (*cuMemcpy)(CUdeviceptr dst, CUdeviceptr src, size_t n);
	CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
	CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);   /* _v2 */
	CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);         /* _v2 */
	CUresult (*cuMemcpyDtoD)(CUdeviceptr dst, CUdeviceptr src, size_t n);   /* _v2 */
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s); /* _v2 */
	CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);       /* _v2 */
	CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s); /* _v2 */
	CUresult (*cuStreamCreate)(CUstream *ps, unsigned int flags);
	CUresult (*cuStreamDestroy)(CUstream s); /* _v2 */
	CUresult (*cuStreamSynchronize)(CUstream s);
	CUresult (*cuEventCreate)(CUevent *pe, unsigned int flags);
	CUresult (*cuEventRecord)(CUevent e, CUstream s);
	CUresult (*cuEventQuery)(CUevent e);
	CUresult (*cuEventSynchronize)(CUevent e);
	CUresult (*cuEventDestroy)(CUevent e); /* _v2 */

	/* optional */
	CUresult (*cuGetErrorName)(CUresult err, const char **str);
	CUresult (*cuGetErrorString)(CUresult err, const char **str);
	CUresult (*cuDeviceGetPCIBusId)(char *bus, int len, CUdevice dev);
	CUresult (*cuDeviceGetUuid)(CUuuid *uuid, CUdevice dev); /* _v2, else v1 */
	CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice dev); /* _v2 */
	CUresult (*cuPointerGetAttributes)(unsigned int n, int *attrs, void **data, CUdeviceptr ptr);
	CUresult (*cuLaunchHostFunc)(CUstream s, CUhostFn fn, void *userData);
	/* CUDA 11.7+: a dmabuf fd for a range of device memory */
	CUresult (*cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr p, size_t size, int type,
	                                          unsigned long long flags);

	/* virtual memory management: all or nothing (see tent_cu_load) */
	CUresult (*cuMemGetAllocationGranularity)(size_t *gran, const CUmemAllocationProp *prop, int option);
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
	                        unsigned long long flags);
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle h);
	CUresult (*cuMemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle h, int type,
	                                         unsigned long long flags);
	CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *h, void *osHandle, int type);
	CUresult (*cuMemAddressReserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
	                                unsigned long long flags);
	CUresult (*cuMemAddressFree)(CUdeviceptr p, size_t size);
	CUresult (*cuMemMap)(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
	                     unsigned long long flags);
	CUresult (*cuMemUnmap)(CUdeviceptr p, size_t size);
	CUresult (*cuMemSetAccess)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count);
	/* optional within VMM (CUDA 11.0+) */
	CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *h, void *addr);
} tent_cu_api;

/* Result of tent_cu_load. */
typedef struct tent_cu_load_result {
	tent_cu_api *api;     /* NULL on failure */
	int dl_failed;        /* dlopen failed: the library is missing or unloadable */
	char missing[64];     /* the first required symbol not found */
	char dlerr[256];      /* dlerror() text */
	int has_vmm;          /* every VMM entry point was found */
} tent_cu_load_result;

void tent_cu_load(const char *path, tent_cu_load_result *out);

/*
 * Wrappers: ctx, when not NULL, is made current on the calling thread for the
 * duration of the call and the previous current context is restored after it
 * (all inside one cgo call, so goroutine migration cannot interfere). When
 * making ctx current fails, the wrapper returns that CUresult with
 * TENT_CU_CTX_FAILED or'ed in (CUresult values are far below it).
 */
#define TENT_CU_CTX_FAILED 0x40000000
CUresult tent_cu_init(const tent_cu_api *a);
CUresult tent_cu_driver_version(const tent_cu_api *a, int *v);
CUresult tent_cu_device_count(const tent_cu_api *a, int *n);
CUresult tent_cu_device_get(const tent_cu_api *a, int ordinal, CUdevice *dev);
CUresult tent_cu_device_attr(const tent_cu_api *a, CUdevice dev, int attr, int *v);
CUresult tent_cu_device_name(const tent_cu_api *a, CUdevice dev, char *buf, int len);
CUresult tent_cu_device_pci(const tent_cu_api *a, CUdevice dev, char *buf, int len);
CUresult tent_cu_device_uuid(const tent_cu_api *a, CUdevice dev, unsigned char *out16);
CUresult tent_cu_device_total_mem(const tent_cu_api *a, CUdevice dev, unsigned long long *bytes);
CUresult tent_cu_primary_retain(const tent_cu_api *a, CUdevice dev, CUcontext *ctx);
CUresult tent_cu_primary_release(const tent_cu_api *a, CUdevice dev);
CUresult tent_cu_ctx_get_current(const tent_cu_api *a, CUcontext *ctx);
CUresult tent_cu_error_name(const tent_cu_api *a, CUresult r, const char **name);
CUresult tent_cu_error_string(const tent_cu_api *a, CUresult r, const char **text);

/* Pointer attributes gathered in one go. */
typedef struct tent_cu_ptr_info {
	unsigned int memory_type; /* 0: not a CUDA pointer */
	int device_ordinal;
	unsigned long long range_start;
	unsigned long long range_size;
	/* optional attributes: have_* says whether the driver answered */
	unsigned long long allowed_handle_types;
	unsigned long long legacy_ipc;
	unsigned long long mapped;
	unsigned long long gdr_capable;
	unsigned long long managed;
	unsigned long long mapping_base;
	unsigned long long mapping_size;
	int have_allowed_handle_types;
	int have_legacy_ipc;
	int have_mapped;
	int have_gdr_capable;
	int have_managed;
	int have_mapping;
} tent_cu_ptr_info;
CUresult tent_cu_pointer_info(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, tent_cu_ptr_info *out);
CUresult tent_cu_address_range(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, CUdeviceptr *base,
                               unsigned long long *size);

CUresult tent_cu_granularity(const tent_cu_api *a, CUcontext ctx, int dev, int handle_types, int option,
                             unsigned long long *gran);
CUresult tent_cu_mem_create(const tent_cu_api *a, CUcontext ctx, int dev, unsigned long long size,
                            int handle_types, int gdr, CUmemGenericAllocationHandle *h);
CUresult tent_cu_mem_release(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h);
CUresult tent_cu_export_fd(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h, int *fd);
CUresult tent_cu_import_fd(const tent_cu_api *a, CUcontext ctx, int fd, CUmemGenericAllocationHandle *h);
CUresult tent_cu_export_fabric(const tent_cu_api *a, CUcontext ctx, CUmemGenericAllocationHandle h,
                               unsigned char *out64);
CUresult tent_cu_import_fabric(const tent_cu_api *a, CUcontext ctx, const unsigned char *in64,
                               CUmemGenericAllocationHandle *h);
CUresult tent_cu_retain_handle(const tent_cu_api *a, CUcontext ctx, CUdeviceptr addr,
                               CUmemGenericAllocationHandle *h);
CUresult tent_cu_reserve(const tent_cu_api *a, CUcontext ctx, unsigned long long size,
                         unsigned long long align, CUdeviceptr *p);
CUresult tent_cu_address_free(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size);
CUresult tent_cu_map(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size,
                     unsigned long long offset, CUmemGenericAllocationHandle h);
CUresult tent_cu_unmap(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size);
CUresult tent_cu_set_access(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size,
                            const int *devs, int ndevs, int flags);

CUresult tent_cu_mem_alloc(const tent_cu_api *a, CUcontext ctx, unsigned long long size, CUdeviceptr *p);
CUresult tent_cu_mem_free(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p);
CUresult tent_cu_memcpy(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                        unsigned long long n);
CUresult tent_cu_memcpy_htod(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, const void *src,
                             unsigned long long n);
CUresult tent_cu_memcpy_dtoh(const tent_cu_api *a, CUcontext ctx, void *dst, CUdeviceptr src,
                             unsigned long long n);
CUresult tent_cu_memcpy_dtod(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                             unsigned long long n);
CUresult tent_cu_memcpy_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                              unsigned long long n, CUstream s);
CUresult tent_cu_memcpy_htod_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, uintptr_t src,
                                   unsigned long long n, CUstream s);
CUresult tent_cu_memcpy_dtoh_async(const tent_cu_api *a, CUcontext ctx, uintptr_t dst, CUdeviceptr src,
                                   unsigned long long n, CUstream s);
CUresult tent_cu_memcpy_dtod_async(const tent_cu_api *a, CUcontext ctx, CUdeviceptr dst, CUdeviceptr src,
                                   unsigned long long n, CUstream s);

CUresult tent_cu_stream_create(const tent_cu_api *a, CUcontext ctx, unsigned int flags, CUstream *s);
CUresult tent_cu_stream_destroy(const tent_cu_api *a, CUcontext ctx, CUstream s);
CUresult tent_cu_stream_sync(const tent_cu_api *a, CUcontext ctx, CUstream s);
CUresult tent_cu_launch_host_func(const tent_cu_api *a, CUcontext ctx, CUstream s, void *user);
/* cuMemGetHandleForAddressRange as a dmabuf fd (*fd = -1 on failure);
 * CUDA_ERROR_NOT_SUPPORTED when the driver lacks it. */
CUresult tent_cu_dmabuf_fd(const tent_cu_api *a, CUcontext ctx, CUdeviceptr p, unsigned long long size, int *fd);
CUresult tent_cu_event_create(const tent_cu_api *a, CUcontext ctx, unsigned int flags, CUevent *e);
CUresult tent_cu_event_record(const tent_cu_api *a, CUcontext ctx, CUevent e, CUstream s);
CUresult tent_cu_event_query(const tent_cu_api *a, CUcontext ctx, CUevent e);
CUresult tent_cu_event_sync(const tent_cu_api *a, CUcontext ctx, CUevent e);
CUresult tent_cu_event_destroy(const tent_cu_api *a, CUcontext ctx, CUevent e);

#ifdef __cplusplus
}
#endif
#endif /* TENT_CUDA_H */
