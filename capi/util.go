package main

/*
#include "shim.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/handles"
	"github.com/tent-dev/tent/status"
)

// table holds every handle given to C, of every engine. Ids are never
// reused, so a stale id can never find another object.
var table = handles.NewTable()

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
}

// region is the value behind a tent_region handle.
type region struct {
	engine uint64 // id of the engine that registered it
	r      *core.Region
}

// lookupEngine returns the engine behind id.
func lookupEngine(id C.uint64_t) (*engine, error) {
	v, err := table.Get(handles.Engine, uint64(id))
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
	v, err := table.Get(kind, id)
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
	id := table.Add(kind, e.id.Load(), v)
	// Destroy sets destroyed before RemoveChildren: either it sees our
	// entry, or we see the flag here (both are sequentially consistent).
	if e.destroyed.Load() {
		_, _ = table.Remove(kind, id)
		return 0, status.Errorf(status.InvalidHandle, "engine %#x was destroyed during the call", e.id.Load())
	}
	return id, nil
}

// maxArrayBytes bounds a C array's size: larger cannot exist in a 47-bit
// user address space, so n is a caller bug (typically a negative number).
const maxArrayBytes = 1 << 47

// cArray views n elements of C memory at p as a slice, after checking that
// p is not NULL (for n > 0) and that n elements fit in the address space.
// The slice aliases C memory: it must not outlive the export.
func cArray[T any](p *T, n C.size_t, what string) ([]T, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, status.Errorf(status.InvalidArgument, "%s is NULL but n is %d", what, uint64(n))
	}
	if uint64(n) > maxArrayBytes/uint64(unsafe.Sizeof(*p)) {
		return nil, status.Errorf(status.InvalidArgument, "n = %d entries of %s is larger than memory", uint64(n), what)
	}
	return unsafe.Slice(p, int(n)), nil
}

// maxStructSize bounds the size field of an options or info struct: a
// larger value is garbage, not a future version of the struct.
const maxStructSize = 4096

// checkStructSize validates the size field of a versioned struct at p whose
// v1 layout is known bytes. Smaller is an error. Larger is a newer caller:
// for an input struct (mustZeroTail) the fields this library doesn't know
// must be zero, or they would be ignored silently.
func checkStructSize(p unsafe.Pointer, size C.uint32_t, known uintptr, what string, mustZeroTail bool) error {
	switch {
	case uintptr(size) < known:
		return status.Errorf(status.InvalidArgument,
			"%s.size is %d, want at least sizeof(%s) = %d (set it to sizeof, or use the _INIT macro)",
			what, uint32(size), what, known)
	case size > maxStructSize:
		return status.Errorf(status.InvalidArgument, "%s.size is %d: not initialized?", what, uint32(size))
	}
	if mustZeroTail {
		tail := unsafe.Slice((*byte)(unsafe.Add(p, known)), uintptr(size)-known)
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
func copyOut(buf *C.char, capacity C.size_t, lenOut *C.size_t, s string) error {
	if buf == nil && capacity != 0 {
		return status.Errorf(status.InvalidArgument, "buf is NULL but cap is %d", uint64(capacity))
	}
	if uint64(len(s)) >= uint64(capacity) {
		if lenOut != nil {
			*lenOut = C.size_t(len(s))
		}
		return status.Errorf(status.BufferTooSmall,
			"the result needs %d bytes (%d and the NUL), cap is %d", len(s)+1, len(s), uint64(capacity))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(s)+1)
	copy(dst, s)
	dst[len(s)] = 0
	if lenOut != nil {
		*lenOut = C.size_t(len(s))
	}
	return nil
}

// optString copies a C string; NULL becomes "" and set=false.
func optString(p *C.char) (s string, set bool) {
	if p == nil {
		return "", false
	}
	return C.GoString(p), true
}

func versionString() string {
	return C.GoString(C.tent_version_string())
}
