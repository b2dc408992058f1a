//go:build ignore

/*
 * libfakecuda.so: a fake CUDA driver on host memory, for tests on machines
 * without a GPU. Build:
 *
 *     gcc -shared -fPIC -O1 -o libfakecuda.so fakecuda.c -lpthread
 *
 * (the "//go:build ignore" line above keeps cgo from compiling this file
 * into the Go package next to it; for gcc it is a comment). See doc.go for
 * what is faked and how, the environment variables and the control API.
 *
 * Optional parts can be left out, to test how tent copes with old drivers:
 *   -DFAKECUDA_NO_VMM     no cuMemCreate & co.
 *   -DFAKECUDA_NO_RETAIN  no cuMemRetainAllocationHandle
 *   -DFAKECUDA_NO_HOSTFN  no cuLaunchHostFunc
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fakecuda.h"

#define EXPORT __attribute__((visibility("default")))
#define MAYBE_UNUSED __attribute__((unused))

/* ---- the driver ABI, declared independently of tent's tent_cuda.h ---- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void (*CUhostFn)(void *);

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

typedef struct {
	int type;
	int id;
} CUmemLocation;

typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

typedef struct {
	char bytes[16];
} CUuuid;

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");

#define HT_FD 0x1
#define HT_FABRIC 0x8
#define MEMTYPE_DEVICE 2

/* ---- state ---- */

#define MAXDEV 16
#define MAXFAULTS 32
#define MAGIC_STREAM 0x5354524dU
#define MAGIC_EVENT 0x4556454eU
#define MAGIC_CTX 0x43545821U

struct fake_ctx {
	unsigned magic;
	int dev;
	int refs;
};

struct alloc {
	unsigned long long id;
	int fd;
	size_t size;
	int dev;
	int types;
	int handle_refs;
	int map_refs;
	struct alloc *next;
};

struct resv {
	CUdeviceptr addr;
	size_t size;
	struct resv *next;
};

struct mapping {
	CUdeviceptr addr;
	size_t size;
	size_t offset;
	int prot;
	struct alloc *a;
	struct mapping *next;
};

struct memblk {
	CUdeviceptr addr;
	size_t size;
	int dev;
	struct memblk *next;
};

struct fake_stream {
	unsigned magic;
	int dev;
	struct fake_stream *next;
};

struct fake_event {
	unsigned magic;
	int dev;
	int recorded;
	struct fake_event *next;
};

struct fault {
	char name[64];
	int skip;
	int times;
	int err;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ndev = 2;
static size_t gran = 2u << 20;
static int fabric_enabled;
static int driver_version = 12080;
MAYBE_UNUSED static unsigned long long next_id = 1;

static struct fake_ctx ctxs[MAXDEV];
static __thread struct fake_ctx *cur;

static struct alloc *allocs;
static struct resv *resvs;
static struct mapping *maps;
static struct memblk *blks;
static struct fake_stream *streams;
static struct fake_event *events;
static struct fault faults[MAXFAULTS];
static fakecuda_counters_t cnt;

#define HANDLE_BASE 0xfa4e000000000000ULL

static void lock(void) { pthread_mutex_lock(&mu); }
static void unlock(void) { pthread_mutex_unlock(&mu); }

/* ---- configuration from the environment ---- */

static unsigned long long parse_size(const char *s) {
	char *end = NULL;
	unsigned long long v = strtoull(s, &end, 0);
	if (end != NULL) {
		if (*end == 'k' || *end == 'K') v <<= 10;
		else if (*end == 'm' || *end == 'M') v <<= 20;
		else if (*end == 'g' || *end == 'G') v <<= 30;
	}
	return v;
}

static int valid_gran(unsigned long long g) {
	return g >= 4096 && (g & (g - 1)) == 0;
}

static void norm_name(const char *in, char *out, size_t n) {
	snprintf(out, n, "%s", in);
	size_t l = strlen(out);
	if (l > 3 && strcmp(out + l - 3, "_v2") == 0) out[l - 3] = 0;
}

static int add_fault(const char *fn, int nth, int times, int err) {
	if (fn == NULL || nth < 1 || times < 1) return -1;
	for (int i = 0; i < MAXFAULTS; i++) {
		if (faults[i].times > 0) continue;
		norm_name(fn, faults[i].name, sizeof faults[i].name);
		faults[i].skip = nth - 1;
		faults[i].times = times;
		faults[i].err = err;
		return 0;
	}
	return -1;
}

/* FAKECUDA_FAIL=fn:nth:err[:times][,fn:nth:err[:times]...] */
static void parse_fail_env(const char *s) {
	char *copy = strdup(s), *save = NULL;
	if (copy == NULL) return;
	for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		char name[64];
		int nth = 0, err = 0, times = 1;
		int n = sscanf(tok, " %63[^:]:%d:%d:%d", name, &nth, &err, &times);
		if (n >= 3) add_fault(name, nth, n == 4 ? times : 1, err);
		else fprintf(stderr, "fakecuda: ignoring FAKECUDA_FAIL entry %s\n", tok);
	}
	free(copy);
}

__attribute__((constructor)) static void fake_init_env(void) {
	const char *s;
	if ((s = getenv("FAKECUDA_DEVICES")) != NULL && *s) {
		int n = atoi(s);
		if (n >= 0 && n <= MAXDEV) ndev = n;
	}
	if ((s = getenv("FAKECUDA_GRANULARITY")) != NULL && *s) {
		unsigned long long g = parse_size(s);
		if (valid_gran(g)) gran = (size_t)g;
	}
	if ((s = getenv("FAKECUDA_FABRIC")) != NULL && *s) fabric_enabled = atoi(s) != 0;
	if ((s = getenv("FAKECUDA_DRIVER_VERSION")) != NULL && *s) driver_version = atoi(s);
	if ((s = getenv("FAKECUDA_FAIL")) != NULL && *s) parse_fail_env(s);
	for (int i = 0; i < MAXDEV; i++) {
		ctxs[i].magic = MAGIC_CTX;
		ctxs[i].dev = i;
	}
}

/* ---- fault injection and call entry ---- */

static int fault_check(const char *fn) {
	char name[64];
	norm_name(fn, name, sizeof name);
	int fire = 0;
	for (int i = 0; i < MAXFAULTS; i++) {
		struct fault *f = &faults[i];
		if (f->times <= 0 || strcmp(f->name, name) != 0) continue;
		if (f->skip > 0) {
			f->skip--;
			continue;
		}
		f->times--;
		if (fire == 0) {
			fire = f->err;
			cnt.failures++;
		}
	}
	return fire;
}

/* ENTER takes the lock; every return after it goes through OUT. */
#define ENTER(name)                                                     \
	lock();                                                         \
	cnt.calls++;                                                    \
	{                                                               \
		int fe_ = fault_check(name);                            \
		if (fe_ != 0) {                                         \
			unlock();                                       \
			return fe_;                                     \
		}                                                       \
	}                                                               \
	if (!initialized) {                                             \
		unlock();                                               \
		return CUDA_ERROR_NOT_INITIALIZED;                      \
	}
#define OUT(r)             \
	do {               \
		unlock();  \
		return (r); \
	} while (0)

static int ctx_ok(void) { return cur != NULL && cur->refs > 0; }
#define NEED_CTX()                                         \
	do {                                               \
		if (!ctx_ok()) OUT(CUDA_ERROR_INVALID_CONTEXT); \
	} while (0)

static int dev_ok(int d) { return d >= 0 && d < ndev; }

/* ---- lookups (lock held) ---- */

MAYBE_UNUSED static struct alloc *find_alloc(CUmemGenericAllocationHandle h) {
	if ((h & 0xffff000000000000ULL) != HANDLE_BASE) return NULL;
	unsigned long long id = h & ~0xffff000000000000ULL;
	for (struct alloc *a = allocs; a; a = a->next)
		if (a->id == id) return a;
	return NULL;
}

MAYBE_UNUSED static CUmemGenericAllocationHandle handle_of(struct alloc *a) { return HANDLE_BASE | a->id; }

MAYBE_UNUSED static struct resv *resv_containing(CUdeviceptr p, size_t n) {
	for (struct resv *r = resvs; r; r = r->next)
		if (p >= r->addr && p + n <= r->addr + r->size && p + n >= p) return r;
	return NULL;
}

static struct resv *resv_touching(CUdeviceptr p) {
	for (struct resv *r = resvs; r; r = r->next)
		if (p >= r->addr && p < r->addr + r->size) return r;
	return NULL;
}

static struct mapping *map_containing(CUdeviceptr p) {
	for (struct mapping *m = maps; m; m = m->next)
		if (p >= m->addr && p < m->addr + m->size) return m;
	return NULL;
}

static struct memblk *blk_containing(CUdeviceptr p) {
	for (struct memblk *b = blks; b; b = b->next)
		if (p >= b->addr && p < b->addr + b->size) return b;
	return NULL;
}

MAYBE_UNUSED static int map_overlaps(CUdeviceptr p, size_t n) {
	for (struct mapping *m = maps; m; m = m->next)
		if (p < m->addr + m->size && m->addr < p + n) return 1;
	return 0;
}

static struct fake_stream *find_stream(void *s) {
	for (struct fake_stream *x = streams; x; x = x->next)
		if ((void *)x == s) return x;
	return NULL;
}

static struct fake_event *find_event(void *e) {
	for (struct fake_event *x = events; x; x = x->next)
		if ((void *)x == e) return x;
	return NULL;
}

MAYBE_UNUSED static void free_alloc_if_unused(struct alloc *a) {
	if (a->handle_refs > 0 || a->map_refs > 0) return;
	for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	}
	close(a->fd);
	cnt.fds--;
	cnt.allocations--;
	free(a);
}

/*
 * check_range: may the fake touch [p, p+n)? Device memory must be wholly
 * inside accessible mappings (prot >= want) or inside one cuMemAlloc block.
 * Returns 1 for device memory, 0 for host memory, -1 for an invalid range.
 */
static int check_range(CUdeviceptr p, size_t n, int want) {
	if (n == 0) return blk_containing(p) || map_containing(p) ? 1 : 0;
	if (p + n < p) return -1;
	struct memblk *b = blk_containing(p);
	if (b != NULL) return p + n <= b->addr + b->size ? 1 : -1;
	if (resv_touching(p) == NULL && resv_touching(p + n - 1) == NULL) {
		/* not a reserved range: host memory, unless a reservation lies inside */
		for (struct resv *r = resvs; r; r = r->next)
			if (r->addr < p + n && p < r->addr + r->size) return -1;
		return 0;
	}
	CUdeviceptr q = p;
	while (q < p + n) {
		struct mapping *m = map_containing(q);
		if (m == NULL || (m->prot & want) != want) return -1;
		q = m->addr + m->size;
	}
	return 1;
}

#define PROT_R 1
#define PROT_W 2

/* ---- control API ---- */

EXPORT void fakecuda_counters(fakecuda_counters_t *out) {
	lock();
	*out = cnt;
	unlock();
}

EXPORT int fakecuda_fail_times(const char *fn, int nth, int times, int cuda_error) {
	lock();
	int r = add_fault(fn, nth, times, cuda_error);
	unlock();
	return r;
}

EXPORT int fakecuda_fail(const char *fn, int nth, int cuda_error) { return fakecuda_fail_times(fn, nth, 1, cuda_error); }

EXPORT void fakecuda_clear_failures(void) {
	lock();
	memset(faults, 0, sizeof faults);
	unlock();
}

EXPORT void fakecuda_config(int devices, unsigned long long granularity, int fabric) {
	lock();
	if (devices >= 0 && devices <= MAXDEV) ndev = devices;
	if (granularity != 0 && valid_gran(granularity)) gran = (size_t)granularity;
	if (fabric >= 0) fabric_enabled = fabric != 0;
	unlock();
}

EXPORT void fakecuda_reset(void) {
	lock();
	while (maps) {
		struct mapping *m = maps;
		maps = m->next;
		munmap((void *)m->addr, m->size);
		free(m);
	}
	while (resvs) {
		struct resv *r = resvs;
		resvs = r->next;
		munmap((void *)r->addr, r->size);
		free(r);
	}
	while (allocs) {
		struct alloc *a = allocs;
		allocs = a->next;
		close(a->fd);
		free(a);
	}
	while (blks) {
		struct memblk *b = blks;
		blks = b->next;
		munmap((void *)b->addr, b->size);
		free(b);
	}
	while (streams) {
		struct fake_stream *s = streams;
		streams = s->next;
		s->magic = 0;
		free(s);
	}
	while (events) {
		struct fake_event *e = events;
		events = e->next;
		e->magic = 0;
		free(e);
	}
	for (int i = 0; i < MAXDEV; i++) ctxs[i].refs = 0;
	memset(faults, 0, sizeof faults);
	memset(&cnt, 0, sizeof cnt);
	unlock();
}

EXPORT void fakecuda_describe(char *buf, int len) {
	if (buf == NULL || len <= 0) return;
	buf[0] = 0;
	lock();
	int off = 0;
#define APP(...)                                                                     \
	do {                                                                         \
		if (off < len) {                                                     \
			int w_ = snprintf(buf + off, (size_t)(len - off), __VA_ARGS__); \
			if (w_ > 0) off += w_;                                       \
		}                                                                    \
	} while (0)
	for (struct alloc *a = allocs; a; a = a->next)
		APP("allocation %#llx: device %d, %zu bytes, fd %d, handle refs %d, mappings %d\n", handle_of(a), a->dev,
		    a->size, a->fd, a->handle_refs, a->map_refs);
	for (struct resv *r = resvs; r; r = r->next) APP("reservation %#llx+%zu\n", r->addr, r->size);
	for (struct mapping *m = maps; m; m = m->next)
		APP("mapping %#llx+%zu of %#llx, prot %d\n", m->addr, m->size, handle_of(m->a), m->prot);
	for (struct memblk *b = blks; b; b = b->next) APP("cuMemAlloc block %#llx+%zu on device %d\n", b->addr, b->size, b->dev);
	for (struct fake_stream *s = streams; s; s = s->next) APP("stream %p on device %d\n", (void *)s, s->dev);
	for (struct fake_event *e = events; e; e = e->next) APP("event %p on device %d\n", (void *)e, e->dev);
	for (int i = 0; i < ndev; i++)
		if (ctxs[i].refs) APP("primary context of device %d: %d retains\n", i, ctxs[i].refs);
#undef APP
	unlock();
}

/* ---- errors ---- */

static const struct {
	int code;
	const char *name;
	const char *text;
} errtab[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {909, "CUDA_ERROR_TIMEOUT", "timeout"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult e, const char **p) {
	if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
		if (errtab[i].code == e) {
			*p = errtab[i].name;
			return CUDA_SUCCESS;
		}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **p) {
	if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
		if (errtab[i].code == e) {
			*p = errtab[i].text;
			return CUDA_SUCCESS;
		}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---- initialization and devices ---- */

EXPORT CUresult cuInit(unsigned int flags) {
	lock();
	cnt.calls++;
	int fe = fault_check("cuInit");
	if (fe) OUT(fe);
	if (flags != 0) OUT(CUDA_ERROR_INVALID_VALUE);
	if (ndev == 0) OUT(CUDA_ERROR_NO_DEVICE);
	initialized = 1;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int *v) {
	lock();
	cnt.calls++;
	int fe = fault_check("cuDriverGetVersion");
	if (fe) OUT(fe);
	if (v == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	*v = driver_version;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetCount(int *n) {
	ENTER("cuDeviceGetCount");
	if (n == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	*n = ndev;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	ENTER("cuDeviceGet");
	if (d == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(ordinal)) OUT(CUDA_ERROR_INVALID_DEVICE);
	*d = ordinal;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	ENTER("cuDeviceGetAttribute");
	if (v == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	switch (attr) {
	case 16: *v = 132; break;      /* MULTIPROCESSOR_COUNT */
	case 33: *v = 0x1a + d; break; /* PCI_BUS_ID */
	case 34: *v = 0; break;        /* PCI_DEVICE_ID */
	case 41: *v = 1; break;        /* UNIFIED_ADDRESSING */
	case 50: *v = 0; break;        /* PCI_DOMAIN_ID */
	case 75: *v = 9; break;        /* COMPUTE_CAPABILITY_MAJOR */
	case 76: *v = 0; break;        /* COMPUTE_CAPABILITY_MINOR */
#ifndef FAKECUDA_NO_VMM
	case 102: *v = 1; break; /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
	case 103: *v = 1; break; /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
	case 110: *v = 1; break; /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
	case 128: *v = fabric_enabled; break; /* HANDLE_TYPE_FABRIC_SUPPORTED */
#else
	case 102: *v = 0; break;
	case 103: *v = 0; break;
	case 110: *v = 0; break;
	case 128: *v = 0; break;
#endif
	case 116: *v = 1; break;  /* GPU_DIRECT_RDMA_SUPPORTED */
	case 124: *v = 1; break;  /* DMA_BUF_SUPPORTED */
	case 131: *v = -1; break; /* NUMA_ID */
	case 134: *v = 0; break;  /* HOST_NUMA_ID */
	default: OUT(CUDA_ERROR_INVALID_VALUE);
	}
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetName(char *buf, int len, CUdevice d) {
	ENTER("cuDeviceGetName");
	if (buf == NULL || len <= 0) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	snprintf(buf, (size_t)len, "Fake CUDA Device %d", d);
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d) {
	ENTER("cuDeviceGetPCIBusId");
	if (buf == NULL || len <= 0) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	snprintf(buf, (size_t)len, "0000:%02X:00.0", 0x1a + d);
	OUT(CUDA_SUCCESS);
}

static CUresult device_uuid(CUuuid *u, CUdevice d, const char *fn) {
	ENTER(fn);
	if (u == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	for (int i = 0; i < 16; i++) u->bytes[i] = (char)(0xf0 + i);
	u->bytes[15] = (char)d;
	OUT(CUDA_SUCCESS);
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return device_uuid(u, d, "cuDeviceGetUuid"); }
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return device_uuid(u, d, "cuDeviceGetUuid_v2"); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	ENTER("cuDeviceTotalMem_v2");
	if (bytes == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	*bytes = 80ULL << 30;
	OUT(CUDA_SUCCESS);
}

/* ---- contexts ---- */

EXPORT CUresult cuDevicePrimaryCtxRetain(void **pctx, CUdevice d) {
	ENTER("cuDevicePrimaryCtxRetain");
	if (pctx == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	ctxs[d].refs++;
	cnt.contexts++;
	*pctx = &ctxs[d];
	OUT(CUDA_SUCCESS);
}

static CUresult primary_release(CUdevice d, const char *fn) {
	ENTER(fn);
	if (!dev_ok(d)) OUT(CUDA_ERROR_INVALID_DEVICE);
	if (ctxs[d].refs <= 0) OUT(CUDA_ERROR_INVALID_CONTEXT);
	ctxs[d].refs--;
	cnt.contexts--;
	OUT(CUDA_SUCCESS);
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return primary_release(d, "cuDevicePrimaryCtxRelease_v2"); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return primary_release(d, "cuDevicePrimaryCtxRelease"); }

EXPORT CUresult cuCtxSetCurrent(void *ctx) {
	ENTER("cuCtxSetCurrent");
	if (ctx == NULL) {
		cur = NULL;
		OUT(CUDA_SUCCESS);
	}
	struct fake_ctx *c = ctx;
	if (c < &ctxs[0] || c >= &ctxs[MAXDEV] || c->magic != MAGIC_CTX || c->refs <= 0) OUT(CUDA_ERROR_INVALID_CONTEXT);
	cur = c;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetCurrent(void **pctx) {
	ENTER("cuCtxGetCurrent");
	if (pctx == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	*pctx = cur;
	OUT(CUDA_SUCCESS);
}

/* ---- pointer attributes ---- */

struct ptr_desc {
	int known;
	int dev;
	CUdeviceptr start;
	size_t size;
	int allowed;
	int legacy;
	CUdeviceptr map_base;
	size_t map_size;
	int prot;
};

static struct ptr_desc describe_ptr(CUdeviceptr p) {
	struct ptr_desc d;
	memset(&d, 0, sizeof d);
	struct mapping *m = map_containing(p);
	if (m != NULL) {
		d.known = 1;
		d.dev = m->a->dev;
		d.start = m->addr;
		d.size = m->size;
		d.allowed = m->a->types;
		d.legacy = 0;
		d.map_base = m->addr;
		d.map_size = m->size;
		d.prot = m->prot;
		return d;
	}
	struct memblk *b = blk_containing(p);
	if (b != NULL) {
		d.known = 1;
		d.dev = b->dev;
		d.start = b->addr;
		d.size = b->size;
		d.legacy = 1;
		d.map_base = b->addr;
		d.map_size = b->size;
		d.prot = PROT_R | PROT_W;
	}
	return d;
}

/* write_attr stores one attribute with the width the driver uses for it. */
static CUresult write_attr(void *data, int attr, const struct ptr_desc *d) {
	switch (attr) {
	case 1: *(void **)data = d->known ? (void *)&ctxs[d->dev] : NULL; break; /* CONTEXT */
	case 2: *(unsigned int *)data = d->known ? MEMTYPE_DEVICE : 0; break;  /* MEMORY_TYPE */
	case 3: *(CUdeviceptr *)data = d->known ? d->start : 0; break;         /* DEVICE_POINTER (approximate) */
	case 4: *(void **)data = NULL; break;                                   /* HOST_POINTER */
	case 8: *(unsigned int *)data = 0; break;                               /* IS_MANAGED */
	case 9: *(int *)data = d->known ? d->dev : -2; break;                   /* DEVICE_ORDINAL */
	case 10: *(int *)data = d->legacy; break;                               /* IS_LEGACY_CUDA_IPC_CAPABLE */
	case 11: *(CUdeviceptr *)data = d->start; break;                        /* RANGE_START_ADDR */
	case 12: *(size_t *)data = d->size; break;                              /* RANGE_SIZE */
	case 13: *(int *)data = d->known; break;                                /* MAPPED */
	case 14: *(unsigned long long *)data = (unsigned long long)d->allowed; break; /* ALLOWED_HANDLE_TYPES */
	case 15: *(int *)data = d->known; break;                                /* IS_GPU_DIRECT_RDMA_CAPABLE */
	case 16: *(int *)data = d->prot == (PROT_R | PROT_W) ? 3 : d->prot == PROT_R ? 1 : 0; break; /* ACCESS_FLAGS */
	case 18: *(size_t *)data = d->map_size; break;                          /* MAPPING_SIZE */
	case 19: *(CUdeviceptr *)data = d->map_base; break;                     /* MAPPING_BASE_ADDR */
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	ENTER("cuPointerGetAttribute");
	if (data == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	struct ptr_desc d = describe_ptr(p);
	if (!d.known) OUT(CUDA_ERROR_INVALID_VALUE);
	OUT(write_attr(data, attr, &d));
}

EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p) {
	ENTER("cuPointerGetAttributes");
	if (n == 0 || attrs == NULL || data == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	struct ptr_desc d = describe_ptr(p);
	for (unsigned int i = 0; i < n; i++) {
		if (data[i] == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
		CUresult r = write_attr(data[i], attrs[i], &d);
		if (r != CUDA_SUCCESS) OUT(r);
	}
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	ENTER("cuMemGetAddressRange_v2");
	struct ptr_desc d = describe_ptr(p);
	if (!d.known) OUT(CUDA_ERROR_NOT_FOUND);
	if (base) *base = d.start;
	if (size) *size = d.size;
	OUT(CUDA_SUCCESS);
}

/* cuMemGetHandleForAddressRange (CUDA 11.7+) with
 * CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: a new memfd named
 * "fakecuda-dmabuf:<addr>:<size>" (hex) stands for the range; the fake
 * libibverbs reads the range back from the name in ibv_reg_dmabuf_mr. The
 * range must be page aligned and lie in one mapping with read access or
 * one cuMemAlloc block. The caller owns (closes) the fd. */
EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size, int type,
					      unsigned long long flags) {
	ENTER("cuMemGetHandleForAddressRange");
	unsigned long long ps = (unsigned long long)sysconf(_SC_PAGESIZE);
	if (handle == NULL || type != 1 || flags != 0 || size == 0 || p % ps != 0 || size % ps != 0)
		OUT(CUDA_ERROR_INVALID_VALUE);
	struct ptr_desc d = describe_ptr(p);
	if (!d.known || !(d.prot & PROT_R) || p + size > d.map_base + d.map_size) OUT(CUDA_ERROR_INVALID_VALUE);
	char name[96];
	snprintf(name, sizeof name, "fakecuda-dmabuf:%llx:%zx", p, size);
	int fd = (int)syscall(SYS_memfd_create, name, 1U /* MFD_CLOEXEC */);
	if (fd < 0) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	*(int *)handle = fd;
	cnt.exported_fds++;
	OUT(CUDA_SUCCESS);
}

/* The device p is memory of (a mapping or a cuMemAlloc block), else -1:
 * how the fake libibverbs tells GPU memory handed to ibv_reg_mr. */
EXPORT int fakecuda_device_of(unsigned long long p) {
	lock();
	struct ptr_desc d = describe_ptr(p);
	unlock();
	return d.known ? d.dev : -1;
}

/* ---- virtual memory management ---- */

#ifndef FAKECUDA_NO_VMM

static int prop_ok(const CUmemAllocationProp *prop) {
	return prop != NULL && prop->type == 1 && prop->location.type == 1;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
	ENTER("cuMemGetAllocationGranularity");
	if (g == NULL || !prop_ok(prop) || (option != 0 && option != 1)) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(prop->location.id)) OUT(CUDA_ERROR_INVALID_DEVICE);
	*g = gran;
	OUT(CUDA_SUCCESS);
}

static int new_memfd(unsigned long long id, int dev, int types, size_t size) {
	char name[96];
	snprintf(name, sizeof name, "fakecuda-%d-%llu-d%d-t%d", (int)getpid(), id, dev, types);
	int fd = (int)syscall(SYS_memfd_create, name, 1U /* MFD_CLOEXEC */);
	if (fd < 0) return -1;
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static struct alloc *add_alloc(int fd, size_t size, int dev, int types) {
	struct alloc *a = calloc(1, sizeof *a);
	if (a == NULL) return NULL;
	a->id = next_id++;
	a->fd = fd;
	a->size = size;
	a->dev = dev;
	a->types = types;
	a->handle_refs = 1;
	a->next = allocs;
	allocs = a;
	cnt.handles++;
	cnt.allocations++;
	cnt.fds++;
	return a;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
	ENTER("cuMemCreate");
	if (h == NULL || !prop_ok(prop) || flags != 0 || size == 0 || size % gran != 0) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!dev_ok(prop->location.id)) OUT(CUDA_ERROR_INVALID_DEVICE);
	int types = prop->requestedHandleTypes;
	if (types & ~(HT_FD | HT_FABRIC)) OUT(CUDA_ERROR_NOT_SUPPORTED);
	if ((types & HT_FABRIC) && !fabric_enabled) OUT(CUDA_ERROR_NOT_SUPPORTED);
	unsigned long long id = next_id;
	int fd = new_memfd(id, prop->location.id, types, size);
	if (fd < 0) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	struct alloc *a = add_alloc(fd, size, prop->location.id, types);
	if (a == NULL) {
		close(fd);
		OUT(CUDA_ERROR_OUT_OF_MEMORY);
	}
	*h = handle_of(a);
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	ENTER("cuMemRelease");
	struct alloc *a = find_alloc(h);
	if (a == NULL || a->handle_refs <= 0) OUT(CUDA_ERROR_INVALID_VALUE);
	a->handle_refs--;
	cnt.handles--;
	free_alloc_if_unused(a);
	OUT(CUDA_SUCCESS);
}

/* The 64 bytes of a fake fabric handle. */
struct fake_fabric {
	char magic[8];
	int pid;
	int fd;
	unsigned long long id;
	unsigned long long size;
	int dev;
	int types;
	char pad[24];
};
_Static_assert(sizeof(struct fake_fabric) == 64, "fake fabric handle is 64 bytes");

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                             unsigned long long flags) {
	ENTER("cuMemExportToShareableHandle");
	struct alloc *a = find_alloc(h);
	if (out == NULL || flags != 0 || a == NULL || a->handle_refs <= 0) OUT(CUDA_ERROR_INVALID_VALUE);
	if (type == HT_FD) {
		if (!(a->types & HT_FD)) OUT(CUDA_ERROR_INVALID_VALUE);
		int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0) OUT(CUDA_ERROR_OUT_OF_MEMORY);
		*(int *)out = fd;
		cnt.exported_fds++;
		OUT(CUDA_SUCCESS);
	}
	if (type == HT_FABRIC) {
		if (!fabric_enabled) OUT(CUDA_ERROR_NOT_SUPPORTED);
		if (!(a->types & HT_FABRIC)) OUT(CUDA_ERROR_INVALID_VALUE);
		struct fake_fabric f;
		memset(&f, 0, sizeof f);
		memcpy(f.magic, "FAKEFAB1", 8);
		f.pid = (int)getpid();
		f.fd = a->fd;
		f.id = a->id;
		f.size = a->size;
		f.dev = a->dev;
		f.types = a->types;
		memcpy(out, &f, sizeof f);
		OUT(CUDA_SUCCESS);
	}
	OUT(CUDA_ERROR_NOT_SUPPORTED);
}

/* memfd_info checks that fd is a fake allocation's memfd and reads it. */
static int memfd_info(int fd, int *dev, int *types, unsigned long long *id, size_t *size) {
	char path[64], link[256];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n <= 0) return -1;
	link[n] = 0;
	int pid;
	if (sscanf(link, "/memfd:fakecuda-%d-%llu-d%d-t%d", &pid, id, dev, types) != 4) return -1;
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size <= 0) return -1;
	*size = (size_t)st.st_size;
	return 0;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type) {
	ENTER("cuMemImportFromShareableHandle");
	if (h == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	int fd = -1;
	if (type == HT_FD) {
		int in = (int)(intptr_t)os_handle;
		if (in < 0 || fcntl(in, F_GETFD) < 0) OUT(CUDA_ERROR_INVALID_VALUE);
		fd = fcntl(in, F_DUPFD_CLOEXEC, 0);
		if (fd < 0) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	} else if (type == HT_FABRIC) {
		if (!fabric_enabled) OUT(CUDA_ERROR_NOT_SUPPORTED);
		if (os_handle == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
		struct fake_fabric f;
		memcpy(&f, os_handle, sizeof f);
		if (memcmp(f.magic, "FAKEFAB1", 8) != 0) OUT(CUDA_ERROR_INVALID_VALUE);
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/fd/%d", f.pid, f.fd);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0) OUT(CUDA_ERROR_INVALID_VALUE);
		int dev, types;
		unsigned long long id;
		size_t size;
		if (memfd_info(fd, &dev, &types, &id, &size) != 0 || id != f.id) {
			close(fd);
			OUT(CUDA_ERROR_INVALID_VALUE);
		}
	} else {
		OUT(CUDA_ERROR_NOT_SUPPORTED);
	}
	int dev, types;
	unsigned long long id;
	size_t size;
	if (memfd_info(fd, &dev, &types, &id, &size) != 0 || !dev_ok(dev)) {
		close(fd);
		OUT(CUDA_ERROR_INVALID_VALUE);
	}
	struct alloc *a = add_alloc(fd, size, dev, types);
	if (a == NULL) {
		close(fd);
		OUT(CUDA_ERROR_OUT_OF_MEMORY);
	}
	*h = handle_of(a);
	OUT(CUDA_SUCCESS);
}

#ifndef FAKECUDA_NO_RETAIN
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
	ENTER("cuMemRetainAllocationHandle");
	if (h == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	struct mapping *m = map_containing((CUdeviceptr)(uintptr_t)addr);
	if (m == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	m->a->handle_refs++;
	cnt.handles++;
	*h = handle_of(m->a);
	OUT(CUDA_SUCCESS);
}
#endif

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
	ENTER("cuMemAddressReserve");
	(void)addr; /* a hint only */
	if (align == 0) align = gran;
	if (p == NULL || flags != 0 || size == 0 || size % gran != 0 || (align & (align - 1)) != 0 || align % gran != 0)
		OUT(CUDA_ERROR_INVALID_VALUE);
	size_t total = size + align;
	void *raw = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	uintptr_t start = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
	if (start > (uintptr_t)raw) munmap(raw, start - (uintptr_t)raw);
	uintptr_t end = (uintptr_t)raw + total;
	if (end > start + size) munmap((void *)(start + size), end - (start + size));
	struct resv *r = calloc(1, sizeof *r);
	if (r == NULL) {
		munmap((void *)start, size);
		OUT(CUDA_ERROR_OUT_OF_MEMORY);
	}
	r->addr = start;
	r->size = size;
	r->next = resvs;
	resvs = r;
	cnt.reservations++;
	*p = start;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
	ENTER("cuMemAddressFree");
	struct resv **pp = &resvs;
	while (*pp && !((*pp)->addr == p && (*pp)->size == size)) pp = &(*pp)->next;
	if (*pp == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	/* stricter than needed: tent must unmap before freeing the range */
	if (map_overlaps(p, size)) OUT(CUDA_ERROR_INVALID_VALUE);
	struct resv *r = *pp;
	*pp = r->next;
	munmap((void *)r->addr, r->size);
	free(r);
	cnt.reservations--;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
	ENTER("cuMemMap");
	struct alloc *a = find_alloc(h);
	if (a == NULL || a->handle_refs <= 0 || flags != 0 || size == 0 || p % gran != 0 || size % gran != 0 ||
	    offset % gran != 0 || offset + size > a->size || offset + size < offset)
		OUT(CUDA_ERROR_INVALID_VALUE);
	if (resv_containing(p, size) == NULL || map_overlaps(p, size)) OUT(CUDA_ERROR_INVALID_VALUE);
	struct mapping *m = calloc(1, sizeof *m);
	if (m == NULL) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	void *q = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset);
	if (q == MAP_FAILED) {
		free(m);
		OUT(CUDA_ERROR_OUT_OF_MEMORY);
	}
	m->addr = p;
	m->size = size;
	m->offset = offset;
	m->a = a;
	m->next = maps;
	maps = m;
	a->map_refs++;
	cnt.mappings++;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	ENTER("cuMemUnmap");
	if (size == 0) OUT(CUDA_ERROR_INVALID_VALUE);
	/* the range must be exactly a run of whole, adjacent mappings */
	CUdeviceptr q = p;
	while (q < p + size) {
		struct mapping *m = map_containing(q);
		if (m == NULL || m->addr != q || m->addr + m->size > p + size) OUT(CUDA_ERROR_INVALID_VALUE);
		q = m->addr + m->size;
	}
	q = p;
	while (q < p + size) {
		struct mapping *m = map_containing(q);
		struct mapping **pp = &maps;
		while (*pp != m) pp = &(*pp)->next;
		*pp = m->next;
		mmap((void *)m->addr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		q = m->addr + m->size;
		struct alloc *a = m->a;
		free(m);
		a->map_refs--;
		cnt.mappings--;
		free_alloc_if_unused(a);
	}
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
	ENTER("cuMemSetAccess");
	if (desc == NULL || count == 0 || size == 0) OUT(CUDA_ERROR_INVALID_VALUE);
	int prot = 0;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != 1) OUT(CUDA_ERROR_INVALID_VALUE);
		if (!dev_ok(desc[i].location.id)) OUT(CUDA_ERROR_INVALID_DEVICE);
		switch (desc[i].flags) {
		case 0: break;
		case 1: prot |= PROT_R; break;
		case 3: prot |= PROT_R | PROT_W; break;
		default: OUT(CUDA_ERROR_INVALID_VALUE);
		}
	}
	/* the whole range must be mapped */
	CUdeviceptr q = p;
	while (q < p + size) {
		struct mapping *m = map_containing(q);
		if (m == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
		q = m->addr + m->size;
	}
	int mp = (prot & PROT_W) ? PROT_READ | PROT_WRITE : (prot & PROT_R) ? PROT_READ : PROT_NONE;
	if (mprotect((void *)p, size, mp) != 0) OUT(CUDA_ERROR_INVALID_VALUE);
	q = p;
	while (q < p + size) {
		struct mapping *m = map_containing(q);
		m->prot = prot;
		q = m->addr + m->size;
	}
	OUT(CUDA_SUCCESS);
}

#endif /* FAKECUDA_NO_VMM */

/* ---- plain device memory and copies ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
	ENTER("cuMemAlloc_v2");
	NEED_CTX();
	if (p == NULL || size == 0) OUT(CUDA_ERROR_INVALID_VALUE);
	void *q = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	struct memblk *b = calloc(1, sizeof *b);
	if (b == NULL) {
		munmap(q, size);
		OUT(CUDA_ERROR_OUT_OF_MEMORY);
	}
	b->addr = (CUdeviceptr)(uintptr_t)q;
	b->size = size;
	b->dev = cur->dev;
	b->next = blks;
	blks = b;
	cnt.mem_allocs++;
	*p = b->addr;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
	ENTER("cuMemFree_v2");
	NEED_CTX();
	struct memblk **pp = &blks;
	while (*pp && (*pp)->addr != p) pp = &(*pp)->next;
	if (*pp == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	struct memblk *b = *pp;
	*pp = b->next;
	munmap((void *)b->addr, b->size);
	free(b);
	cnt.mem_allocs--;
	OUT(CUDA_SUCCESS);
}

/* copy checks both ranges (need: 1 device, 0 host, -1 either) and copies. */
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n, int dst_need, int src_need) {
	int d = check_range(dst, n, PROT_R | PROT_W);
	int s = check_range(src, n, PROT_R);
	if (d < 0 || s < 0) return CUDA_ERROR_INVALID_VALUE;
	if ((dst_need >= 0 && d != dst_need) || (src_need >= 0 && s != src_need)) return CUDA_ERROR_INVALID_VALUE;
	if (n > 0 && (dst == 0 || src == 0)) return CUDA_ERROR_INVALID_VALUE;
	if (n > 0) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

static int stream_ok(void *s) {
	/* NULL, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) are implicit streams */
	return s == NULL || s == (void *)0x1 || s == (void *)0x2 || find_stream(s) != NULL;
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpy");
	NEED_CTX();
	OUT(copy(dst, src, n, -1, -1));
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	ENTER("cuMemcpyHtoD_v2");
	NEED_CTX();
	OUT(copy(dst, (CUdeviceptr)(uintptr_t)src, n, 1, 0));
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoH_v2");
	NEED_CTX();
	OUT(copy((CUdeviceptr)(uintptr_t)dst, src, n, 0, 1));
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoD_v2");
	NEED_CTX();
	OUT(copy(dst, src, n, 1, 1));
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
	ENTER("cuMemcpyAsync");
	NEED_CTX();
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(copy(dst, src, n, -1, -1));
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
	ENTER("cuMemcpyHtoDAsync_v2");
	NEED_CTX();
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(copy(dst, (CUdeviceptr)(uintptr_t)src, n, 1, 0));
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
	ENTER("cuMemcpyDtoHAsync_v2");
	NEED_CTX();
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(copy((CUdeviceptr)(uintptr_t)dst, src, n, 0, 1));
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
	ENTER("cuMemcpyDtoDAsync_v2");
	NEED_CTX();
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(copy(dst, src, n, 1, 1));
}

/* ---- streams and events ---- */

EXPORT CUresult cuStreamCreate(void **ps, unsigned int flags) {
	ENTER("cuStreamCreate");
	NEED_CTX();
	if (ps == NULL || flags > 1) OUT(CUDA_ERROR_INVALID_VALUE);
	struct fake_stream *s = calloc(1, sizeof *s);
	if (s == NULL) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	s->magic = MAGIC_STREAM;
	s->dev = cur->dev;
	s->next = streams;
	streams = s;
	cnt.streams++;
	*ps = s;
	OUT(CUDA_SUCCESS);
}

static CUresult stream_destroy(void *sp, const char *fn) {
	ENTER(fn);
	struct fake_stream **pp = &streams;
	while (*pp && (void *)*pp != sp) pp = &(*pp)->next;
	if (*pp == NULL) OUT(CUDA_ERROR_INVALID_HANDLE);
	struct fake_stream *s = *pp;
	*pp = s->next;
	s->magic = 0;
	free(s);
	cnt.streams--;
	OUT(CUDA_SUCCESS);
}
EXPORT CUresult cuStreamDestroy_v2(void *s) { return stream_destroy(s, "cuStreamDestroy_v2"); }
EXPORT CUresult cuStreamDestroy(void *s) { return stream_destroy(s, "cuStreamDestroy"); }

EXPORT CUresult cuStreamSynchronize(void *s) {
	ENTER("cuStreamSynchronize");
	if (s == NULL || s == (void *)0x1 || s == (void *)0x2) NEED_CTX();
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(CUDA_SUCCESS);
}

#ifndef FAKECUDA_NO_HOSTFN
EXPORT CUresult cuLaunchHostFunc(void *s, CUhostFn fn, void *user) {
	ENTER("cuLaunchHostFunc");
	if (fn == NULL) OUT(CUDA_ERROR_INVALID_VALUE);
	if (!stream_ok(s)) OUT(CUDA_ERROR_INVALID_HANDLE);
	unlock();
	/* all queued work is already done: run it now, without the lock */
	fn(user);
	return CUDA_SUCCESS;
}
#endif

EXPORT CUresult cuEventCreate(void **pe, unsigned int flags) {
	ENTER("cuEventCreate");
	NEED_CTX();
	if (pe == NULL || (flags & ~0x7U) != 0) OUT(CUDA_ERROR_INVALID_VALUE);
	struct fake_event *e = calloc(1, sizeof *e);
	if (e == NULL) OUT(CUDA_ERROR_OUT_OF_MEMORY);
	e->magic = MAGIC_EVENT;
	e->dev = cur->dev;
	e->next = events;
	events = e;
	cnt.events++;
	*pe = e;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuEventRecord(void *ep, void *sp) {
	ENTER("cuEventRecord");
	struct fake_event *e = find_event(ep);
	if (e == NULL || !stream_ok(sp)) OUT(CUDA_ERROR_INVALID_HANDLE);
	struct fake_stream *s = find_stream(sp);
	if (s != NULL && s->dev != e->dev) OUT(CUDA_ERROR_INVALID_HANDLE);
	if (s == NULL) NEED_CTX();
	e->recorded = 1;
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuEventQuery(void *ep) {
	ENTER("cuEventQuery");
	if (find_event(ep) == NULL) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(CUDA_SUCCESS);
}

EXPORT CUresult cuEventSynchronize(void *ep) {
	ENTER("cuEventSynchronize");
	if (find_event(ep) == NULL) OUT(CUDA_ERROR_INVALID_HANDLE);
	OUT(CUDA_SUCCESS);
}

static CUresult event_destroy(void *ep, const char *fn) {
	ENTER(fn);
	struct fake_event **pp = &events;
	while (*pp && (void *)*pp != ep) pp = &(*pp)->next;
	if (*pp == NULL) OUT(CUDA_ERROR_INVALID_HANDLE);
	struct fake_event *e = *pp;
	*pp = e->next;
	e->magic = 0;
	free(e);
	cnt.events--;
	OUT(CUDA_SUCCESS);
}
EXPORT CUresult cuEventDestroy_v2(void *e) { return event_destroy(e, "cuEventDestroy_v2"); }
EXPORT CUresult cuEventDestroy(void *e) { return event_destroy(e, "cuEventDestroy"); }
