package core

import (
	"math/bits"
	"sync"
	"unsafe"
)

// Forgetter is a Mover that forgets a request at its Done: past the Done
// of an attempt, and past the Submit call that handed the request over
// (the engine waits that call out before the batch can settle), it never
// calls Done for the request again and never reads or writes it. It may
// still hold the pointer (a map key it compares), never dereference it,
// and past Submit it reads the slice Submit was given only at requests it
// has not reported done (the slice is the batch's, reused with it).
//
// The engine reuses the Request values of a released batch for a later
// batch only when every attempt of every request went to a Forgetter. A
// batch that any other mover touched is left to the garbage collector, so
// a mover that completes late, or twice, cannot reach another batch's
// request: its Done lands on its own batch's request and is counted as a
// duplicate, as before.
type Forgetter interface {
	Mover
	// ForgetsRequests is the promise above; it does nothing.
	ForgetsRequests()
}

// Slabs of Request values reused by batches, by size class: class k holds
// slabs of 1<<k requests. A batch of more than 1<<maxSlabClass requests
// allocates its own and gives nothing back.
const (
	maxSlabClass = 12
	// slabKeepBytes bounds what one class keeps for reuse.
	slabKeepBytes = 1 << 20
)

// slabs is an engine's free lists of request slabs.
type slabs struct {
	mu   sync.Mutex
	free [maxSlabClass + 1][]slab
}

// slab is a batch's requests and the pointers to them that routing hands
// to movers (in any order: routing gathers them in place).
type slab struct {
	reqs  []Request
	ptrs  []*Request
	timer *deadlineTimer // stopped before it fired, or nil
}

// slabClass is the class of a batch of n requests, or -1 when the batch
// is too large to reuse.
func slabClass(n int) int {
	if n <= 1 {
		return 0
	}
	k := bits.Len(uint(n - 1))
	if k > maxSlabClass {
		return -1
	}
	return k
}

// get returns a slab of n zeroed requests and room for n pointers (to be
// set by the caller), and a reused slab's stopped deadline timer. A reused
// slab keeps its class's capacity, so it goes back to the same class.
func (s *slabs) get(n int) slab {
	k := slabClass(n)
	if k < 0 {
		return slab{reqs: make([]Request, n), ptrs: make([]*Request, n)}
	}
	s.mu.Lock()
	if f := s.free[k]; len(f) > 0 {
		sl := f[len(f)-1]
		f[len(f)-1] = slab{}
		s.free[k] = f[:len(f)-1]
		s.mu.Unlock()
		// One clear of the slab, not a store per field: the requests are
		// no one else's, and a clear is a memclr (with one pass of the
		// write barrier over its pointers while the GC marks).
		clear(sl.reqs[:n])
		return slab{sl.reqs[:n], sl.ptrs[:n], sl.timer}
	}
	s.mu.Unlock()
	return slab{reqs: make([]Request, n, 1<<k), ptrs: make([]*Request, n, 1<<k)}
}

// put keeps slab for a later batch of its class, unless the class keeps
// enough already.
func (s *slabs) put(sl slab) {
	n := cap(sl.reqs)
	k := slabClass(n)
	if k < 0 || n != 1<<k || cap(sl.ptrs) != n {
		return
	}
	keep := max(1, slabKeepBytes/(n*int(unsafe.Sizeof(Request{}))))
	s.mu.Lock()
	if len(s.free[k]) < keep {
		s.free[k] = append(s.free[k], slab{sl.reqs[:n], sl.ptrs[:n], sl.timer})
	}
	s.mu.Unlock()
}

// drop forgets every kept slab (the engine closes).
func (s *slabs) drop() {
	s.mu.Lock()
	s.free = [maxSlabClass + 1][]slab{}
	s.mu.Unlock()
}
