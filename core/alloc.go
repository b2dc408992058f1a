package core

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
)

// Allocation is memory the engine allocated itself (tent_alloc), which it can
// share with peers: a memfd for host memory, an exportable CUDA allocation
// for GPU memory.
type Allocation struct {
	ID   uint64 // unique within the engine, never reused
	Addr uint64
	Size uint64 // bytes mapped (the request rounded up)
	Loc  Location
	FD   int // memfd backing host memory, or -1

	once sync.Once
	free func() error
	err  error
}

// release frees the memory once; later calls return the first result.
func (a *Allocation) release() error {
	a.once.Do(func() { a.err = a.free() })
	return a.err
}

// NewAllocation is for AllocFuncs outside this package: an allocation of
// size bytes at addr in loc, backed by fd (-1 for none), which free releases.
// The engine calls free exactly once, when the region is freed or the engine
// closes; ID is set by the engine.
func NewAllocation(addr, size uint64, loc Location, fd int, free func() error) *Allocation {
	return &Allocation{Addr: addr, Size: size, Loc: loc, FD: fd, free: free}
}

// AllocFunc allocates size bytes at loc. It returns the allocation with
// Addr, Size, FD (or -1) and a free function set.
type AllocFunc func(size uint64, loc Location) (*Allocation, error)

var (
	allocMu    sync.Mutex
	allocators = map[string]AllocFunc{"cpu": allocHost}
)

// RegisterAllocator provides allocation for a location kind ("cuda").
func RegisterAllocator(kind string, f AllocFunc) {
	allocMu.Lock()
	defer allocMu.Unlock()
	allocators[kind] = f
}

// maxAlloc keeps a typo from asking the kernel for exabytes.
const maxAlloc = 1 << 46

// memfdSeals fix a shared memfd's size: a peer holding the descriptor can
// then neither shrink it (which would make the target's own accesses fault
// with SIGBUS) nor grow it, and F_SEAL_SEAL keeps it from adding seals
// (F_SEAL_FUTURE_WRITE would stop other peers from mapping it writable).
const memfdSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// allocHost maps a sealed memfd, so same-host peers can map the same pages.
func allocHost(size uint64, loc Location) (*Allocation, error) {
	page := uint64(unix.Getpagesize())
	size = (size + page - 1) &^ (page - 1)
	fd, err := unix.MemfdCreate("tent-alloc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, status.Errorf(status.NoMemory, "memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.NoMemory, "ftruncate memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.Internal, "sealing memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.NoMemory, "mmap %d bytes: %w", size, err)
	}
	a := &Allocation{Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: size, Loc: loc, FD: fd}
	a.free = func() error {
		err1 := unix.Munmap(mem)
		err2 := unix.Close(fd)
		if err1 != nil || err2 != nil {
			return status.Errorf(status.Internal, "freeing allocation: munmap: %v, close: %v", err1, err2)
		}
		return nil
	}
	return a, nil
}

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
	if !loc.IsCUDA() { // the CUDA allocator checks its devices itself
		if err := checkDevice(loc); err != nil {
			return nil, err
		}
	}
	allocMu.Lock()
	f := allocators[loc.Kind]
	allocMu.Unlock()
	if f == nil {
		return nil, status.Errorf(status.Unsupported, "cannot allocate %s memory in this build", loc.Kind)
	}
	a, err := f(size, loc)
	if err != nil {
		return nil, err
	}
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
