package handles

import (
	"fmt"
	"sync"

	"github.com/tent-dev/tent/status"
)

// Kind tells what a handle refers to; a lookup names the kind it expects.
type Kind uint8

const (
	Engine Kind = iota + 1
	Region
	Segment
	Batch
)

func (k Kind) String() string {
	switch k {
	case Engine:
		return "engine"
	case Region:
		return "region"
	case Segment:
		return "segment"
	case Batch:
		return "batch"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

type entry struct {
	kind   Kind
	parent uint64
	value  any
}

// Table is a concurrency-safe handle table. The zero value is not usable; use
// NewTable.
type Table struct {
	mu      sync.RWMutex
	next    uint64
	entries map[uint64]entry
}

// NewTable returns an empty table whose first id is 1.
func NewTable() *Table {
	return &Table{entries: make(map[uint64]entry)}
}

// Add stores v and returns its new, never-before-used id. parent is 0 or the
// id of the handle whose destruction must also invalidate this one.
func (t *Table) Add(kind Kind, parent uint64, v any) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	id := t.next
	t.entries[id] = entry{kind: kind, parent: parent, value: v}
	return id
}

// Get returns the value of id, or ErrInvalidHandle if id is unknown, stale or
// of another kind.
func (t *Table) Get(kind Kind, id uint64) (any, error) {
	t.mu.RLock()
	e, ok := t.entries[id]
	t.mu.RUnlock()
	if err := check(kind, id, e, ok); err != nil {
		return nil, err
	}
	return e.value, nil
}

// Remove deletes id and returns its value; a second Remove of the same id
// returns ErrInvalidHandle.
func (t *Table) Remove(kind Kind, id uint64) (any, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[id]
	if err := check(kind, id, e, ok); err != nil {
		return nil, err
	}
	delete(t.entries, id)
	return e.value, nil
}

// RemoveChildren deletes every entry whose parent is id and returns their
// values. It does not remove id itself.
func (t *Table) RemoveChildren(id uint64) []any {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []any
	for cid, e := range t.entries {
		if e.parent == id {
			out = append(out, e.value)
			delete(t.entries, cid)
		}
	}
	return out
}

// Len returns the number of live handles of every kind.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.entries)
}

// CountChildren returns the number of live handles whose parent is id.
func (t *Table) CountChildren(id uint64) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, e := range t.entries {
		if e.parent == id {
			n++
		}
	}
	return n
}

func check(kind Kind, id uint64, e entry, ok bool) error {
	switch {
	case id == 0:
		return status.Errorf(status.InvalidHandle, "null %s handle", kind)
	case !ok:
		return status.Errorf(status.InvalidHandle, "unknown or destroyed %s handle %#x", kind, id)
	case e.kind != kind:
		return status.Errorf(status.InvalidHandle, "handle %#x is a %s handle, expected a %s handle", id, e.kind, kind)
	}
	return nil
}
