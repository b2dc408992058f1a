package core

import (
	"sync"

	"github.com/tent-dev/tent/status"
)

// Allocation is memory the engine allocated itself (tent_alloc) with one of
// its memory kinds, which it can share with peers: a memfd for host memory,
// an exportable CUDA allocation for GPU memory.
type Allocation struct {
	ID   uint64 // unique within the engine, never reused
	Addr uint64
	Size uint64 // bytes mapped (the request rounded up)
	Loc  Location
	FD   int // memfd backing host memory, or -1
	// Detail is the memory kind's own record of the allocation (see
	// memory.Allocation.Detail).
	Detail any

	once sync.Once
	free func() error
	err  error
}

// release frees the memory once; later calls return the first result.
func (a *Allocation) release() error {
	a.once.Do(func() { a.err = a.free() })
	return a.err
}

// maxAlloc keeps a typo from asking the kernel for exabytes.
const maxAlloc = 1 << 46

// Alloc allocates size bytes at location, registers them with perm, and
// returns the region (its Alloc field describes the allocation).
func (e *Engine) Alloc(size uint64, location string, perm Perm) (*Region, error) {
	if size == 0 || size > maxAlloc {
		return nil, status.Errorf(status.InvalidArgument, "allocation size %d outside (0, %d]", size, uint64(maxAlloc))
	}
	if err := validatePerm(perm); err != nil {
		return nil, err
	}
	if location == "" {
		location = "cpu"
	}
	loc, err := ParseLocation(location)
	if err != nil {
		return nil, err
	}
	kind, err := e.memoryKind(loc)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cannot allocate %s memory: %w", loc, err)
	}
	if err := kind.CheckDevice(loc.Device); err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cannot allocate %s memory: %w", loc, err)
	}
	m, err := kind.Alloc(size, loc.Device)
	if err != nil {
		return nil, err
	}
	a := &Allocation{Addr: m.Addr, Size: m.Size, Loc: loc, FD: m.FD, Detail: m.Detail, free: m.Free}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		_ = a.release()
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	e.nextAlloc++
	a.ID = e.nextAlloc
	e.allocs[a] = struct{}{}
	e.mu.Unlock()
	rs, err := e.registerBatch([]RegionDesc{{Addr: a.Addr, Len: a.Size, Location: loc.String()}}, perm, a)
	if err != nil {
		e.mu.Lock()
		delete(e.allocs, a)
		e.mu.Unlock()
		_ = a.release()
		return nil, err
	}
	return rs[0], nil
}

// Free unregisters and frees memory from Alloc (waiting for transfers like
// Unregister).
func (e *Engine) Free(r *Region) error {
	if r == nil || r.Alloc == nil {
		return status.Errorf(status.InvalidArgument, "region was not allocated by the engine")
	}
	if err := e.Unregister(r); err != nil {
		return err
	}
	e.mu.Lock()
	delete(e.allocs, r.Alloc)
	e.mu.Unlock()
	return r.Alloc.release()
}
