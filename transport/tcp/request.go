package tcp

import (
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
	s.mu.Unlock()
	if fire {
		s.complete(err)
	}
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
