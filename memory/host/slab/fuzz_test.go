//go:build unix

package slab

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

const (
	fuzzPerChunk  = 4
	fuzzMaxChunks = 3
	fuzzCapacity  = fuzzPerChunk * fuzzMaxChunks
)

// FuzzSlabOps reads the input as a sequence of (op, arg) byte pairs and
// checks every result against a model of the slab: which blocks are live,
// what each one holds, which old Block values are stale.
func FuzzSlabOps(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 5, 0, 8, 0, 10, 0, 0, 0})                     // alloc, free, stale free, double FreePtr, realloc
	f.Add([]byte{0, 0, 1, 0, 2, 0, 12, 1, 10, 1, 14, 0, 14, 1, 14, 2, 15}) // FreePtr, foreign pointers, close
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 3, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 15, 0, 0, 0, 5, 0, 8, 0, 10, 0, 12, 0, 14, 0, 15, 0}) // everything after close
	f.Add([]byte{0, 1, 5, 1, 0, 2, 9, 0, 5, 0, 9, 0, 11, 0, 13, 0, 0, 0, 6, 0, 8, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 2048 {
			data = data[:2048]
		}
		mapped, open := MappedBytes(), OpenSlabs()
		m := newModel(t)
		for i := 0; i+1 < len(data); i += 2 {
			m.step(data[i], data[i+1])
			if t.Failed() {
				t.Logf("failed at op %d (%#x %#x)", i/2, data[i], data[i+1])
				return
			}
		}
		if len(data)%2 == 1 {
			m.step(data[len(data)-1], 0)
		}
		m.close()
		if MappedBytes() != mapped || OpenSlabs() != open {
			t.Fatalf("after Close: %d bytes mapped in %d slabs, want %d in %d", MappedBytes(), OpenSlabs(), mapped, open)
		}
	})
}

type liveBlock struct {
	b   Block
	tag byte
}

type model struct {
	t       *testing.T
	s       *Slab
	other   *Slab // for foreign blocks and pointers
	ob      Block
	live    []liveBlock
	freed   []Block // stale values, newest last
	closed  bool
	nextTag byte
}

func newModel(t *testing.T) *model {
	s, err := New(64, fuzzPerChunk, WithMaxChunks(fuzzMaxChunks))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(64, fuzzPerChunk)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := other.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	return &model{t: t, s: s, other: other, ob: ob}
}

func (m *model) slotLive(b Block) (int, bool) {
	for i, l := range m.live {
		if l.b.chunk == b.chunk && l.b.index == b.index {
			return i, true
		}
	}
	return -1, false
}

// expect checks err: ErrClosed once closed, else the given code (OK: nil).
func (m *model) expect(op string, err error, code status.Code) {
	m.t.Helper()
	if m.closed {
		code = status.Closed
	}
	if got := status.CodeOf(err); got != code {
		m.t.Errorf("%s: got %v (%v), want %v", op, got, err, code)
	}
}

func (m *model) step(op, arg byte) {
	t := m.t
	switch op % 16 {
	case 0, 1, 2, 3, 4:
		m.alloc()
	case 5, 6, 7: // free a live block, checking its contents first
		if len(m.live) == 0 {
			return
		}
		i := int(arg) % len(m.live)
		l := m.live[i]
		m.verify(l)
		m.expect("Free", m.s.Free(l.b), status.OK)
		if !m.closed {
			m.drop(i)
		}
	case 8, 9: // free a stale Block: double free or freed and reused since
		if len(m.freed) == 0 {
			return
		}
		b := m.freed[int(arg)%len(m.freed)]
		m.expect("Free(stale)", m.s.Free(b), status.InvalidArgument)
	case 10, 11: // FreePtr of a block that is not allocated
		if len(m.freed) == 0 {
			return
		}
		b := m.freed[int(arg)%len(m.freed)]
		if m.closed {
			m.expect("FreePtr(freed)", m.s.FreePtr(nil), status.Closed)
			return
		}
		if _, reused := m.slotLive(b); reused {
			return // a raw pointer cannot tell; it would free the new owner
		}
		err := m.s.FreePtr(rawPtr(m.s, b))
		m.expect("FreePtr(freed)", err, status.InvalidArgument)
	case 12, 13: // FreePtr of a live block, as C would
		if len(m.live) == 0 {
			return
		}
		i := int(arg) % len(m.live)
		l := m.live[i]
		p := l.b.Ptr()
		if m.closed != (p == nil) {
			t.Errorf("Ptr of live block %v = %p with closed=%v", l.b, p, m.closed)
		}
		m.verify(l)
		m.expect("FreePtr(live)", m.s.FreePtr(p), status.OK)
		if !m.closed {
			m.drop(i)
		}
	case 14: // foreign pointers and Blocks
		var err error
		switch arg % 4 {
		case 0:
			err = m.s.FreePtr(m.ob.Ptr())
		case 1:
			if len(m.live) == 0 || m.closed {
				return
			}
			err = m.s.FreePtr(unsafe.Add(m.live[int(arg)%len(m.live)].b.Ptr(), 1+int(arg)%63))
		case 2:
			err = m.s.Free(m.ob)
		case 3:
			var x [8]byte
			err = m.s.FreePtr(unsafe.Pointer(&x[0]))
		}
		m.expect("foreign free", err, status.InvalidArgument)
	case 15:
		m.closeSlab()
	}
	if !m.closed {
		st := m.s.Stats()
		if st.InUse != len(m.live) || st.Allocs-st.Frees != uint64(len(m.live)) {
			t.Errorf("stats %+v, model has %d live blocks", st, len(m.live))
		}
	}
}

func (m *model) alloc() {
	b, err := m.s.Alloc()
	switch {
	case m.closed:
		m.expect("Alloc", err, status.Closed)
		return
	case len(m.live) == fuzzCapacity:
		m.expect("Alloc at capacity", err, status.NoMemory)
		return
	}
	m.expect("Alloc", err, status.OK)
	if err != nil {
		return
	}
	if _, dup := m.slotLive(b); dup {
		m.t.Errorf("Alloc returned %v, already live", b)
	}
	m.nextTag++
	l := liveBlock{b, m.nextTag}
	mem := b.Bytes()
	if len(mem) != 64 {
		m.t.Fatalf("Bytes of %v: %d bytes", b, len(mem))
	}
	for i := range mem {
		mem[i] = l.tag
	}
	m.live = append(m.live, l)
	// The Block value of a previous life of this block is stale now, not
	// a double free: both must still be refused.
}

func (m *model) verify(l liveBlock) {
	err := m.s.Access(l.b, func(mem []byte) {
		for i, c := range mem {
			if c != l.tag {
				m.t.Errorf("block %v byte %d = %#x, want %#x", l.b, i, c, l.tag)
				return
			}
		}
	})
	m.expect("Access", err, status.OK)
}

func (m *model) drop(i int) {
	m.freed = append(m.freed, m.live[i].b)
	if len(m.freed) > 64 {
		m.freed = m.freed[1:]
	}
	m.live = append(m.live[:i], m.live[i+1:]...)
}

func (m *model) closeSlab() {
	err := m.s.Close()
	if !m.closed {
		if err != nil {
			m.t.Errorf("first Close: %v", err)
		}
		if st := m.s.Stats(); st.OutstandingAtClose != len(m.live) || !st.Closed || st.BytesMapped != 0 {
			m.t.Errorf("stats after Close %+v, model has %d live blocks", st, len(m.live))
		}
		m.closed = true
		return
	}
	if !errors.Is(err, status.ErrClosed) {
		m.t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

func (m *model) close() {
	if !m.closed {
		m.closeSlab()
	}
	if err := m.other.Close(); err != nil {
		m.t.Errorf("close other slab: %v", err)
	}
}
