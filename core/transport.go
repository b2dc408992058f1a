package core

import (
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

// Factory makes a transport for an engine being created.
type Factory func() Transport

var (
	factoriesMu sync.Mutex
	factories   = map[string]Factory{}
	factoryOrd  []string
)

// RegisterTransport makes a transport available to engines under name.
// Transport packages call it from init; engines install them in the order
// they were registered, unless Options.Transports names them.
func RegisterTransport(name string, f Factory) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	if _, dup := factories[name]; !dup {
		factoryOrd = append(factoryOrd, name)
	}
	factories[name] = f
}

// preference is the default order of the built-in transports: the most
// direct path that can serve a request wins. Others follow in registration
// order.
var preference = []string{"local", "cuda", "shm", "tcp"}

// AvailableTransports lists the registered transport names in default
// preference order.
func AvailableTransports() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	out := make([]string, 0, len(factoryOrd))
	for _, name := range preference {
		if _, ok := factories[name]; ok {
			out = append(out, name)
		}
	}
	for _, name := range factoryOrd {
		if !slices.Contains(preference, name) {
			out = append(out, name)
		}
	}
	return out
}

func lookupFactory(name string) (Factory, bool) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	f, ok := factories[name]
	return f, ok
}

// installed wraps an installed transport with a gate that lets Uninstall
// wait for calls already inside it.
type installed struct {
	t    Transport
	gate gate
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
