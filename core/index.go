package core

import (
	"github.com/google/btree"

	"github.com/tent-dev/tent/status"
)

type spanState uint8

const (
	reserved spanState = iota + 1
	committed
)

// span is one entry of the index: an in-flight reservation or a committed
// region. Spans never overlap each other.
type span struct {
	start, end uint64 // [start, end)
	state      spanState
	owner      uint64 // reservation that created it
	batchIdx   int    // position in that reservation's batch
	region     *Region
}

func spanLess(a, b *span) bool { return a.start < b.start }

// index is the interval set over committed regions and reservations. It is
// not safe for concurrent use: the engine lock guards it.
type index struct {
	tree      *btree.BTreeG[*span]
	nextOwner uint64
	reserved  int
	committed int
	bytes     uint64 // committed bytes

	// Reused by find (always under the engine lock), so a lookup on the
	// transfer path allocates nothing.
	pivot span
	last  *span
	visit func(*span) bool
}

func newIndex() *index {
	ix := &index{tree: btree.NewG[*span](16, spanLess)}
	ix.visit = func(s *span) bool { ix.last = s; return false }
	return ix
}

// find returns the span overlapping [start, end), or nil. Spans are disjoint
// and sorted, so the last span starting before end is the only candidate.
func (ix *index) find(start, end uint64) *span {
	ix.last = nil
	ix.pivot.start = end - 1
	ix.tree.DescendLessOrEqual(&ix.pivot, ix.visit)
	hit := ix.last
	ix.last = nil
	if hit == nil || hit.end <= start {
		return nil
	}
	return hit
}

// findContaining returns the committed span that fully contains
// [start, end), or nil.
func (ix *index) findContaining(start, end uint64) *span {
	s := ix.find(start, start+1)
	if s == nil || s.state != committed || s.end < end {
		return nil
	}
	return s
}

// interval is one [start, end) to reserve.
type interval struct{ start, end uint64 }

// reserve inserts all intervals as one reservation or none of them, and
// returns the reservation's spans in batch order.
func (ix *index) reserve(ivs []interval) ([]*span, error) {
	ix.nextOwner++
	owner := ix.nextOwner
	spans := make([]*span, 0, len(ivs))
	for i, iv := range ivs {
		if err := ix.conflict(owner, i, iv); err != nil {
			for _, s := range spans {
				ix.tree.Delete(s)
			}
			ix.reserved -= len(spans)
			return nil, err
		}
		s := &span{start: iv.start, end: iv.end, state: reserved, owner: owner, batchIdx: i}
		ix.tree.ReplaceOrInsert(s)
		ix.reserved++
		spans = append(spans, s)
	}
	return spans, nil
}

func (ix *index) conflict(owner uint64, i int, iv interval) error {
	s := ix.find(iv.start, iv.end)
	if s == nil {
		return nil
	}
	exact := s.start == iv.start && s.end == iv.end
	switch {
	case s.owner == owner:
		return status.Errorf(status.InvalidArgument,
			"batch entries %d and %d overlap: [%#x, %#x) and [%#x, %#x)",
			s.batchIdx, i, s.start, s.end, iv.start, iv.end)
	case exact && s.state == committed:
		return status.Errorf(status.AlreadyRegistered,
			"[%#x, %#x) is already registered", iv.start, iv.end)
	case exact:
		return status.Errorf(status.Busy,
			"an identical registration of [%#x, %#x) is in flight; retry", iv.start, iv.end)
	case s.state == committed:
		return status.Errorf(status.Overlap,
			"[%#x, %#x) overlaps registered region [%#x, %#x)", iv.start, iv.end, s.start, s.end)
	default:
		return status.Errorf(status.Overlap,
			"[%#x, %#x) overlaps an in-flight registration of [%#x, %#x)", iv.start, iv.end, s.start, s.end)
	}
}

// release removes a reservation's spans.
func (ix *index) release(spans []*span) {
	for _, s := range spans {
		ix.tree.Delete(s)
		ix.reserved--
	}
}

// commit promotes reserved spans to committed regions.
func (ix *index) commit(spans []*span, regions []*Region) {
	for i, s := range spans {
		s.state = committed
		s.region = regions[i]
		regions[i].span = s
		ix.reserved--
		ix.committed++
		ix.bytes += s.end - s.start
	}
}

// remove deletes a committed span.
func (ix *index) remove(s *span) {
	// The tree compares starts only: make sure it holds this very span.
	if got, ok := ix.tree.Get(s); !ok || got != s {
		return // already removed: counters stay right
	}
	ix.tree.Delete(s)
	ix.committed--
	ix.bytes -= s.end - s.start
}

// check verifies the index invariants; tests call it.
func (ix *index) check() error {
	var prev *span
	var err error
	res, com := 0, 0
	var bytes uint64
	ix.tree.Ascend(func(s *span) bool {
		if s.start >= s.end {
			err = status.Errorf(status.Internal, "empty span [%#x, %#x)", s.start, s.end)
			return false
		}
		if prev != nil && prev.end > s.start {
			err = status.Errorf(status.Internal, "spans [%#x, %#x) and [%#x, %#x) overlap",
				prev.start, prev.end, s.start, s.end)
			return false
		}
		if s.state == reserved {
			res++
		} else {
			com++
			bytes += s.end - s.start
		}
		prev = s
		return true
	})
	if err == nil && (res != ix.reserved || com != ix.committed || bytes != ix.bytes) {
		err = status.Errorf(status.Internal, "index counters drifted: reserved %d/%d committed %d/%d bytes %d/%d",
			res, ix.reserved, com, ix.committed, bytes, ix.bytes)
	}
	return err
}
