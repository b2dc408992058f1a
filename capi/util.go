package main

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"

	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// engine is the value behind a tent_engine handle.
type engine struct {
	// id is the engine's handle, set once right after it is added to the
	// table (atomic: the table publishes the engine before the id is known).
	id   atomic.Uint64
	core *core.Engine
	// destroyed is set by tent_engine_destroy before it removes the
	// engine's children; addChild checks it after adding, so a handle
	// created concurrently with destroy never outlives the engine.
	destroyed atomic.Bool
	// requests holds the buffers that submit reads a caller's array into
	// and reuses once core.Submit (which keeps none of it) returns: a
	// batch of 128 then allocates no 5 KiB copy.
	requests requestBufs
}

// requestBufs keeps a few request buffers for reuse. Not a sync.Pool: a
// C thread's calls enter Go on whichever P is free, so a pool's per-P
// slot missed about every other call, and every collection emptied it
// (5 KiB allocated a batch of 128 through the C ABI).
type requestBufs struct {
	mu   sync.Mutex
	free []*requestBuf
}

// requestBuf is what one submit reads a caller's array through: the raw
// entries a chunk at a time, and the requests for core.Submit.
type requestBuf struct {
	raw  []cRequest
	reqs []core.TransferRequest
}

// maxRequestBufs bounds the buffers kept: one per thread submitting at
// once, for a few threads.
const maxRequestBufs = 8

// get returns a kept buffer, or nil.
func (p *requestBufs) get() *requestBuf {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return nil
	}
	b := p.free[n-1]
	p.free[n-1] = nil
	p.free = p.free[:n-1]
	return b
}

// put keeps b (emptied by the caller) unless enough are kept.
func (p *requestBufs) put(b *requestBuf) {
	p.mu.Lock()
	if len(p.free) < maxRequestBufs {
		p.free = append(p.free, b)
	}
	p.mu.Unlock()
}

// region is the value behind a tent_region handle.
type region struct {
	engine uint64 // id of the engine that registered it
	r      *core.Region
}

// lookupEngine returns the engine behind id.
func lookupEngine(id C.uint64_t) (*engine, error) {
	v, err := lib.handles.Get(handles.Engine, uint64(id))
	if err != nil {
		return nil, err
	}
	return v.(*engine), nil
}

// child is the value behind a handle that belongs to an engine.
type child interface {
	owner() uint64 // the id of the engine
}

func (r *region) owner() uint64 { return r.engine }

// lookupChild returns the value of kind behind id, which must belong to e.
func lookupChild[T child](e *engine, kind handles.Kind, id uint64) (T, error) {
	var zero T
	v, err := lib.handles.Get(kind, id)
	if err != nil {
		return zero, err
	}
	c := v.(T)
	if c.owner() != e.id.Load() {
		return zero, status.Errorf(status.InvalidHandle,
			"%s handle %#x belongs to engine %#x, not to engine %#x", kind, id, c.owner(), e.id.Load())
	}
	return c, nil
}

// lookupRegion returns the region behind id, which must belong to e.
func lookupRegion(e *engine, id uint64) (*region, error) {
	return lookupChild[*region](e, handles.Region, id)
}

// addChild adds a handle of kind whose parent is e, so that destroying e
// invalidates it. If e is being destroyed meanwhile, the handle is removed
// again and ErrInvalidHandle returned: the object belongs to a dead engine.
func (e *engine) addChild(kind handles.Kind, v any) (uint64, error) {
	id := lib.handles.Add(kind, e.id.Load(), v)
	// Destroy sets destroyed before RemoveChildren: either it sees our
	// entry, or we see the flag here (both are sequentially consistent).
	if e.destroyed.Load() {
		_, _ = lib.handles.Remove(kind, id)
		return 0, status.Errorf(status.InvalidHandle, "engine %#x was destroyed during the call", e.id.Load())
	}
	return id, nil
}

// maxStructSize bounds the size field of an options or info struct: a
// larger value is garbage, not a future version of the struct.
const maxStructSize = 4096

// checkStructSize validates the size field of a versioned struct at a whose
// v1 layout is known bytes. Smaller is an error. Larger is a newer caller:
// for an input struct (mustZeroTail) the fields this library doesn't know
// must be zero, or they would be ignored silently.
func checkStructSize(a uintptr, size uint32, known uintptr, what string, mustZeroTail bool) error {
	switch {
	case uintptr(size) < known:
		return status.Errorf(status.InvalidArgument,
			"%s.size is %d, want at least sizeof(%s) = %d (set it to sizeof, or use the _INIT macro)",
			what, size, what, known)
	case size > maxStructSize:
		return status.Errorf(status.InvalidArgument, "%s.size is %d: not initialized?", what, size)
	}
	if mustZeroTail && uintptr(size) > known {
		tail, err := readBytes(a+known, uint64(uintptr(size)-known), what)
		if err != nil {
			return err
		}
		for i, b := range tail {
			if b != 0 {
				return status.Errorf(status.InvalidArgument,
					"%s sets a field at offset %d that this library (tent %s) does not know",
					what, known+uintptr(i), versionString())
			}
		}
	}
	return nil
}

// copyOut writes s and a NUL into buf (cap bytes) and its length into
// *lenOut (if not NULL). If buf is too small it writes only *lenOut and
// returns ErrBufferTooSmall, so callers can ask for the size with cap 0.
// Both destinations are probed before either is written, so a bad pointer
// leaves both untouched.
func copyOut(buf uintptr, capacity C.size_t, lenOut uintptr, s string) error {
	if err := optionalOut(lenOut, 8, "len_out"); err != nil {
		return err
	}
	fits := uint64(len(s)) < uint64(capacity)
	written := uint64(0)
	if fits {
		written = uint64(len(s)) + 1
	}
	if err := sizedOut(buf, uint64(capacity), "cap", written, "buf"); err != nil {
		return err
	}
	if err := disjoint(outRange{lenOut, 8, "len_out"}, outRange{buf, written, "buf"}); err != nil {
		return err
	}
	if lenOut != 0 {
		if err := writeValue(lenOut, C.size_t(len(s)), "len_out"); err != nil {
			return err
		}
	}
	if !fits {
		return status.Errorf(status.BufferTooSmall,
			"the result needs %d bytes (%d and the NUL), cap is %d", len(s)+1, len(s), uint64(capacity))
	}
	return writeFrom(buf, append([]byte(s), 0), "buf")
}

func versionString() string {
	return C.GoString(C.tent_version_string())
}
