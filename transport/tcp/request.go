package tcp

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
)

// reqState follows one request through its chunks. It is the only place
// that decides when the request is complete, so Done is called exactly
// once, and never while a goroutine still touches the request's local
// memory:
//
//   - a goroutine that is about to read or write the local memory calls
//     enter, and exit when done; enter fails once the request is dead;
//   - a chunk that ends (reply received, or its connection failed) calls
//     chunkDone;
//   - kill (cancel, uninstall) makes the request dead at once.
//
// The request completes when it is dead or all chunks are done, and no
// goroutine is inside it. A dead request's remaining chunks still travel
// (their replies must be read to keep the stream in step) but their
// payloads go to scratch instead of local memory.
type reqState struct {
	t *Transport
	// r is the request this state completes. It is nil for a request
	// that is not a core.Request: a leg of a staged transfer
	// (staging.go's host-buffer copies) or Raw in the tests; such a
	// request reports its result on raw instead.
	r        *core.Request
	sub      *submission // the states it was taken with, nil if not reused
	raw      chan error
	op       uint8
	local    uint64
	remote   uint64
	n        uint64
	deadline time.Time
	conn     atomic.Pointer[conn] // the connection of its (last) chunk, for Help and Cancel

	mu        sync.Mutex
	staged    bool // the data went through host memory, here or at the target
	remaining int  // chunks not yet done
	busy      int  // goroutines inside the local memory
	dead      bool
	completed bool
	finished  bool // complete has returned
	released  bool // given back to sub: finished, no chunk left, no goroutine inside
	err       error
}

// chunk is the unit a connection carries: at most chunkSize bytes of one
// request.
type chunk struct {
	s   *reqState
	off uint64 // offset in the request
	n   uint32
	id  uint64 // assigned by the connection's writer
}

func (s *reqState) enter() bool {
	s.mu.Lock()
	ok := !s.dead
	if ok {
		s.busy++
	}
	s.mu.Unlock()
	return ok
}

func (s *reqState) isDead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// exit ends an enter.
func (s *reqState) exit() { s.settle(false, true, nil) }

// chunkDone ends one chunk with err (nil: its bytes arrived); with
// wasBusy it also ends the caller's enter.
func (s *reqState) chunkDone(err error, wasBusy bool) { s.settle(true, wasBusy, err) }

// kill makes the request dead with err.
func (s *reqState) kill(err error) { s.settle(false, false, err) }

func (s *reqState) settle(chunk, exit bool, err error) {
	s.mu.Lock()
	if chunk {
		s.remaining--
	}
	if exit {
		s.busy--
	}
	if err != nil && !s.dead {
		s.dead, s.err = true, err
	}
	fire := !s.completed && s.busy == 0 && (s.dead || s.remaining == 0)
	if fire {
		s.completed = true
		err = s.err
	}
	free := !fire && s.releasableLocked()
	s.mu.Unlock()
	if fire {
		s.complete(err)
		s.mu.Lock()
		s.finished = true
		free = s.releasableLocked()
		s.mu.Unlock()
	}
	if free {
		s.sub.unref()
	}
}

// releasableLocked reports, once, that s may be given back to its
// submission: complete has returned (a dead request completes before its
// last chunks are answered), no chunk is left and no goroutine is inside
// its memory. s.mu is held.
func (s *reqState) releasableLocked() bool {
	if s.sub == nil || !s.finished || s.remaining != 0 || s.busy != 0 || s.released {
		return false
	}
	s.released = true
	return true
}

// hold keeps s from being reused until unhold, for a goroutine that found
// it in t.reqs (under t.reqMu, where a state is only while it has not
// completed, so its submission is still held by it).
func (s *reqState) hold() {
	if s.sub != nil {
		s.sub.refs.Add(1)
	}
}

func (s *reqState) unhold() {
	if s.sub != nil {
		s.sub.unref()
	}
}

// submission holds the states and chunks of one Submit call, and is
// reused by a later call once all of them are given back. Fresh state for
// a batch of 128 requests is 22 KB of memory the runtime must clear, more
// than the transport's own work on the batch (docs/BENCHMARKS.md).
type submission struct {
	t      *Transport
	class  int // its place in t.free: 1<<class states
	n      int // states in use
	states []reqState
	chunks []chunk
	// refs counts the states in use not yet given back and the
	// goroutines holding one of them (hold); the last to let go returns
	// the submission to t.free.
	refs atomic.Int32
}

const (
	// subClasses: submissions of 1, 2, 4, ... 1<<(subClasses-1) states
	// are reused; a larger Submit call allocates its own.
	subClasses = 10
	// subFree bounds the submissions kept per class (about one per
	// batch in flight at once).
	subFree = 4
)

// takeSubmission returns a submission for n requests (n > 0) and
// nchunks chunks, reused if one is free; its states are to be set by the
// caller.
func (t *Transport) takeSubmission(n, nchunks int) *submission {
	class := bits.Len(uint(n - 1)) // the least class with 1<<class >= n
	var sub *submission
	if class >= subClasses {
		sub = &submission{t: t, class: -1, states: make([]reqState, n), chunks: make([]chunk, nchunks)}
	} else {
		t.freeMu.Lock()
		if l := t.free[class]; len(l) > 0 {
			sub = l[len(l)-1]
			l[len(l)-1] = nil
			t.free[class] = l[:len(l)-1]
		}
		t.freeMu.Unlock()
	}
	if sub == nil {
		sub = &submission{t: t, class: class, states: make([]reqState, 1<<class), chunks: make([]chunk, 1<<class)}
	}
	sub.n = n
	sub.refs.Store(int32(n))
	return sub
}

// chunksFor returns room for n chunks: the submission's own, or new ones
// for requests split into more chunks than it has.
func (sub *submission) chunksFor(n int) []chunk {
	if n <= len(sub.chunks) {
		return sub.chunks[:n]
	}
	return make([]chunk, n)
}

func (sub *submission) unref() {
	if sub.refs.Add(-1) != 0 {
		return
	}
	if sub.class < 0 {
		return
	}
	for i := range sub.states[:sub.n] {
		s := &sub.states[i]
		s.r, s.err = nil, nil // keep no batch or error alive while free
		s.conn.Store(nil)
	}
	t := sub.t
	t.freeMu.Lock()
	if len(t.free[sub.class]) < subFree {
		t.free[sub.class] = append(t.free[sub.class], sub)
	}
	t.freeMu.Unlock()
}

// markStaged records that the data went through host memory.
func (s *reqState) markStaged() {
	s.mu.Lock()
	s.staged = true
	s.mu.Unlock()
}

func (s *reqState) complete(err error) {
	t := s.t
	if s.r != nil {
		t.reqMu.Lock()
		delete(t.reqs, s.r)
		t.reqMu.Unlock()
	}
	t.inflight.Add(-1)
	n := s.n
	if err != nil {
		n = 0
	}
	if s.r == nil {
		s.raw <- err
		return
	}
	if err == nil && s.staged { // complete runs after the last settle: no lock needed
		s.r.MarkStaged()
	}
	s.r.Done(n, err)
}
