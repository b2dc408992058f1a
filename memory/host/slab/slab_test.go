//go:build unix

package slab

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
)

// baseline records the process-wide counters and checks, after the test's
// own cleanups (which close its slabs), that they are back where they were.
// No test in this package runs in parallel, so the counters are the test's.
func baseline(t testing.TB) {
	t.Helper()
	mapped, open := MappedBytes(), OpenSlabs()
	t.Cleanup(func() {
		require.Equal(t, mapped, MappedBytes(), "mapped bytes not back to baseline: a slab was not closed")
		require.Equal(t, open, OpenSlabs(), "open slab count not back to baseline")
	})
}

// newSlab creates a slab closed at the end of the test (a second Close is
// harmless by contract).
func newSlab(t testing.TB, blockSize, perChunk int, opts ...Option) *Slab {
	t.Helper()
	s, err := New(blockSize, perChunk, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rawPtr is the address of b's block even when b is no longer allocated, as
// a C caller holding an old pointer would have it.
func rawPtr(s *Slab, b Block) unsafe.Pointer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return unsafe.Pointer(&s.slotBytes(int(b.chunk)*s.perChunk + int(b.index))[0])
}

func requireCode(t testing.TB, err error, code status.Code, contains string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.CodeOf(err), "error: %v", err)
	if contains != "" {
		require.Contains(t, err.Error(), contains)
	}
}

func TestNewBadArgs(t *testing.T) {
	baseline(t)
	page := os.Getpagesize()
	tests := []struct {
		name      string
		size, per int
		opts      []Option
		contains  string
	}{
		{"zero block size", 0, 8, nil, "block size"},
		{"negative block size", -1, 8, nil, "block size"},
		{"zero per chunk", 64, 0, nil, "blocks per chunk"},
		{"negative per chunk", 64, -3, nil, "blocks per chunk"},
		{"alignment zero", 64, 8, []Option{WithAlignment(0)}, "alignment"},
		{"alignment not power of two", 64, 8, []Option{WithAlignment(48)}, "alignment"},
		{"alignment above page", 64, 8, []Option{WithAlignment(2 * page)}, "alignment"},
		{"negative max chunks", 64, 8, []Option{WithMaxChunks(-1)}, "max chunks"},
		{"negative max bytes", 64, 8, []Option{WithMaxBytes(-1)}, "max bytes"},
		{"max bytes below one chunk", 64, 8, []Option{WithMaxBytes(int64(page) - 1)}, "smaller than one chunk"},
		{"negative fd", 64, 8, []Option{WithFile(-1, 0)}, "file descriptor"},
		{"unaligned file offset", 64, 8, []Option{WithFile(0, 100)}, "file offset"},
		{"closed fd", 64, 8, []Option{WithFile(1<<20, 0)}, "file descriptor"},
		{"block size overflow", int(^uint(0) >> 1), 1, nil, "too large"},
		{"chunk overflow", 1 << 40, 1 << 30, nil, "too large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.size, tc.per, tc.opts...)
			require.Nil(t, s)
			requireCode(t, err, status.InvalidArgument, tc.contains)
			require.True(t, errors.Is(err, status.ErrInvalidArgument))
		})
	}
}

func TestNewRounding(t *testing.T) {
	baseline(t)
	page := os.Getpagesize()
	tests := []struct {
		name       string
		size, per  int
		opts       []Option
		block      int
		chunkBytes int
		maxChunks  int
	}{
		{"tiny", 1, 1, nil, 64, page, 0},
		{"exact", 64, 64, nil, 64, page, 0},
		{"one over", 65, 10, nil, 128, page, 0},
		{"spans pages", 100, 100, nil, 128, roundUp(128*100, page), 0},
		{"align 8", 13, 4, []Option{WithAlignment(8)}, 16, page, 0},
		{"align 1", 3, 4, []Option{WithAlignment(1)}, 3, page, 0},
		{"align page", 1, 3, []Option{WithAlignment(page)}, page, 3 * page, 0},
		{"max bytes rounds down", 64, 64, []Option{WithMaxBytes(int64(3*page + 5))}, 64, page, 3},
		{"smaller limit wins", 64, 64, []Option{WithMaxChunks(5), WithMaxBytes(int64(2 * page))}, 64, page, 2},
		{"max chunks", 64, 64, []Option{WithMaxChunks(7), nil}, 64, page, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSlab(t, tc.size, tc.per, tc.opts...)
			require.Equal(t, tc.block, s.BlockSize())
			st := s.Stats()
			require.Equal(t, tc.block, st.BlockSize)
			require.Equal(t, tc.per, st.BlocksPerChunk)
			require.Equal(t, tc.chunkBytes, st.ChunkBytes)
			require.Equal(t, tc.maxChunks, st.MaxChunks)
			require.Zero(t, st.Chunks, "nothing is mapped before the first Alloc")
			require.Zero(t, st.BytesMapped)
		})
	}
}

func TestAllocFreeReuse(t *testing.T) {
	baseline(t)
	before := MappedBytes()
	s := newSlab(t, 100, 4) // 128-byte blocks, 4 per chunk
	const n = 10            // three chunks
	blocks := make([]Block, n)
	seen := map[uintptr]bool{}
	for i := range blocks {
		b, err := s.Alloc()
		require.NoError(t, err)
		require.False(t, b.IsZero())
		mem := b.Bytes()
		require.Len(t, mem, 128)
		require.Equal(t, 128, cap(mem))
		p := uintptr(b.Ptr())
		require.Equal(t, uintptr(unsafe.Pointer(&mem[0])), p)
		require.Zero(t, p%DefaultAlignment, "block %v is not aligned", b)
		require.False(t, seen[p], "address handed out twice")
		seen[p] = true
		for j := range mem {
			mem[j] = byte(i)
		}
		blocks[i] = b
	}
	st := s.Stats()
	require.Equal(t, 3, st.Chunks)
	require.Equal(t, int64(3*st.ChunkBytes), st.BytesMapped)
	require.Equal(t, before+st.BytesMapped, MappedBytes())
	require.Equal(t, n, st.InUse)

	// Blocks keep their contents while others come and go.
	for i, b := range blocks {
		require.Equal(t, byte(i), b.Bytes()[127])
	}

	// The last freed block is the next one handed out, as a new generation.
	old := blocks[5]
	oldPtr := old.Ptr()
	require.NoError(t, s.Free(old))
	require.Nil(t, old.Bytes(), "a freed Block has no memory")
	require.Nil(t, old.Ptr())
	requireCode(t, s.Access(old, func([]byte) { t.Fatal("called on a freed block") }), status.InvalidArgument, "not allocated")

	b, err := s.Alloc()
	require.NoError(t, err)
	require.Equal(t, oldPtr, b.Ptr())
	require.NotEqual(t, old, b)
	require.Equal(t, old.gen+1, b.gen)

	// The old value is now stale: it must not free the new owner's block.
	requireCode(t, s.Free(old), status.InvalidArgument, "stale block")
	require.NotNil(t, b.Bytes())
	blocks[5] = b

	for _, b := range blocks {
		require.NoError(t, s.Free(b))
	}
	st = s.Stats()
	require.Zero(t, st.InUse)
	require.Equal(t, uint64(n+1), st.Allocs)
	require.Equal(t, uint64(n+1), st.Frees)
	require.Equal(t, uint64(1), st.FailedFrees)
	require.Equal(t, 3, st.Chunks, "freed blocks stay mapped until Close")
}

func TestAccess(t *testing.T) {
	baseline(t)
	s := newSlab(t, 64, 8)
	b, err := s.Alloc()
	require.NoError(t, err)
	require.NoError(t, s.Access(b, func(mem []byte) {
		require.Len(t, mem, 64)
		copy(mem, "hello")
	}))
	require.Equal(t, "hello", string(b.Bytes()[:5]))

	other := newSlab(t, 64, 8)
	requireCode(t, other.Access(b, func([]byte) {}), status.InvalidArgument, "belongs to slab")
	requireCode(t, s.Access(Block{}, func([]byte) {}), status.InvalidArgument, "zero Block")
}

func TestExhaustion(t *testing.T) {
	page := os.Getpagesize()
	tests := []struct {
		name     string
		opts     []Option
		capacity int
	}{
		{"max chunks", []Option{WithMaxChunks(2)}, 2 * 4},
		{"max bytes", []Option{WithMaxBytes(int64(3 * page))}, 3 * 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			baseline(t)
			s := newSlab(t, 64, 4, tc.opts...)
			var blocks []Block
			for range tc.capacity {
				b, err := s.Alloc()
				require.NoError(t, err)
				blocks = append(blocks, b)
			}
			for range 3 {
				b, err := s.Alloc()
				require.True(t, b.IsZero())
				requireCode(t, err, status.NoMemory, "limit")
				require.True(t, errors.Is(err, status.ErrNoMemory))
			}
			st := s.Stats()
			require.Equal(t, uint64(3), st.FailedAllocs)
			require.Equal(t, tc.capacity, st.InUse)

			require.NoError(t, s.Free(blocks[1]))
			b, err := s.Alloc()
			require.NoError(t, err, "a freed block is available again at the limit")
			require.Equal(t, blocks[1].index, b.index)
			blocks[1] = b
			for _, b := range blocks {
				require.NoError(t, s.Free(b))
			}
			require.NoError(t, s.Close())
			require.Zero(t, s.Stats().OutstandingAtClose)
		})
	}
}

func TestDoubleFree(t *testing.T) {
	viaBlock := func(s *Slab, b Block) error { return s.Free(b) }
	viaPtr := func(s *Slab, b Block) error { return s.FreePtr(rawPtr(s, b)) }
	tests := []struct {
		name          string
		first, second func(*Slab, Block) error
	}{
		{"Free twice", viaBlock, viaBlock},
		{"FreePtr twice", viaPtr, viaPtr},
		{"Free then FreePtr", viaBlock, viaPtr},
		{"FreePtr then Free", viaPtr, viaBlock},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			baseline(t)
			s := newSlab(t, 64, 4)
			keep, err := s.Alloc() // a neighbour that must not be disturbed
			require.NoError(t, err)
			b, err := s.Alloc()
			require.NoError(t, err)
			require.NoError(t, tc.first(s, b))
			for range 2 {
				err = tc.second(s, b)
				requireCode(t, err, status.InvalidArgument, "double free")
				require.True(t, errors.Is(err, status.ErrInvalidArgument))
			}
			st := s.Stats()
			require.Equal(t, 1, st.InUse)
			require.Equal(t, uint64(1), st.Frees)
			require.Equal(t, uint64(2), st.FailedFrees)
			require.NotNil(t, keep.Bytes())

			// The block went back to the free list once, not twice.
			b1, err := s.Alloc()
			require.NoError(t, err)
			b2, err := s.Alloc()
			require.NoError(t, err)
			require.NotEqual(t, b1.Ptr(), b2.Ptr())
		})
	}
}

func TestForeignPointer(t *testing.T) {
	baseline(t)
	// 192-byte blocks, 5 per chunk: 960 bytes used, the rest of the page is
	// padding.
	s := newSlab(t, 192, 5)
	other := newSlab(t, 192, 5)
	b, err := s.Alloc()
	require.NoError(t, err)
	ob, err := other.Alloc()
	require.NoError(t, err)
	base := b.Ptr()
	goMem := make([]byte, 256)
	st := s.Stats()

	tests := []struct {
		name     string
		p        unsafe.Pointer
		contains string
	}{
		{"nil", nil, "nil pointer"},
		{"Go heap", unsafe.Pointer(&goMem[0]), "not in any chunk"},
		{"before chunk", unsafe.Add(base, -1), "not in any chunk"},
		{"one byte in", unsafe.Add(base, 1), "not at its start"},
		{"middle of block", unsafe.Add(base, 100), "not at its start"},
		{"chunk padding", unsafe.Add(base, 5*192), "padding"},
		{"past chunk end", unsafe.Add(base, st.ChunkBytes), "not in any chunk"},
		{"other slab", ob.Ptr(), "not in any chunk"},
		{"never allocated", unsafe.Add(base, 2*192), "never allocated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := s.Stats()
			requireCode(t, s.FreePtr(tc.p), status.InvalidArgument, tc.contains)
			after := s.Stats()
			require.Equal(t, before.FailedFrees+1, after.FailedFrees)
			require.Equal(t, before.InUse, after.InUse)
		})
	}

	blockTests := []struct {
		name     string
		b        Block
		contains string
	}{
		{"zero Block", Block{}, "zero Block"},
		{"other slab's Block", ob, "belongs to slab"},
		{"forged chunk", Block{s: s, chunk: 9}, "does not exist"},
		{"forged index", Block{s: s, index: 5}, "does not exist"},
		{"forged generation", Block{s: s, index: b.index, gen: b.gen + 7}, "stale"},
	}
	for _, tc := range blockTests {
		t.Run(tc.name, func(t *testing.T) {
			requireCode(t, s.Free(tc.b), status.InvalidArgument, tc.contains)
			if tc.b.s == s {
				require.Nil(t, tc.b.Bytes(), "Bytes must be nil for a block that is not allocated")
			}
		})
	}
	require.Equal(t, 1, s.Stats().InUse, "no failed free changed anything")
	require.NotNil(t, ob.Bytes(), "the other slab's block is untouched")
	require.NoError(t, s.FreePtr(base))
	require.NoError(t, other.FreePtr(ob.Ptr()))
}

func TestClose(t *testing.T) {
	baseline(t)
	before := MappedBytes()
	s, err := New(64, 4)
	require.NoError(t, err)
	var blocks []Block
	for range 6 {
		b, err := s.Alloc()
		require.NoError(t, err)
		blocks = append(blocks, b)
	}
	freed := blocks[5]
	freedPtr := freed.Ptr()
	require.NoError(t, s.Free(freed))
	live := blocks[0]
	livePtr := live.Ptr()
	require.Equal(t, before+2*int64(s.Stats().ChunkBytes), MappedBytes())

	require.NoError(t, s.Close(), "outstanding blocks do not make Close fail")
	st := s.Stats()
	require.True(t, st.Closed)
	require.Equal(t, 5, st.OutstandingAtClose)
	require.Equal(t, 5, st.InUse, "InUse is frozen at Close")
	require.Zero(t, st.Chunks)
	require.Zero(t, st.BytesMapped)
	require.Equal(t, before, MappedBytes())

	closedOps := []struct {
		name string
		op   func() error
	}{
		{"Alloc", func() error { _, err := s.Alloc(); return err }},
		{"Free outstanding", func() error { return s.Free(live) }},
		{"Free stale", func() error { return s.Free(freed) }},
		{"Free zero", func() error { return s.Free(Block{}) }},
		{"FreePtr outstanding", func() error { return s.FreePtr(livePtr) }},
		{"FreePtr stale", func() error { return s.FreePtr(freedPtr) }},
		{"FreePtr nil", func() error { return s.FreePtr(nil) }},
		{"Access", func() error {
			return s.Access(live, func([]byte) { t.Fatal("called after Close") })
		}},
		{"Close again", s.Close},
	}
	for _, tc := range closedOps {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			requireCode(t, err, status.Closed, "")
			require.True(t, errors.Is(err, status.ErrClosed))
		})
	}
	require.Nil(t, live.Bytes())
	require.Nil(t, live.Ptr())
	st = s.Stats()
	require.Equal(t, uint64(6), st.FailedFrees)
	require.Equal(t, uint64(1), st.FailedAllocs)
	require.Equal(t, 5, st.OutstandingAtClose)
}

func TestCloseUnused(t *testing.T) {
	baseline(t)
	s, err := New(64, 4)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	requireCode(t, s.Close(), status.Closed, "already closed")
}

// Close must wait for an Access in progress, and everything started after
// Close began must fail rather than wait or touch the memory.
func TestCloseWaitsForAccess(t *testing.T) {
	baseline(t)
	before := MappedBytes()
	s, err := New(64, 4)
	require.NoError(t, err)
	b, err := s.Alloc()
	require.NoError(t, err)

	inside, release := make(chan struct{}), make(chan struct{})
	accessDone := make(chan error)
	go func() {
		accessDone <- s.Access(b, func(mem []byte) {
			close(inside)
			<-release
			mem[0] = 42 // still mapped: Close is waiting for us
		})
	}()
	<-inside
	closeDone := make(chan error, 2)
	go func() { closeDone <- s.Close() }()
	go func() { closeDone <- s.Close() }()
	require.Eventually(t, func() bool { return s.Stats().Closed }, 5*time.Second, time.Millisecond)

	_, err = s.Alloc()
	requireCode(t, err, status.Closed, "closed slab")
	requireCode(t, s.Free(b), status.Closed, "")
	select {
	case err := <-closeDone:
		t.Fatalf("Close returned (%v) while an Access was running", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.NotZero(t, MappedBytes()-before, "unmapped under a running Access")

	close(release)
	require.NoError(t, <-accessDone)
	e1, e2 := <-closeDone, <-closeDone
	if e1 != nil {
		e1, e2 = e2, e1
	}
	require.NoError(t, e1, "exactly one Close does the work")
	requireCode(t, e2, status.Closed, "already closed")
	require.Equal(t, before, MappedBytes(), "both Close calls return only after the unmapping")
}

func TestStatsBackToBaseline(t *testing.T) {
	baseline(t)
	before := MappedBytes()
	var slabs []*Slab
	for i := range 4 {
		s, err := New(64*(i+1), 16)
		require.NoError(t, err)
		slabs = append(slabs, s)
	}
	for round := range 3 {
		for _, s := range slabs {
			var blocks []Block
			for range 40 {
				b, err := s.Alloc()
				require.NoError(t, err)
				blocks = append(blocks, b)
			}
			for i, b := range blocks {
				if i%2 == 0 {
					require.NoError(t, s.Free(b))
				} else {
					require.NoError(t, s.FreePtr(b.Ptr()))
				}
			}
			st := s.Stats()
			require.Zero(t, st.InUse)
			require.Equal(t, uint64(40*(round+1)), st.Allocs)
			require.Equal(t, st.Allocs, st.Frees)
			require.Zero(t, st.FailedFrees)
			require.Equal(t, 3, st.Chunks, "reuse, not growth, after the first round")
		}
	}
	require.Greater(t, MappedBytes(), before)
	var wg sync.WaitGroup
	errs := make([]error, len(slabs))
	for i, s := range slabs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Close()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, s := range slabs {
		require.Zero(t, s.Stats().OutstandingAtClose)
	}
	require.Equal(t, before, MappedBytes())
}

func TestWithFile(t *testing.T) {
	baseline(t)
	page := os.Getpagesize()
	f, err := os.CreateTemp(t.TempDir(), "slab")
	require.NoError(t, err)
	// Room for two chunks after a one-page offset.
	require.NoError(t, f.Truncate(int64(3*page)))
	s, err := New(64, page/64, WithFile(int(f.Fd()), int64(page)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	name := f.Name()
	require.NoError(t, f.Close(), "the slab keeps its own descriptor")

	var blocks []Block
	for i := range 2 * page / 64 {
		b, err := s.Alloc()
		require.NoError(t, err)
		mem := b.Bytes()
		copy(mem, strings.Repeat(string(rune('a'+i%26)), 64))
		blocks = append(blocks, b)
	}
	_, err = s.Alloc()
	requireCode(t, err, status.NoMemory, "backing file holds")

	// The mapping is shared: the file sees what was written.
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, byte('a'), data[page])
	require.Equal(t, byte('b'), data[page+64])
	require.Equal(t, byte(0), data[page-1], "nothing before the offset is touched")

	require.NoError(t, s.Free(blocks[0]))
	require.NoError(t, s.Close())
	require.Equal(t, 2*page/64-1, s.Stats().OutstandingAtClose)
}

func TestBlockString(t *testing.T) {
	baseline(t)
	require.Equal(t, "slab.Block{}", Block{}.String())
	require.True(t, Block{}.IsZero())
	require.Nil(t, Block{}.Bytes())
	require.Nil(t, Block{}.Ptr())
	s := newSlab(t, 64, 4)
	b, err := s.Alloc()
	require.NoError(t, err)
	require.Regexp(t, `^slab\d+/0/0@0$`, b.String())
}
