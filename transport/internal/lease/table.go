package lease

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// TableCounts are the owner's counters; either may be nil.
type TableCounts struct {
	Held    *atomic.Int64 // leases held now
	Expired *atomic.Int64 // leases taken back at their deadline
}

// Table is the target's record of the leases one session holds: each is
// the pins of one grant, released exactly once, on whichever comes first
// of Release (the initiator gave it back), the lease's deadline (a stuck
// initiator cannot keep an unregister waiting past it) and Close (the
// session ended: a dead or killed initiator's socket closes). A Table is
// safe for concurrent use; expiry runs on its own timer.
type Table struct {
	e      *core.Engine
	counts TableCounts

	mu     sync.Mutex
	closed bool
	leases map[uint64]*held
}

type held struct {
	pins  Pins
	timer *time.Timer
}

// NewTable returns an empty table for a session served by e.
func NewTable(e *core.Engine, counts TableCounts) *Table {
	return &Table{e: e, counts: counts, leases: map[uint64]*held{}}
}

// Has reports whether lease id is held.
func (t *Table) Has(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.leases[id]
	return ok
}

// Len is the number of leases held.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.leases)
}

// Hold records pins as lease id until Release, Close or, at the latest,
// ttl from now. It fails with Closed once the table is closed and with
// Protocol for an id already held; either way the pins are the caller's
// to release.
func (t *Table) Hold(id uint64, pins Pins, ttl time.Duration) error {
	h := &held{pins: pins}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return status.Errorf(status.Closed, "lease: session closed")
	case t.leases[id] != nil:
		return status.Errorf(status.Protocol, "lease: lease id %d reused", id)
	}
	t.leases[id] = h
	h.timer = time.AfterFunc(ttl, func() {
		if t.take(id, h) {
			add(t.counts.Expired, 1)
		}
	})
	add(t.counts.Held, 1)
	return nil
}

// Release gives lease id back; an unknown id (expired already) is
// ignored. It reports whether a lease was released.
func (t *Table) Release(id uint64) bool {
	t.mu.Lock()
	h := t.leases[id]
	t.mu.Unlock()
	return h != nil && t.take(id, h)
}

// take removes h, if it is still lease id, and releases its pins.
func (t *Table) take(id uint64, h *held) bool {
	t.mu.Lock()
	if t.leases[id] != h {
		t.mu.Unlock()
		return false
	}
	delete(t.leases, id)
	t.mu.Unlock()
	h.timer.Stop()
	h.pins.Release(t.e)
	add(t.counts.Held, -1)
	return true
}

// Close releases every lease and makes later Holds fail. Idempotent.
func (t *Table) Close() {
	t.mu.Lock()
	t.closed = true
	ls := t.leases
	t.leases = map[uint64]*held{}
	t.mu.Unlock()
	for _, h := range ls {
		h.timer.Stop()
		h.pins.Release(t.e)
		add(t.counts.Held, -1)
	}
}

func add(c *atomic.Int64, n int64) {
	if c != nil {
		c.Add(n)
	}
}
