package core

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/status"
)

// Perm is the set of operations a remote peer may perform on a region.
type Perm uint32

const (
	PermRemoteRead  Perm = 1 << 0
	PermRemoteWrite Perm = 1 << 1
	permAll              = PermRemoteRead | PermRemoteWrite
)

// RegionDesc describes memory to register.
type RegionDesc struct {
	Addr uint64
	Len  uint64
	// Location is "cpu", "cpu:N", "cuda:N", or "" to detect it from Addr.
	Location string
}

// Region is registered memory. Its fields are fixed at registration.
type Region struct {
	Addr  uint64
	Len   uint64
	Loc   Location
	Perm  Perm
	Alloc *Allocation // set when the engine allocated the memory

	engine *Engine
	span   *span
	// via lists the transports that accepted the registration; only they
	// are told to unregister it.
	via []*installed

	users   atomic.Int64 // transfers using the region right now
	closing atomic.Bool  // set by unregister; new users are refused
	mu      sync.Mutex   // guards drained
	drained chan struct{}
}

// End returns the first address past the region.
func (r *Region) End() uint64 { return r.Addr + r.Len }

// Engine returns the engine the region belongs to.
func (r *Region) Engine() *Engine { return r.engine }

// Contains reports whether [addr, addr+n) lies inside the region.
func (r *Region) Contains(addr, n uint64) bool {
	return addr >= r.Addr && n <= r.Len && addr-r.Addr <= r.Len-n
}

// Permits reports whether the region grants a peer access (Acquire's
// permission check).
func (r *Region) Permits(access Access) bool {
	switch access {
	case AccessRemoteRead:
		return r.Perm&PermRemoteRead != 0
	case AccessRemoteWrite:
		return r.Perm&PermRemoteWrite != 0
	}
	return true
}

// HandleShareable reports whether a handle to the region's memory (a memfd,
// a CUDA POSIX fd or FABRIC handle) may be given to a peer. Such a handle is
// a capability over the whole allocation for as long as the peer keeps it:
// a memfd opened read-only can be reopened read-write through
// /proc/self/fd, and a CUDA import is mapped with whatever access the
// importer asks for. So only a whole engine allocation whose registration
// permits both remote read and remote write is shareable; everything else
// is served by paths that check each request (tcp, process_vm).
func (r *Region) HandleShareable() bool {
	a := r.Alloc
	return a != nil && r.Perm&permAll == permAll && r.Addr == a.Addr && r.Len == a.Size
}

// release drops one user taken by acquire.
func (r *Region) release() { r.releaseN(1) }

// releaseN ends n uses at once; a nil region or n of 0 is nothing.
func (r *Region) releaseN(n int64) {
	if r == nil || n == 0 {
		return
	}
	if r.users.Add(-n) == 0 && r.closing.Load() {
		r.mu.Lock()
		// Check users again under the lock: between our decrement and here an
		// unregister may have given up, a new user acquired the region, and a
		// second unregister started waiting; its channel is not ours to close.
		if r.drained != nil && r.users.Load() == 0 {
			close(r.drained)
			r.drained = nil
		}
		r.mu.Unlock()
	}
}

// waitIdle waits until no transfer uses r, or until deadline. closing must
// already be set, so no new user can appear.
func (r *Region) waitIdle(deadline time.Time) bool {
	r.mu.Lock()
	if r.users.Load() == 0 {
		r.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	r.drained = ch
	r.mu.Unlock()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.drained == ch {
			r.drained = nil
			return false
		}
		return true // closed between the timer and the lock
	}
}

func (e *Engine) validateDesc(d RegionDesc) (Location, error) {
	switch {
	case d.Addr == 0:
		return Location{}, status.Errorf(status.InvalidArgument, "null address")
	case d.Len == 0:
		return Location{}, status.Errorf(status.InvalidArgument, "zero length at %#x", d.Addr)
	case d.Len > math.MaxUint64-d.Addr:
		return Location{}, status.Errorf(status.InvalidArgument,
			"address %#x + length %#x overflows", d.Addr, d.Len)
	}
	if d.Location == "" {
		return e.detectLocation(d.Addr)
	}
	loc, err := ParseLocation(d.Location)
	if err != nil {
		return Location{}, err
	}
	if err := e.checkDevice(loc); err != nil {
		return Location{}, err
	}
	return loc, e.mem.Verify(d.Addr, d.Len, loc.Kind, loc.Device)
}

func validatePerm(p Perm) error {
	if p&^permAll != 0 {
		return status.Errorf(status.InvalidArgument, "unknown flags %#x", uint32(p&^permAll))
	}
	return nil
}

// Register registers one region; see RegisterBatch.
func (e *Engine) Register(d RegionDesc, perm Perm) (*Region, error) {
	rs, err := e.RegisterBatch([]RegionDesc{d}, perm)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// RegisterBatch registers all descs or none. An exact duplicate of a
// committed region fails with ErrAlreadyRegistered, any other overlap (with
// a region, an in-flight registration, or another entry of the batch) with
// ErrOverlap or ErrInvalidArgument for overlaps inside the batch.
func (e *Engine) RegisterBatch(descs []RegionDesc, perm Perm) ([]*Region, error) {
	return e.registerBatch(descs, perm, nil)
}

func (e *Engine) registerBatch(descs []RegionDesc, perm Perm, alloc *Allocation) (_ []*Region, err error) {
	if len(descs) == 0 {
		return nil, status.Errorf(status.InvalidArgument, "empty batch")
	}
	if err := validatePerm(perm); err != nil {
		return nil, err
	}
	regions := make([]*Region, len(descs))
	ivs := make([]interval, len(descs))
	for i, d := range descs {
		loc, err := e.validateDesc(d)
		if err != nil {
			if len(descs) > 1 {
				return nil, status.Errorf(status.CodeOf(err), "entry %d: %w", i, err)
			}
			return nil, err
		}
		regions[i] = &Region{Addr: d.Addr, Len: d.Len, Loc: loc, Perm: perm, Alloc: alloc, engine: e}
		ivs[i] = interval{d.Addr, d.Addr + d.Len}
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	spans, err := e.index.reserve(ivs)
	transports := e.transports
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}

	// The guard: whatever happens below, a reservation that was not committed
	// is undone, including when a transport panics past safeCall.
	var done []*installed
	committed := false
	defer func() {
		if committed {
			return
		}
		for i := len(done) - 1; i >= 0; i-- {
			t := done[i]
			if t.gate.enter() {
				_ = safeCall(t.t.Name()+" unregister (rollback)", func() error {
					return t.t.UnregisterMemory(regions)
				})
				t.gate.exit()
			}
		}
		e.mu.Lock()
		e.index.release(spans)
		e.mu.Unlock()
	}()

	for _, t := range transports {
		if !t.gate.enter() {
			continue // uninstalled meanwhile: it no longer wants to know
		}
		err := safeCall(t.t.Name()+" register", func() error { return t.t.RegisterMemory(regions) })
		t.gate.exit()
		if err != nil {
			return nil, err
		}
		done = append(done, t)
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, status.Errorf(status.Closed, "engine closed during registration")
	}
	e.index.commit(spans, regions)
	for _, r := range regions {
		r.via = done
		e.regions[r] = struct{}{}
	}
	e.generation++
	committed = true
	e.mu.Unlock()
	e.notifyChange()
	return regions, nil
}

// Unregister removes one region; see UnregisterBatch.
func (e *Engine) Unregister(r *Region) error {
	return e.UnregisterBatch([]*Region{r})
}

// UnregisterBatch removes all regions or none. Transfers using them are
// waited for up to Options.UnregisterTimeout; if they are still running then,
// it fails with ErrBusy and every region stays registered.
func (e *Engine) UnregisterBatch(regions []*Region) error {
	if len(regions) == 0 {
		return status.Errorf(status.InvalidArgument, "empty batch")
	}
	e.mu.Lock()
	seen := make(map[*Region]bool, len(regions))
	for i, r := range regions {
		switch {
		case r == nil || r.engine != e:
			e.mu.Unlock()
			return status.Errorf(status.InvalidHandle, "entry %d: region does not belong to this engine", i)
		case seen[r]:
			e.mu.Unlock()
			return status.Errorf(status.InvalidArgument, "entry %d: region listed twice", i)
		}
		if _, ok := e.regions[r]; !ok {
			e.mu.Unlock()
			return status.Errorf(status.NotRegistered, "entry %d: region [%#x, %#x) is not registered", i, r.Addr, r.End())
		}
		if r.closing.Load() {
			e.mu.Unlock()
			return status.Errorf(status.Busy, "entry %d: region is already being unregistered", i)
		}
		seen[r] = true
	}
	for _, r := range regions {
		r.closing.Store(true)
	}
	e.mu.Unlock()

	deadline := time.Now().Add(e.opts.UnregisterTimeout)
	for _, r := range regions {
		if !r.waitIdle(deadline) {
			e.mu.Lock()
			if !e.closed { // a closing engine keeps them closed
				for _, r := range regions {
					r.closing.Store(false)
				}
			}
			e.mu.Unlock()
			return status.Errorf(status.Busy,
				"region [%#x, %#x) is still used by transfers after %v", r.Addr, r.End(), e.opts.UnregisterTimeout)
		}
	}
	e.dropRegions(regions)
	return nil
}

// dropRegions tells the transports that registered the regions and removes
// them from the index. The regions must be closing and idle. Regions that a
// concurrent Close already dropped are skipped.
func (e *Engine) dropRegions(regions []*Region) {
	e.mu.Lock()
	live := regions[:0:0]
	for _, r := range regions {
		if _, ok := e.regions[r]; ok {
			live = append(live, r)
		}
	}
	e.mu.Unlock()
	if len(live) == 0 {
		return
	}
	// Each region is unregistered from the transports that registered it,
	// in reverse order. Uninstalled ones have a closed gate and are skipped:
	// their teardown released everything.
	var order []*installed
	for _, r := range live {
		for _, t := range r.via {
			if !slices.Contains(order, t) {
				order = append(order, t)
			}
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		t := order[i]
		var mine []*Region
		for _, r := range live {
			if slices.Contains(r.via, t) {
				mine = append(mine, r)
			}
		}
		if t.gate.enter() {
			// An unregister failure cannot be undone; the transport reports
			// it in its stats, and the memory is gone from the index anyway.
			_ = safeCall(t.t.Name()+" unregister", func() error { return t.t.UnregisterMemory(mine) })
			t.gate.exit()
		}
	}
	e.mu.Lock()
	for _, r := range live {
		if _, ok := e.regions[r]; ok {
			e.index.remove(r.span)
			delete(e.regions, r)
		}
	}
	e.generation++
	e.mu.Unlock()
	e.notifyChange()
}

// Access is what a transfer needs from a region: read or write it.
type Access uint8

const (
	AccessLocal Access = iota // the engine's own buffer: no permission needed
	AccessRemoteRead
	AccessRemoteWrite
)

// Acquire finds the registered region that contains [addr, addr+n), checks
// that access is permitted, and holds it until Release, so unregistering
// waits for the transfer.
func (e *Engine) Acquire(addr, n uint64, access Access) (*Region, error) {
	if n == 0 || n > math.MaxUint64-addr {
		return nil, status.Errorf(status.InvalidArgument, "bad range %#x+%#x", addr, n)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	s := e.index.find(addr, addr+n)
	if s == nil || s.state != committed {
		e.mu.Unlock()
		return nil, status.Errorf(status.NotRegistered, "[%#x, %#x) is not registered", addr, addr+n)
	}
	r := s.region
	if !r.Contains(addr, n) {
		e.mu.Unlock()
		return nil, status.Errorf(status.OutOfRange,
			"[%#x, %#x) is not inside registered region [%#x, %#x)", addr, addr+n, r.Addr, r.End())
	}
	if !r.Permits(access) {
		e.mu.Unlock()
		return nil, status.Errorf(status.PermissionDenied,
			"region [%#x, %#x) does not permit remote %s", r.Addr, r.End(), accessVerb(access))
	}
	if r.closing.Load() {
		e.mu.Unlock()
		return nil, status.Errorf(status.NotRegistered, "region [%#x, %#x) is being unregistered", r.Addr, r.End())
	}
	r.users.Add(1)
	e.mu.Unlock()
	return r, nil
}

// addUses takes n more uses of r, which the caller already uses, without
// the engine's lock and index: requests of a batch mostly lie in the
// region of the request before, and their uses are taken together, once
// a run. It reports false, having taken none, when an unregister of r has
// started. While the caller's use holds r, r stays registered, so the only
// change to look for is an unregister that started: its closing flag is
// read after the uses count, so the unregister either refuses these uses
// or waits for them. A nil r or n of 0 takes nothing and reports true.
func (r *Region) addUses(n int64) bool {
	if r == nil || n == 0 {
		return true
	}
	r.users.Add(n)
	if r.closing.Load() {
		r.releaseN(n)
		return false
	}
	return true
}

// Release ends a use started by Acquire.
func (e *Engine) Release(r *Region) { r.release() }

func accessVerb(a Access) string {
	if a == AccessRemoteWrite {
		return "write"
	}
	return "read"
}
