package slab

import (
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

// DefaultAlignment is the block alignment used unless WithAlignment says
// otherwise: one cache line, so blocks written by different threads never
// share a line.
const DefaultAlignment = 64

const (
	// maxSlots keeps a block's number within a chunk-independent uint32, the
	// type of the free list.
	maxSlots = math.MaxUint32
	// genMask: per-block state is gen<<1 | inUse in a uint32.
	genMask = 1<<31 - 1
	inUse   = 1
)

var (
	nextID      atomic.Uint64
	mappedBytes atomic.Int64
	openSlabs   atomic.Int64
)

// MappedBytes returns the bytes currently mapped by all slabs of the
// process. It drops back when slabs are closed, so a test can compare it
// with its value before the test to find a slab that was never closed.
func MappedBytes() int64 { return mappedBytes.Load() }

// OpenSlabs returns the number of slabs created and not yet closed.
func OpenSlabs() int64 { return openSlabs.Load() }

// Option configures New.
type Option func(*config)

type config struct {
	align     int
	maxChunks int
	maxBytes  int64
	fd        int
	fdSet     bool
	fdOff     int64
}

// WithAlignment sets the block alignment, a power of two no larger than the
// page size. The block size is rounded up to a multiple of it.
func WithAlignment(n int) Option { return func(c *config) { c.align = n } }

// WithMaxChunks limits the slab to n chunks; 0 means no limit. Alloc fails
// with status.NoMemory once the limit is reached and no block is free.
func WithMaxChunks(n int) Option { return func(c *config) { c.maxChunks = n } }

// WithMaxBytes limits the mapped size to n bytes (whole chunks only, so the
// limit is n rounded down to a multiple of the chunk size); 0 means no limit.
// With WithMaxChunks too, the smaller limit applies.
func WithMaxBytes(n int64) Option { return func(c *config) { c.maxBytes = n } }

// WithFile maps chunks shared (MAP_SHARED) from fd instead of anonymous
// private memory, chunk i at offset+i*chunkSize, so the memory can be a
// memfd another process maps too. offset must be a multiple of the page
// size. New duplicates fd, so the caller may close its own copy; the slab
// closes the duplicate at Close. The slab does not grow the file: a chunk
// that would extend past the end of a regular file fails with
// status.NoMemory.
func WithFile(fd int, offset int64) Option {
	return func(c *config) { c.fd, c.fdSet, c.fdOff = fd, true, offset }
}

// Slab is a pool of fixed-size blocks in mmap'd chunks, safe for concurrent
// use. The zero value is not usable: create it with New. See the package
// documentation for the lifetime rules.
type Slab struct {
	id        uint64
	stride    int // block size after rounding; the distance between blocks
	perChunk  int
	chunkLen  int // stride*perChunk rounded up to the page size
	maxChunks int // 0: no limit
	fd        int // -1: anonymous memory
	fdOff     int64

	// Close protocol: an operation increments active and then checks
	// closing; Close sets closing and then waits for active to reach zero.
	// With sequentially consistent atomics at least one of the two sees the
	// other, so no operation can be inside while the chunks are unmapped.
	active  atomic.Int64
	closing atomic.Bool
	drainMu sync.Mutex
	drained *sync.Cond
	done    chan struct{} // closed when the first Close has finished

	failedAllocs atomic.Uint64
	failedFrees  atomic.Uint64

	mu          sync.Mutex // guards everything below
	closed      bool
	chunks      []chunk
	byAddr      []int    // chunk numbers sorted by base address, for FreePtr
	state       []uint32 // per slot: gen<<1 | inUse
	free        []uint32 // free slots, LIFO so recently used blocks are warm
	fresh       int      // slots [fresh, len(state)) have never been handed out
	mapped      int64
	inUse       int
	allocs      uint64
	frees       uint64
	quarantined int
	leaked      int // blocks still allocated when Close unmapped them
}

type chunk struct {
	mem  []byte
	base uintptr // address of mem[0], kept as an integer for comparisons
}

// New returns a slab of blocks of at least blockSize bytes, mapped
// blocksPerChunk blocks at a time as they are needed. Nothing is mapped
// until the first Alloc.
func New(blockSize, blocksPerChunk int, opts ...Option) (*Slab, error) {
	cfg := config{align: DefaultAlignment, fd: -1}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	page := os.Getpagesize()
	switch {
	case blockSize <= 0:
		return nil, status.Errorf(status.InvalidArgument, "slab: block size %d must be positive", blockSize)
	case blocksPerChunk <= 0:
		return nil, status.Errorf(status.InvalidArgument, "slab: blocks per chunk %d must be positive", blocksPerChunk)
	case blocksPerChunk > maxSlots:
		return nil, status.Errorf(status.InvalidArgument, "slab: blocks per chunk %d exceeds %d", blocksPerChunk, uint64(maxSlots))
	case cfg.align <= 0 || cfg.align&(cfg.align-1) != 0 || cfg.align > page:
		return nil, status.Errorf(status.InvalidArgument, "slab: alignment %d must be a power of two no larger than the page size %d", cfg.align, page)
	case cfg.maxChunks < 0:
		return nil, status.Errorf(status.InvalidArgument, "slab: max chunks %d must not be negative", cfg.maxChunks)
	case cfg.maxBytes < 0:
		return nil, status.Errorf(status.InvalidArgument, "slab: max bytes %d must not be negative", cfg.maxBytes)
	case cfg.fdSet && cfg.fd < 0:
		return nil, status.Errorf(status.InvalidArgument, "slab: file descriptor %d is invalid", cfg.fd)
	case cfg.fdSet && (cfg.fdOff < 0 || cfg.fdOff%int64(page) != 0):
		return nil, status.Errorf(status.InvalidArgument, "slab: file offset %d must be a non-negative multiple of the page size %d", cfg.fdOff, page)
	}
	if blockSize > math.MaxInt-cfg.align {
		return nil, status.Errorf(status.InvalidArgument, "slab: block size %d is too large", blockSize)
	}
	stride := roundUp(blockSize, cfg.align)
	if stride > (math.MaxInt-page)/blocksPerChunk {
		return nil, status.Errorf(status.InvalidArgument, "slab: a chunk of %d blocks of %d bytes is too large", blocksPerChunk, stride)
	}
	chunkLen := roundUp(stride*blocksPerChunk, page)
	maxChunks := cfg.maxChunks
	if cfg.maxBytes > 0 {
		n := cfg.maxBytes / int64(chunkLen)
		if n == 0 {
			return nil, status.Errorf(status.InvalidArgument, "slab: max bytes %d is smaller than one chunk (%d bytes)", cfg.maxBytes, chunkLen)
		}
		n = min(n, maxSlots) // more chunks than blocks can be numbered is moot
		if maxChunks == 0 || n < int64(maxChunks) {
			maxChunks = int(n)
		}
	}

	s := &Slab{
		id:        nextID.Add(1),
		stride:    stride,
		perChunk:  blocksPerChunk,
		chunkLen:  chunkLen,
		maxChunks: maxChunks,
		fd:        -1,
		fdOff:     cfg.fdOff,
		done:      make(chan struct{}),
	}
	s.drained = sync.NewCond(&s.drainMu)
	if cfg.fdSet {
		fd, err := dupFile(cfg.fd)
		if err != nil {
			return nil, status.Errorf(sysCode(err), "slab: duplicate file descriptor %d: %w", cfg.fd, err)
		}
		if _, _, err := fileSize(fd); err != nil {
			closeFile(fd)
			return nil, status.Errorf(sysCode(err), "slab: stat file descriptor %d: %w", cfg.fd, err)
		}
		s.fd = fd
	}
	openSlabs.Add(1)
	return s, nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// BlockSize returns the size of every block: the size given to New rounded
// up to the alignment.
func (s *Slab) BlockSize() int { return s.stride }

// enter registers an operation that may touch the mappings; false means the
// slab is closed (or closing) and the caller must not touch anything.
func (s *Slab) enter() bool {
	s.active.Add(1)
	if s.closing.Load() {
		s.leave()
		return false
	}
	return true
}

func (s *Slab) leave() {
	if s.active.Add(-1) == 0 && s.closing.Load() {
		s.drainMu.Lock()
		s.drained.Broadcast()
		s.drainMu.Unlock()
	}
}

func (s *Slab) errClosed(op string) error {
	return status.Errorf(status.Closed, "slab %d: %s on a closed slab", s.id, op)
}

// Alloc returns a free block, mapping a new chunk if none is free. It fails
// with status.NoMemory when the chunk limit is reached or mmap fails, and
// with an error wrapping status.ErrClosed once Close has started.
func (s *Slab) Alloc() (Block, error) {
	if !s.enter() {
		s.failedAllocs.Add(1)
		return Block{}, s.errClosed("alloc")
	}
	defer s.leave()
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, err := s.take()
	if err != nil {
		s.failedAllocs.Add(1)
		return Block{}, err
	}
	st := s.state[slot]
	// A zero state is a block never freed, hence never poisoned.
	if invariants && st != 0 {
		if off, ok := checkPoison(s.slotBytes(slot)); !ok {
			// Keep it free but off the free list: never handed out again.
			s.quarantined++
			s.failedAllocs.Add(1)
			c, i := s.split(slot)
			return Block{}, status.Errorf(status.Internal,
				"slab %d: write after free detected in block %d/%d at byte %d; block quarantined", s.id, c, i, off)
		}
	}
	s.state[slot] = st | inUse
	s.inUse++
	s.allocs++
	c, i := s.split(slot)
	return Block{s: s, chunk: uint32(c), index: uint32(i), gen: st >> 1}, nil
}

// take pops a free slot, or hands out a never-used one, or maps a chunk.
// Called with s.mu held.
func (s *Slab) take() (int, error) {
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return int(slot), nil
	}
	if s.fresh == len(s.state) {
		if err := s.grow(); err != nil {
			return 0, err
		}
	}
	s.fresh++
	return s.fresh - 1, nil
}

// grow maps one more chunk. Called with s.mu held; mapping under the lock is
// rare (once per blocksPerChunk allocations at most) and keeps Close simple.
func (s *Slab) grow() error {
	n := len(s.chunks)
	if s.maxChunks > 0 && n >= s.maxChunks {
		return status.Errorf(status.NoMemory, "slab %d: all %d blocks in use and the limit of %d chunks (%d bytes) is reached",
			s.id, s.inUse, s.maxChunks, int64(s.maxChunks)*int64(s.chunkLen))
	}
	if uint64(n+1)*uint64(s.perChunk) > maxSlots {
		return status.Errorf(status.NoMemory, "slab %d: block numbers exhausted after %d chunks", s.id, n)
	}
	var off int64
	if s.fd >= 0 {
		if int64(n+1) > (math.MaxInt64-s.fdOff)/int64(s.chunkLen) {
			return status.Errorf(status.NoMemory, "slab %d: file offset of chunk %d overflows", s.id, n)
		}
		off = s.fdOff + int64(n)*int64(s.chunkLen)
		size, regular, err := fileSize(s.fd)
		if err != nil {
			return status.Errorf(sysCode(err), "slab %d: stat backing file: %w", s.id, err)
		}
		// Touching a page past the end of a file raises SIGBUS, so refuse
		// the chunk rather than map it.
		if regular && size < off+int64(s.chunkLen) {
			return status.Errorf(status.NoMemory, "slab %d: backing file holds %d bytes, chunk %d needs %d",
				s.id, size, n, off+int64(s.chunkLen))
		}
	}
	mem, err := mapChunk(s.chunkLen, s.fd, off)
	if err != nil {
		code := sysCode(err)
		if code == status.Internal {
			code = status.NoMemory
		}
		return status.Errorf(code, "slab %d: map chunk %d (%d bytes): %w", s.id, n, s.chunkLen, err)
	}
	c := chunk{mem: mem, base: uintptr(unsafe.Pointer(&mem[0]))}
	s.chunks = append(s.chunks, c)
	at := sort.Search(len(s.byAddr), func(i int) bool { return s.chunks[s.byAddr[i]].base > c.base })
	s.byAddr = append(s.byAddr, 0)
	copy(s.byAddr[at+1:], s.byAddr[at:])
	s.byAddr[at] = n
	s.state = append(s.state, make([]uint32, s.perChunk)...)
	s.mapped += int64(s.chunkLen)
	mappedBytes.Add(int64(s.chunkLen))
	return nil
}

func (s *Slab) split(slot int) (c, i int) { return slot / s.perChunk, slot % s.perChunk }

// slotBytes returns the memory of a slot. Called with s.mu held on an open
// slab.
func (s *Slab) slotBytes(slot int) []byte {
	c, i := s.split(slot)
	off := i * s.stride
	return s.chunks[c].mem[off : off+s.stride : off+s.stride]
}

// Free returns b to the slab. A zero Block, a Block of another slab, a
// Block freed already (double free) or a stale Block (freed and allocated
// again since) fails with status.InvalidArgument and changes nothing. After
// Close it fails with an error wrapping status.ErrClosed.
func (s *Slab) Free(b Block) error {
	return s.freeSlot(func() (int, error) { return s.blockSlot(b) })
}

// freeSlot is what Free and FreePtr share: with the slab entered and s.mu
// held, find returns the slot to free, which must be in use; a failure
// (a closed slab, or find's error) counts in FailedFrees.
func (s *Slab) freeSlot(find func() (int, error)) error {
	if !s.enter() {
		s.failedFrees.Add(1)
		return s.errClosed("free")
	}
	defer s.leave()
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, err := find()
	if err != nil {
		s.failedFrees.Add(1)
		return err
	}
	s.release(slot, s.state[slot])
	return nil
}

// blockSlot is the slot of b if b is allocated; otherwise why Free must
// refuse it. Called with s.mu held.
func (s *Slab) blockSlot(b Block) (int, error) {
	slot, err := s.slotOf(b)
	if err != nil {
		return 0, err
	}
	if st := s.state[slot]; st != b.gen<<1|inUse {
		if st&inUse == 0 && st>>1 == (b.gen+1)&genMask {
			return 0, status.Errorf(status.InvalidArgument, "slab %d: double free of block %d/%d", s.id, b.chunk, b.index)
		}
		return 0, status.Errorf(status.InvalidArgument,
			"slab %d: stale block %d/%d (generation %d; the block has been freed and reused since)", s.id, b.chunk, b.index, b.gen)
	}
	return slot, nil
}

// slotOf validates b's slab and indices. Called with s.mu held.
func (s *Slab) slotOf(b Block) (int, error) {
	switch {
	case b.s == nil:
		return 0, status.Errorf(status.InvalidArgument, "slab %d: zero Block", s.id)
	case b.s != s:
		return 0, status.Errorf(status.InvalidArgument, "slab %d: block %d/%d belongs to slab %d", s.id, b.chunk, b.index, b.s.id)
	case int(b.chunk) >= len(s.chunks) || int(b.index) >= s.perChunk:
		return 0, status.Errorf(status.InvalidArgument, "slab %d: block %d/%d does not exist", s.id, b.chunk, b.index)
	}
	return int(b.chunk)*s.perChunk + int(b.index), nil
}

// release frees an in-use slot whose state is st. Called with s.mu held.
func (s *Slab) release(slot int, st uint32) {
	if invariants {
		poison(s.slotBytes(slot))
	}
	s.state[slot] = ((st>>1 + 1) & genMask) << 1
	s.free = append(s.free, uint32(slot))
	s.inUse--
	s.frees++
}

// FreePtr frees the block starting at p, a pointer obtained from Ptr or
// Bytes and passed through C. A pointer outside this slab's chunks, or not
// at the start of a block, fails with status.InvalidArgument ("foreign
// pointer"); so does a pointer to a block that is not allocated ("double
// free"). See the package documentation for what a raw pointer cannot
// detect. After Close it fails with an error wrapping status.ErrClosed.
func (s *Slab) FreePtr(p unsafe.Pointer) error {
	return s.freeSlot(func() (int, error) { return s.ptrSlot(p) })
}

// ptrSlot is the slot of the block at p if it is allocated; otherwise why
// FreePtr must refuse it. Called with s.mu held.
func (s *Slab) ptrSlot(p unsafe.Pointer) (int, error) {
	slot, err := s.locate(p)
	if err != nil {
		return 0, err
	}
	if st := s.state[slot]; st&inUse == 0 {
		c, i := s.split(slot)
		if st == 0 {
			return 0, status.Errorf(status.InvalidArgument, "slab %d: free of %p: block %d/%d was never allocated", s.id, p, c, i)
		}
		return 0, status.Errorf(status.InvalidArgument, "slab %d: double free of %p (block %d/%d)", s.id, p, c, i)
	}
	return slot, nil
}

// locate maps p to its slot. Called with s.mu held.
func (s *Slab) locate(p unsafe.Pointer) (int, error) {
	if p == nil {
		return 0, status.Errorf(status.InvalidArgument, "slab %d: free of a nil pointer", s.id)
	}
	addr := uintptr(p)
	at := sort.Search(len(s.byAddr), func(i int) bool { return s.chunks[s.byAddr[i]].base > addr }) - 1
	if at < 0 {
		return 0, status.Errorf(status.InvalidArgument, "slab %d: foreign pointer %p is not in any chunk of this slab", s.id, p)
	}
	n := s.byAddr[at]
	c := s.chunks[n]
	off := addr - c.base
	if off >= uintptr(len(c.mem)) {
		return 0, status.Errorf(status.InvalidArgument, "slab %d: foreign pointer %p is not in any chunk of this slab", s.id, p)
	}
	if off%uintptr(s.stride) != 0 {
		return 0, status.Errorf(status.InvalidArgument, "slab %d: foreign pointer %p is %d bytes into a block, not at its start",
			s.id, p, off%uintptr(s.stride))
	}
	i := int(off / uintptr(s.stride))
	if i >= s.perChunk {
		return 0, status.Errorf(status.InvalidArgument, "slab %d: foreign pointer %p is in the padding at the end of chunk %d", s.id, p, n)
	}
	return n*s.perChunk + i, nil
}

// Access calls f with the memory of b while holding the slab open: Close
// waits for f to return, so f may read and write mem without racing with
// the unmapping. It does not make b exclusive: coordinating with other
// users of the same block is up to the caller. mem must not be kept after f
// returns, and f must not call Close on this slab. Access fails, without
// calling f, like Free does for a Block that is not allocated, and with an
// error wrapping status.ErrClosed once Close has started.
func (s *Slab) Access(b Block, f func(mem []byte)) error {
	if !s.enter() {
		return s.errClosed("access")
	}
	defer s.leave()
	mem, err := s.live(b)
	if err != nil {
		return err
	}
	f(mem)
	return nil
}

// live returns the memory of b if b is allocated. The caller has entered.
func (s *Slab) live(b Block) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, err := s.slotOf(b)
	if err != nil {
		return nil, err
	}
	if s.state[slot] != b.gen<<1|inUse {
		return nil, status.Errorf(status.InvalidArgument, "slab %d: block %d/%d is not allocated (freed or stale)", s.id, b.chunk, b.index)
	}
	return s.slotBytes(slot), nil
}

// Close unmaps the slab's memory once no operation is running inside it; see
// the package documentation for the full contract. Blocks still allocated
// are unmapped too and counted in Stats().OutstandingAtClose. A second Close
// waits for the first to finish and returns an error wrapping
// status.ErrClosed.
func (s *Slab) Close() error {
	if !s.closing.CompareAndSwap(false, true) {
		<-s.done
		return status.Errorf(status.Closed, "slab %d: already closed", s.id)
	}
	defer close(s.done)
	s.drainMu.Lock()
	for s.active.Load() != 0 {
		s.drained.Wait()
	}
	s.drainMu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.leaked = s.inUse
	var err error
	for i := range s.chunks {
		if e := unmapChunk(s.chunks[i].mem); e != nil && err == nil {
			err = status.Errorf(status.Internal, "slab %d: unmap chunk %d: %w", s.id, i, e)
		}
	}
	mappedBytes.Add(-s.mapped)
	s.mapped = 0
	// Drop every reference to the mappings, and the index arrays with them.
	s.chunks, s.byAddr, s.state, s.free = nil, nil, nil, nil
	if s.fd >= 0 {
		if e := closeFile(s.fd); e != nil && err == nil {
			err = status.Errorf(status.Internal, "slab %d: close backing file: %w", s.id, e)
		}
		s.fd = -1
	}
	openSlabs.Add(-1)
	return err
}

// Stats is a snapshot of a slab's counters.
type Stats struct {
	ID             uint64 // process-unique slab number, as in error messages
	BlockSize      int    // bytes per block, after rounding
	BlocksPerChunk int
	ChunkBytes     int   // bytes per chunk, after rounding to the page size
	MaxChunks      int   // 0: no limit
	Chunks         int   // chunks mapped now (0 after Close)
	BytesMapped    int64 // bytes mapped now (0 after Close)
	InUse          int   // blocks allocated now; frozen at Close
	Allocs         uint64
	Frees          uint64
	FailedAllocs   uint64 // limit reached, mmap failed, closed, or quarantined
	// FailedFrees counts Free and FreePtr calls that were refused: double
	// frees, foreign pointers, stale or zero Blocks, and frees after Close.
	FailedFrees        uint64
	Quarantined        int  // blocks found written after free (tentinvariants only)
	OutstandingAtClose int  // blocks still allocated when Close unmapped them
	Closed             bool // Close has started; every operation now fails
}

// Stats returns the slab's counters. It works before, during and after
// Close.
func (s *Slab) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		ID:                 s.id,
		BlockSize:          s.stride,
		BlocksPerChunk:     s.perChunk,
		ChunkBytes:         s.chunkLen,
		MaxChunks:          s.maxChunks,
		Chunks:             len(s.chunks),
		BytesMapped:        s.mapped,
		InUse:              s.inUse,
		Allocs:             s.allocs,
		Frees:              s.frees,
		FailedAllocs:       s.failedAllocs.Load(),
		FailedFrees:        s.failedFrees.Load(),
		Quarantined:        s.quarantined,
		OutstandingAtClose: s.leaked,
		Closed:             s.closing.Load(),
	}
}

// Block is one allocated block: its slab, where it lies, and the generation
// of that place when it was allocated. It is a plain value, cheap to copy;
// the zero Block is no block. After Free or Close the value is stale and
// every method reports it as such.
type Block struct {
	s     *Slab
	chunk uint32
	index uint32
	gen   uint32
}

// IsZero reports whether b is the zero Block.
func (b Block) IsZero() bool { return b.s == nil }

// Bytes returns the block's memory, BlockSize bytes long (and with that
// capacity), or nil if b is zero, freed, stale or its slab is closed. The
// slice is valid until b is freed or the slab is closed.
func (b Block) Bytes() []byte {
	s := b.s
	if s == nil || !s.enter() {
		return nil
	}
	defer s.leave()
	mem, err := s.live(b)
	if err != nil {
		return nil
	}
	return mem
}

// Ptr returns the address of the block's first byte, for C, or nil where
// Bytes returns nil. Pass it back through FreePtr or use it only while the
// block is allocated and the slab open.
func (b Block) Ptr() unsafe.Pointer {
	mem := b.Bytes()
	if mem == nil {
		return nil
	}
	return unsafe.Pointer(&mem[0])
}

func (b Block) String() string {
	if b.s == nil {
		return "slab.Block{}"
	}
	return fmt.Sprintf("slab%d/%d/%d@%d", b.s.id, b.chunk, b.index, b.gen)
}
