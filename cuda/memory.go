package cuda

/*
#include "tent_cuda.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	pointer "github.com/mattn/go-pointer"

	"github.com/tent-dev/tent/status"
)

// MemAlloc is cuMemAlloc on dev: plain (non-VMM) device memory, for tests
// and for memory that does not need exporting. Free it with MemFree.
func (d *Driver) MemAlloc(dev int, size uint64) (uint64, error) {
	ctx, err := d.ctx(dev)
	if err != nil {
		return 0, err
	}
	var p C.CUdeviceptr
	if r := C.tent_cu_mem_alloc(d.api, ctx, C.ulonglong(size), &p); r != 0 {
		return 0, d.fail(r, "cuMemAlloc(device %d, %d)", dev, size)
	}
	return uint64(p), nil
}

// MemFree is cuMemFree of a MemAlloc block, in its device's context.
func (d *Driver) MemFree(addr uint64) error {
	ctx, err := d.ctxFor(addr)
	if err != nil {
		return err
	}
	if r := C.tent_cu_mem_free(d.api, ctx, C.CUdeviceptr(addr)); r != 0 {
		return d.fail(r, "cuMemFree(%#x)", addr)
	}
	return nil
}

// Memcpy is a synchronous cuMemcpy between any two addresses the driver can
// tell apart (unified addressing): device, pinned host or pageable host.
func (d *Driver) Memcpy(dst, src, n uint64) error {
	ctx, err := d.anyCtx()
	if err != nil {
		return err
	}
	if r := C.tent_cu_memcpy(d.api, ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n)); r != 0 {
		return d.fail(r, "cuMemcpy(%#x, %#x, %d)", dst, src, n)
	}
	return nil
}

// CopyHtoD is a synchronous cuMemcpyHtoD of src to device address dst.
func (d *Driver) CopyHtoD(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	ctx, err := d.anyCtx()
	if err != nil {
		return err
	}
	if r := C.tent_cu_memcpy_htod(d.api, ctx, C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.ulonglong(len(src))); r != 0 {
		return d.fail(r, "cuMemcpyHtoD(%#x, %d)", dst, len(src))
	}
	return nil
}

// CopyDtoH is a synchronous cuMemcpyDtoH of len(dst) bytes from device
// address src.
func (d *Driver) CopyDtoH(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	ctx, err := d.anyCtx()
	if err != nil {
		return err
	}
	if r := C.tent_cu_memcpy_dtoh(d.api, ctx, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.ulonglong(len(dst))); r != 0 {
		return d.fail(r, "cuMemcpyDtoH(%#x, %d)", src, len(dst))
	}
	return nil
}

// CopyDtoD is a synchronous cuMemcpyDtoD.
func (d *Driver) CopyDtoD(dst, src, n uint64) error {
	ctx, err := d.anyCtx()
	if err != nil {
		return err
	}
	if r := C.tent_cu_memcpy_dtod(d.api, ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n)); r != 0 {
		return d.fail(r, "cuMemcpyDtoD(%#x, %#x, %d)", dst, src, n)
	}
	return nil
}

// Stream is a non-blocking CUDA stream of one device. Its methods run in
// that device's primary context. Destroy it when done.
type Stream struct {
	d   *Driver
	dev int
	ctx C.CUcontext

	mu sync.RWMutex // Destroy excludes every other call
	s  C.CUstream
}

// NewStream is cuStreamCreate(CU_STREAM_NON_BLOCKING) on dev.
func (d *Driver) NewStream(dev int) (*Stream, error) {
	ctx, err := d.ctx(dev)
	if err != nil {
		return nil, err
	}
	var s C.CUstream
	if r := C.tent_cu_stream_create(d.api, ctx, C.CU_STREAM_NON_BLOCKING, &s); r != 0 {
		return nil, d.fail(r, "cuStreamCreate(device %d)", dev)
	}
	return &Stream{d: d, dev: dev, ctx: ctx, s: s}, nil
}

// Device is the stream's device.
func (s *Stream) Device() int { return s.dev }

var errStreamDestroyed = status.Errorf(status.Closed, "cuda: stream destroyed")

// Destroy is cuStreamDestroy. It is idempotent.
func (s *Stream) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	if r := C.tent_cu_stream_destroy(s.d.api, s.ctx, s.s); r != 0 {
		return s.d.fail(r, "cuStreamDestroy(device %d)", s.dev)
	}
	s.s = nil
	return nil
}

// Synchronize is cuStreamSynchronize: it waits for all work queued so far.
func (s *Stream) Synchronize() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return errStreamDestroyed
	}
	if r := C.tent_cu_stream_sync(s.d.api, s.ctx, s.s); r != 0 {
		return s.d.fail(r, "cuStreamSynchronize(device %d)", s.dev)
	}
	return nil
}

// Memcpy queues cuMemcpyAsync (unified addressing, any direction). Host
// memory must be pinned or registered and stay valid until the copy is
// done: never pass Go memory to an asynchronous copy.
func (s *Stream) Memcpy(dst, src, n uint64) error {
	return s.copyAsync("cuMemcpyAsync", dst, src, n, func(cs C.CUstream) C.CUresult {
		return C.tent_cu_memcpy_async(s.d.api, s.ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n), cs)
	})
}

// MemcpyHtoD queues cuMemcpyHtoDAsync from host address src (pinned or
// registered, not Go memory).
func (s *Stream) MemcpyHtoD(dst uint64, src uintptr, n uint64) error {
	return s.copyAsync("cuMemcpyHtoDAsync", dst, uint64(src), n, func(cs C.CUstream) C.CUresult {
		return C.tent_cu_memcpy_htod_async(s.d.api, s.ctx, C.CUdeviceptr(dst), C.uintptr_t(src), C.ulonglong(n), cs)
	})
}

// MemcpyDtoH queues cuMemcpyDtoHAsync to host address dst (pinned or
// registered, not Go memory).
func (s *Stream) MemcpyDtoH(dst uintptr, src uint64, n uint64) error {
	return s.copyAsync("cuMemcpyDtoHAsync", uint64(dst), src, n, func(cs C.CUstream) C.CUresult {
		return C.tent_cu_memcpy_dtoh_async(s.d.api, s.ctx, C.uintptr_t(dst), C.CUdeviceptr(src), C.ulonglong(n), cs)
	})
}

// MemcpyDtoD queues cuMemcpyDtoDAsync.
func (s *Stream) MemcpyDtoD(dst, src, n uint64) error {
	return s.copyAsync("cuMemcpyDtoDAsync", dst, src, n, func(cs C.CUstream) C.CUresult {
		return C.tent_cu_memcpy_dtod_async(s.d.api, s.ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n), cs)
	})
}

// copyAsync is what the Memcpy methods share: it runs queue on the live
// stream under the read lock (Destroy waits for it) and reports a failure
// as call(dst, src, n). The operands are formatted only on failure.
func (s *Stream) copyAsync(call string, dst, src, n uint64, queue func(C.CUstream) C.CUresult) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return errStreamDestroyed
	}
	if r := queue(s.s); r != 0 {
		return s.d.fail(r, "%s(%#x, %#x, %d)", call, dst, src, n)
	}
	return nil
}

// LaunchHostFunc is cuLaunchHostFunc: fn runs on a driver thread once the
// work queued before it is done. fn must be quick and must not call CUDA
// (signal a channel instead). Unsupported without cuLaunchHostFunc.
func (s *Stream) LaunchHostFunc(fn func()) error {
	if !s.d.features.HostFunc {
		return status.Errorf(status.Unsupported, "cuda: the driver %s lacks cuLaunchHostFunc", s.d.path)
	}
	if fn == nil {
		return status.Errorf(status.InvalidArgument, "cuda: LaunchHostFunc(nil)")
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return errStreamDestroyed
	}
	user := pointer.Save(fn)
	if r := C.tent_cu_launch_host_func(s.d.api, s.ctx, s.s, user); r != 0 {
		pointer.Unref(user)
		return s.d.fail(r, "cuLaunchHostFunc(device %d)", s.dev)
	}
	return nil
}

// Event is a CUDA event without timing, for completion tracking.
type Event struct {
	d   *Driver
	dev int
	ctx C.CUcontext

	mu sync.RWMutex
	e  C.CUevent
}

// NewEvent is cuEventCreate(CU_EVENT_DISABLE_TIMING) on dev.
func (d *Driver) NewEvent(dev int) (*Event, error) {
	ctx, err := d.ctx(dev)
	if err != nil {
		return nil, err
	}
	var e C.CUevent
	if r := C.tent_cu_event_create(d.api, ctx, C.CU_EVENT_DISABLE_TIMING, &e); r != 0 {
		return nil, d.fail(r, "cuEventCreate(device %d)", dev)
	}
	return &Event{d: d, dev: dev, ctx: ctx, e: e}, nil
}

var errEventDestroyed = status.Errorf(status.Closed, "cuda: event destroyed")

// Record is cuEventRecord on s.
func (e *Event) Record(s *Stream) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.e == nil {
		return errEventDestroyed
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return errStreamDestroyed
	}
	if r := C.tent_cu_event_record(e.d.api, s.ctx, e.e, s.s); r != 0 {
		return e.d.fail(r, "cuEventRecord(device %d)", e.dev)
	}
	return nil
}

// Query is cuEventQuery: true when the work recorded before the event is
// done (or the event was never recorded), false while it is pending.
func (e *Event) Query() (bool, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.e == nil {
		return false, errEventDestroyed
	}
	r := C.tent_cu_event_query(e.d.api, e.ctx, e.e)
	switch Result(r) {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	}
	return false, e.d.fail(r, "cuEventQuery(device %d)", e.dev)
}

// Synchronize is cuEventSynchronize.
func (e *Event) Synchronize() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.e == nil {
		return errEventDestroyed
	}
	if r := C.tent_cu_event_sync(e.d.api, e.ctx, e.e); r != 0 {
		return e.d.fail(r, "cuEventSynchronize(device %d)", e.dev)
	}
	return nil
}

// Destroy is cuEventDestroy. It is idempotent.
func (e *Event) Destroy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.e == nil {
		return nil
	}
	if r := C.tent_cu_event_destroy(e.d.api, e.ctx, e.e); r != 0 {
		return e.d.fail(r, "cuEventDestroy(device %d)", e.dev)
	}
	e.e = nil
	return nil
}
