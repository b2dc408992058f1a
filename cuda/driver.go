package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "tent_cuda.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

// DefaultLibrary is the driver library Default loads unless EnvDriver names
// another one.
const DefaultLibrary = "libcuda.so.1"

// EnvDriver is the environment variable that overrides the driver library
// path used by Default (tests point it at the fake driver).
const EnvDriver = "TENT_CUDA_DRIVER"

// Features tells which optional parts of the driver API the loaded library
// has. A missing optional symbol disables its feature; it never fails Load.
type Features struct {
	// VMM: cuMemCreate, cuMemMap and the rest of the virtual memory
	// management API, with POSIX file descriptor export and import.
	VMM bool `json:"vmm"`
	// RetainAllocationHandle: cuMemRetainAllocationHandle (CUDA 11.0+).
	RetainAllocationHandle bool `json:"retain_allocation_handle"`
	// Fabric: VMM and a driver of CUDA 12.3 or later, which knows
	// CU_MEM_HANDLE_TYPE_FABRIC. Each device must still report support
	// (DeviceInfo.Fabric), and the node must be part of an NVLink fabric.
	Fabric bool `json:"fabric"`
	// DMABuf: cuMemGetHandleForAddressRange (DMABufFD).
	DMABuf bool `json:"dmabuf"`
	// HostFunc: cuLaunchHostFunc (Stream.LaunchHostFunc).
	HostFunc bool `json:"host_func"`
	// PointerAttributes: cuPointerGetAttributes (the plural query).
	PointerAttributes bool `json:"pointer_attributes"`
	// UUID: cuDeviceGetUuid(_v2).
	UUID bool `json:"uuid"`
}

// Driver is a loaded CUDA driver library with cuInit done. It is safe for
// concurrent use. Drivers are cached per library path and never unloaded.
type Driver struct {
	path     string
	api      *C.tent_cu_api
	version  int
	devs     []C.CUdevice
	features Features

	mu     sync.Mutex // serializes primary context retain and Close
	ctxs   []atomic.Pointer[ctxRef]
	closed atomic.Bool
}

type ctxRef struct{ c C.CUcontext }

type loadResult struct {
	d   *Driver
	err error
}

var (
	loadMu sync.Mutex
	loaded = map[string]loadResult{}

	defMu   sync.Mutex
	defDone bool
	defRes  loadResult
)

// Load loads the driver library at path (a file name such as
// "libcuda.so.1" is searched for by the dynamic loader), resolves its entry
// points and calls cuInit. The result, failure included, is cached per path:
// a second Load of the same path returns the same Driver.
//
// A missing library is reported as status.Unsupported ("no CUDA driver (...
// not found): GPU features disabled"), and so is a driver that finds no GPU
// ("no GPU: ..."). Load never aborts the process.
func Load(path string) (*Driver, error) {
	if path == "" {
		path = DefaultLibrary
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	if r, ok := loaded[path]; ok {
		return r.d, r.err
	}
	d, err := load(path)
	loaded[path] = loadResult{d, err}
	return d, err
}

// Default returns the process's driver: Load of $TENT_CUDA_DRIVER, or of
// DefaultLibrary when that is unset. The first answer is cached.
func Default() (*Driver, error) {
	defMu.Lock()
	defer defMu.Unlock()
	if !defDone {
		path := os.Getenv(EnvDriver)
		if path == "" {
			path = DefaultLibrary
		}
		d, err := Load(path)
		defRes, defDone = loadResult{d, err}, true
	}
	return defRes.d, defRes.err
}

func load(path string) (*Driver, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var res C.tent_cu_load_result
	C.tent_cu_load(cpath, &res)
	if res.dl_failed != 0 {
		dlerr := C.GoString(&res.dlerr[0])
		if strings.Contains(dlerr, "No such file") || strings.Contains(dlerr, "cannot open shared object") {
			return nil, status.Errorf(status.Unsupported,
				"no CUDA driver (%s not found): GPU features disabled", path)
		}
		return nil, status.Errorf(status.Unsupported,
			"no CUDA driver (%s could not be loaded: %s): GPU features disabled", path, dlerr)
	}
	if res.api == nil {
		return nil, status.Errorf(status.Unsupported,
			"CUDA driver %s lacks %s (too old?): GPU features disabled", path, C.GoString(&res.missing[0]))
	}
	d := &Driver{path: path, api: res.api}
	if r := C.tent_cu_init(d.api); r != 0 {
		err := d.fail(r, "cuInit(0)")
		if Result(r) == ErrorNoDevice {
			return nil, status.Errorf(status.Unsupported, "no GPU: %w", err)
		}
		return nil, status.Errorf(status.Unsupported, "CUDA driver %s unusable: %w: GPU features disabled", path, err)
	}
	var v C.int
	if r := C.tent_cu_driver_version(d.api, &v); r != 0 {
		return nil, status.Errorf(status.Unsupported, "CUDA driver %s unusable: %w", path, d.fail(r, "cuDriverGetVersion"))
	}
	d.version = int(v)
	var n C.int
	if r := C.tent_cu_device_count(d.api, &n); r != 0 {
		err := d.fail(r, "cuDeviceGetCount")
		if Result(r) == ErrorNoDevice {
			return nil, status.Errorf(status.Unsupported, "no GPU: %w", err)
		}
		return nil, status.Errorf(status.Unsupported, "CUDA driver %s unusable: %w", path, err)
	}
	if n <= 0 {
		return nil, status.Errorf(status.Unsupported, "no GPU: the CUDA driver %s sees no device", path)
	}
	d.devs = make([]C.CUdevice, int(n))
	for i := range d.devs {
		if r := C.tent_cu_device_get(d.api, C.int(i), &d.devs[i]); r != 0 {
			return nil, status.Errorf(status.Unsupported, "CUDA driver %s unusable: %w", path, d.fail(r, "cuDeviceGet(%d)", i))
		}
	}
	d.ctxs = make([]atomic.Pointer[ctxRef], int(n))
	a := d.api
	d.features = Features{
		VMM:                    res.has_vmm != 0,
		RetainAllocationHandle: res.has_vmm != 0 && a.cuMemRetainAllocationHandle != nil,
		Fabric:                 res.has_vmm != 0 && d.version >= 12030,
		HostFunc:               a.cuLaunchHostFunc != nil,
		DMABuf:                 a.cuMemGetHandleForAddressRange != nil,
		PointerAttributes:      a.cuPointerGetAttributes != nil,
		UUID:                   a.cuDeviceGetUuid != nil,
	}
	return d, nil
}

// Path is the library path the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// Version is cuDriverGetVersion: 1000*major + 10*minor (12040 is 12.4).
func (d *Driver) Version() int { return d.version }

// VersionString is Version as "major.minor".
func (d *Driver) VersionString() string {
	return fmt.Sprintf("%d.%d", d.version/1000, (d.version%1000)/10)
}

// DeviceCount is the number of devices the driver sees (at least 1).
func (d *Driver) DeviceCount() int { return len(d.devs) }

// Features tells which optional driver features are available.
func (d *Driver) Features() Features { return d.features }

// Close releases the primary contexts this Driver retained and forgets it:
// a later Load of the same path (or Default) makes a new Driver. Streams,
// events, allocations and mappings made through d must be released first,
// and no other call on d may be in flight. Close is idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed.Swap(true) {
		d.mu.Unlock()
		return nil
	}
	var first error
	for i := range d.ctxs {
		if d.ctxs[i].Swap(nil) == nil {
			continue
		}
		if r := C.tent_cu_primary_release(d.api, d.devs[i]); r != 0 && first == nil {
			first = d.fail(r, "cuDevicePrimaryCtxRelease(%d)", i)
		}
	}
	d.mu.Unlock()

	loadMu.Lock()
	if r, ok := loaded[d.path]; ok && r.d == d {
		delete(loaded, d.path)
	}
	loadMu.Unlock()
	defMu.Lock()
	if defRes.d == d {
		defDone, defRes = false, loadResult{}
	}
	defMu.Unlock()
	return first
}

var errClosed = status.Errorf(status.Closed, "cuda: driver closed")

func (d *Driver) checkDevice(dev int) error {
	if dev < 0 || dev >= len(d.devs) {
		return status.Errorf(status.InvalidArgument, "cuda: device %d out of range (the driver sees %d)", dev, len(d.devs))
	}
	return nil
}

// ctx returns dev's primary context, retaining it on first use. The
// context stays retained until Close.
func (d *Driver) ctx(dev int) (C.CUcontext, error) {
	if err := d.checkDevice(dev); err != nil {
		return nil, err
	}
	if r := d.ctxs[dev].Load(); r != nil {
		return r.c, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, errClosed
	}
	if r := d.ctxs[dev].Load(); r != nil {
		return r.c, nil
	}
	var c C.CUcontext
	if r := C.tent_cu_primary_retain(d.api, d.devs[dev], &c); r != 0 {
		return nil, d.fail(r, "cuDevicePrimaryCtxRetain(%d)", dev)
	}
	d.ctxs[dev].Store(&ctxRef{c})
	return c, nil
}

// anyCtx is the context for calls that name no device: the lowest device's
// context already retained, else device 0's.
func (d *Driver) anyCtx() (C.CUcontext, error) {
	for i := range d.ctxs {
		if r := d.ctxs[i].Load(); r != nil {
			return r.c, nil
		}
	}
	return d.ctx(0)
}

// RetainedContexts is the number of primary contexts d holds (for tests and
// diagnostics).
func (d *Driver) RetainedContexts() int {
	n := 0
	for i := range d.ctxs {
		if d.ctxs[i].Load() != nil {
			n++
		}
	}
	return n
}

// currentContextIsNil tells whether the calling thread has no current
// context (tests check that wrappers restore the thread's context).
func (d *Driver) currentContextIsNil() (bool, error) {
	var c C.CUcontext
	if r := C.tent_cu_ctx_get_current(d.api, &c); r != 0 {
		return false, d.fail(r, "cuCtxGetCurrent")
	}
	return c == nil, nil
}

// fail builds the error for a failed call, named with format and args.
func (d *Driver) fail(r C.CUresult, format string, args ...any) error {
	call := fmt.Sprintf(format, args...)
	if r&C.TENT_CU_CTX_FAILED != 0 {
		r &^= C.TENT_CU_CTX_FAILED
		call = "cuCtxSetCurrent (for " + call + ")"
	}
	var name, text string
	var p *C.char
	if C.tent_cu_error_name(d.api, r, &p) == 0 && p != nil {
		name = C.GoString(p)
	}
	if C.tent_cu_error_string(d.api, r, &p) == 0 && p != nil {
		text = C.GoString(p)
	}
	return newError(call, Result(r), name, text)
}

func (d *Driver) needVMM(what string) error {
	if !d.features.VMM {
		return status.Errorf(status.Unsupported,
			"cuda: %s needs the virtual memory management API, which the driver %s lacks", what, d.path)
	}
	return nil
}
