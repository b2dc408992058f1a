package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;

// gpucheck_meminfo answers cuMemGetInfo for device ordinal in its primary
// context, all within this one call: retain the primary context, make it
// current, query, restore the thread's context, release. It returns 0, or
// a CUresult, or -1 when the library or a symbol is missing (err says).
static int gpucheck_meminfo(const char *lib, int ordinal, unsigned long long *freeb,
                            unsigned long long *total, char *err, int errlen) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(err, errlen, "dlopen %s failed", lib);
		return -1;
	}
	CUresult (*devGet)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
	CUresult (*retain)(CUcontext *, CUdevice) = (CUresult (*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
	CUresult (*release)(CUdevice) = (CUresult (*)(CUdevice))dlsym(h, "cuDevicePrimaryCtxRelease_v2");
	CUresult (*getCur)(CUcontext *) = (CUresult (*)(CUcontext *))dlsym(h, "cuCtxGetCurrent");
	CUresult (*setCur)(CUcontext) = (CUresult (*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
	CUresult (*memInfo)(unsigned long long *, unsigned long long *) =
		(CUresult (*)(unsigned long long *, unsigned long long *))dlsym(h, "cuMemGetInfo_v2");
	if (!devGet || !retain || !release || !getCur || !setCur || !memInfo) {
		snprintf(err, errlen, "%s lacks a symbol gpucheck needs", lib);
		dlclose(h);
		return -1;
	}
	CUdevice dev;
	CUcontext ctx, prev = NULL;
	CUresult r = devGet(&dev, ordinal);
	if (r == 0) r = retain(&ctx, dev);
	if (r != 0) {
		dlclose(h);
		return r;
	}
	getCur(&prev);
	r = setCur(ctx);
	if (r == 0) r = memInfo(freeb, total);
	setCur(prev);
	release(dev);
	dlclose(h); // the library stays loaded: tent holds it
	return r;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// memInfo is cuMemGetInfo of device dev: free and total bytes.
func memInfo(lib string, dev int) (free, total uint64, err error) {
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	var f, t C.ulonglong
	var buf [256]C.char
	r := C.gpucheck_meminfo(clib, C.int(dev), &f, &t, &buf[0], C.int(len(buf)))
	switch {
	case r == -1:
		return 0, 0, fmt.Errorf("%s", C.GoString(&buf[0]))
	case r != 0:
		return 0, 0, fmt.Errorf("cuMemGetInfo(device %d): CUresult %d", dev, int(r))
	}
	return uint64(f), uint64(t), nil
}
