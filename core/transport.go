package core

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/tent-dev/tent/status"
)

// Transport is one way of moving bytes (local copy, shared memory, TCP,
// CUDA). The engine calls it to learn about memory registrations and to tear
// it down; data transports also implement Mover.
//
// RegisterMemory must be all or nothing: on error it has kept no state for
// any of the regions. The engine never calls RegisterMemory or
// UnregisterMemory after Uninstall has started, and never concurrently with
// Uninstall.
type Transport interface {
	Name() string
	Install(e *Engine) error
	RegisterMemory(regions []*Region) error
	UnregisterMemory(regions []*Region) error
	// Uninstall releases everything the transport acquired. In-flight
	// operations finish or fail with ErrClosed before it returns.
	Uninstall() error
	// Stats reports resource counts (fds, mappings, goroutines, ...), used by
	// leak checks.
	Stats() map[string]int64
}

// Availability is implemented by a transport that installs on machines
// where it can never serve (cuda without a driver or a GPU). Right after a
// successful Install the engine asks; a non-empty reason uninstalls it
// again, leaves it out of Transports and the descriptor, and shows in
// Stats().Unavailable. Install succeeds either way: asking for a transport
// this machine lacks is not an error.
type Availability interface {
	Unavailable() string
}

// KindControl is the channel kind of core's own connections (descriptors,
// change pushes, notifications). Every other kind belongs to the transport
// whose TransportSpec declares it.
const KindControl uint8 = 1

// TransportSpec is everything an engine knows of a transport before it
// installs it: one value per transport, exported by the transport's package
// (tcp.Spec(tcp.Options{...}), shm.Spec(), ...) and handed to the engine in
// Options.Available. Core names no transport: a new one (rdma) is a package
// with a Spec, and the program that builds engines lists it.
//
// The list is an engine option, not a package-level registry filled from
// init: two engines of one process may be built with different transports
// and different transport options, a test can build an engine with a toy
// transport without it leaking into other tests, and nothing an import does
// changes what an engine is.
type TransportSpec struct {
	// Name is what Options.Transports, TransferOptions.Transport and
	// endpoints call the transport; Transport.Name returns it.
	Name string
	// ID is reported in request statuses (RequestStatus.Transport, the C
	// API's TENT_TRANSPORT_*). Not TransportNone; unique in an engine.
	ID uint32
	// Rank orders the default preference (lower first): when
	// Options.Transports is nil, the engine installs every available
	// transport in rank order, and the first eligible one serves a
	// request. Ties keep the order of Options.Available.
	Rank int
	// Kinds are the channel kinds (see wire.ClientHandshake) the transport
	// serves on the engine's listener or on a listener of its own. They are
	// part of the wire protocol, so they are fixed numbers; an engine
	// refuses to be built when two specs declare one kind, or one declares
	// KindControl or 0, and refuses HandleConn for a kind no spec declares.
	Kinds []uint8
	// New makes the transport for an engine being created, with the
	// transport's options bound in by its package's Spec.
	New func() Transport
}

// TransportNone is the id of no transport (a request never dispatched, or
// served by a transport installed without a spec).
const TransportNone uint32 = 0

// transportSet is an engine's validated Options.Available.
type transportSet struct {
	specs  []TransportSpec // in rank order
	byKind map[uint8]string
}

// newTransportSet checks specs: names, ids and channel kinds unique, ids
// and kinds in range. A collision is an error when the engine is built,
// never a connection routed to the wrong transport.
func newTransportSet(specs []TransportSpec) (*transportSet, error) {
	s := &transportSet{specs: slices.Clone(specs), byKind: map[uint8]string{}}
	names := map[string]bool{}
	ids := map[uint32]string{}
	for _, sp := range s.specs {
		switch {
		case sp.Name == "":
			return nil, status.Errorf(status.InvalidArgument, "transport spec with an empty name")
		case names[sp.Name]:
			return nil, status.Errorf(status.InvalidArgument, "transport %q is available twice", sp.Name)
		case sp.ID == TransportNone:
			return nil, status.Errorf(status.InvalidArgument, "transport %q has id %d (TransportNone)", sp.Name, sp.ID)
		case ids[sp.ID] != "":
			return nil, status.Errorf(status.InvalidArgument, "transports %q and %q both have id %d", ids[sp.ID], sp.Name, sp.ID)
		case sp.New == nil:
			return nil, status.Errorf(status.InvalidArgument, "transport %q has no constructor", sp.Name)
		}
		names[sp.Name] = true
		ids[sp.ID] = sp.Name
		for _, k := range sp.Kinds {
			switch {
			case k == 0 || k == KindControl:
				return nil, status.Errorf(status.InvalidArgument, "transport %q declares channel kind %d, which core reserves", sp.Name, k)
			case s.byKind[k] != "":
				return nil, status.Errorf(status.InvalidArgument, "transports %q and %q both declare channel kind %d", s.byKind[k], sp.Name, k)
			}
			s.byKind[k] = sp.Name
		}
	}
	slices.SortStableFunc(s.specs, func(a, b TransportSpec) int { return cmp.Compare(a.Rank, b.Rank) })
	return s, nil
}

// names lists the available transports in rank order.
func (s *transportSet) names() []string {
	out := make([]string, len(s.specs))
	for i, sp := range s.specs {
		out[i] = sp.Name
	}
	return out
}

func (s *transportSet) lookup(name string) (TransportSpec, bool) {
	for _, sp := range s.specs {
		if sp.Name == name {
			return sp, true
		}
	}
	return TransportSpec{}, false
}

// installed wraps an installed transport with a gate that lets Uninstall
// wait for calls already inside it.
type installed struct {
	t        Transport
	id       uint32 // its spec's ID, or TransportNone
	forgets  bool   // t is a Forgetter
	byRegion bool   // t is a RegionEligible
	gate     gate
}

// gate counts calls inside a transport and, once closed, admits no more.
type gate struct {
	mu     sync.Mutex
	active int
	closed bool
	idle   *sync.Cond
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.active++
	return true
}

func (g *gate) exit() {
	g.mu.Lock()
	g.active--
	if g.active == 0 && g.idle != nil {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

// close stops new calls and waits for the active ones. It reports false if
// the gate was already closed.
func (g *gate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	if g.idle == nil {
		g.idle = sync.NewCond(&g.mu)
	}
	for g.active > 0 {
		g.idle.Wait()
	}
	return true
}

// safeCall runs f and turns a panic into an ErrInternal carrying the stack,
// so one faulty transport cannot take the host process down or skip the
// engine's cleanup.
func safeCall(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(status.Internal, "%s panicked: %v\n%s", what, r, debug.Stack())
		}
	}()
	if err := f(); err != nil {
		if !status.HasCode(err) {
			// An uncoded error from a transport is still a transport failure.
			return status.Errorf(status.TransportError, "%s: %w", what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
