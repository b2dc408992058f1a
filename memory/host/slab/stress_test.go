//go:build unix

package slab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
)

// TestConcurrentCloseStress runs goroutines that allocate, fill, verify and
// free blocks while another goroutine closes the slab at a random moment.
// Invariants: no block is held by two goroutines at once (checked both by a
// per-block owner word and by the pattern each goroutine writes into its
// blocks), nothing succeeds once Close has returned, an operation that saw
// the slab closed never sees it open again, and everything is unmapped at
// the end. A crash (SIGSEGV on unmapped memory) fails the test by itself.
func TestConcurrentCloseStress(t *testing.T) {
	baseline(t)
	rounds, workers := 40, 8
	if testing.Short() {
		rounds = 8
	}
	for round := range rounds {
		stressRound(t, uint64(round), workers)
		if t.Failed() {
			return
		}
	}
}

const (
	stressPerChunk  = 8
	stressMaxChunks = 4
	stressHold      = 3 // blocks a worker holds at most; 8*3 < 8*4
)

func stressRound(t *testing.T, seed uint64, workers int) {
	before := MappedBytes()
	s, err := New(200, stressPerChunk, WithMaxChunks(stressMaxChunks))
	require.NoError(t, err)

	owner := make([]atomic.Int32, stressPerChunk*stressMaxChunks)
	var closeReturned atomic.Bool
	var outstanding atomic.Int64 // allocated and not successfully freed
	// Mostly somewhere in the first 5ms, sometimes before the workers have
	// even started.
	rng := rand.New(rand.NewPCG(seed, 1))
	delay := time.Duration(rng.IntN(5000)) * time.Microsecond
	if rng.IntN(4) == 0 {
		delay = time.Duration(rng.IntN(100)) * time.Microsecond
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := stressWorker{
				s: s, id: int32(w + 1), owner: owner, closeReturned: &closeReturned,
				outstanding: &outstanding, rng: rand.New(rand.NewPCG(seed, uint64(w)+2)),
			}
			if err := w.run(); err != nil {
				errs <- fmt.Errorf("round %d worker %d: %w", seed, w.id, err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(delay)
		err := s.Close()
		closeReturned.Store(true)
		if err != nil {
			errs <- fmt.Errorf("round %d: Close: %w", seed, err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	st := s.Stats()
	require.True(t, st.Closed)
	require.Equal(t, int(outstanding.Load()), st.OutstandingAtClose)
	require.Equal(t, st.Allocs-st.Frees, uint64(st.OutstandingAtClose))
	require.Equal(t, before, MappedBytes())
}

type stressWorker struct {
	s             *Slab
	id            int32
	owner         []atomic.Int32
	closeReturned *atomic.Bool
	outstanding   *atomic.Int64
	rng           *rand.Rand
	held          []Block
	seq           uint32
}

// closedOr classifies an operation's error: ErrClosed ends the run; an error
// after Close returned, or any other error, is a violation.
func (w *stressWorker) closedOr(op string, err error, startedAfterClose bool) (bool, error) {
	switch {
	case errors.Is(err, status.ErrClosed):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("%s: unexpected error %w", op, err)
	case startedAfterClose:
		return false, fmt.Errorf("%s succeeded after Close returned", op)
	}
	return false, nil
}

func (w *stressWorker) run() error {
	for {
		after := w.closeReturned.Load()
		var closed bool
		var err error
		if len(w.held) < stressHold && (len(w.held) == 0 || w.rng.IntN(2) == 0) {
			closed, err = w.alloc(after)
		} else {
			closed, err = w.free(after)
		}
		if err != nil {
			return err
		}
		if closed {
			return w.afterClose()
		}
		if w.rng.IntN(4) == 0 {
			runtime.Gosched()
		}
	}
}

func (w *stressWorker) slot(b Block) int { return int(b.chunk)*stressPerChunk + int(b.index) }

func (w *stressWorker) alloc(after bool) (bool, error) {
	b, err := w.s.Alloc()
	if closed, err := w.closedOr("Alloc", err, after); closed || err != nil {
		return closed, err
	}
	w.outstanding.Add(1)
	if prev := w.owner[w.slot(b)].Swap(w.id); prev != 0 {
		return false, fmt.Errorf("block %v handed to worker %d while worker %d holds it", b, w.id, prev)
	}
	w.seq++
	seq := w.seq
	err = w.s.Access(b, func(mem []byte) {
		for i := range mem {
			mem[i] = byte(w.id)
		}
		binary.LittleEndian.PutUint32(mem, uint32(w.id))
		binary.LittleEndian.PutUint32(mem[4:], seq)
	})
	w.held = append(w.held, b)
	return w.closedOr("Access(fill)", err, after)
}

func (w *stressWorker) free(after bool) (bool, error) {
	b := w.held[0]
	w.held = w.held[1:]
	var bad error
	err := w.s.Access(b, func(mem []byte) {
		if id := binary.LittleEndian.Uint32(mem); id != uint32(w.id) {
			bad = fmt.Errorf("block %v: owner word is %d, want %d: shared with another goroutine", b, id, w.id)
			return
		}
		for i := 8; i < len(mem); i++ {
			if mem[i] != byte(w.id) {
				bad = fmt.Errorf("block %v: byte %d is %#x, want %#x", b, i, mem[i], byte(w.id))
				return
			}
		}
	})
	if bad != nil {
		return false, bad
	}
	if closed, err := w.closedOr("Access(verify)", err, after); closed || err != nil {
		return closed, err
	}
	// Give the block up before freeing it: the moment Free returns another
	// goroutine may own it.
	if got := w.owner[w.slot(b)].Swap(0); got != w.id {
		return false, fmt.Errorf("block %v: owner word is %d, want %d", b, got, w.id)
	}
	err = w.s.Free(b)
	if err == nil {
		w.outstanding.Add(-1)
	}
	return w.closedOr("Free", err, after)
}

// afterClose checks that every operation keeps failing with ErrClosed.
func (w *stressWorker) afterClose() error {
	ops := []func() error{
		func() error { _, err := w.s.Alloc(); return err },
		func() error { return w.s.FreePtr(nil) },
	}
	for _, b := range w.held {
		ops = append(ops,
			func() error { return w.s.Free(b) },
			func() error { return w.s.Access(b, func([]byte) { panic("Access callback ran after Close") }) },
		)
	}
	for i, op := range ops {
		if err := op(); !errors.Is(err, status.ErrClosed) {
			return fmt.Errorf("operation %d after the slab was seen closed returned %v, want ErrClosed", i, err)
		}
	}
	for _, b := range w.held {
		if b.Bytes() != nil || b.Ptr() != nil {
			return fmt.Errorf("block %v has memory after Close", b)
		}
	}
	return nil
}
