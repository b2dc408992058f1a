package core

import "sync"

// subscribers is the set of control connections this engine serves that
// asked to be told when its registrations change: each is a channel of
// capacity one that wake fills without blocking, so a connection that is
// behind gets one wake-up for many changes. It has its own lock: wake runs
// on every registration change, outside the engine's lock.
type subscribers struct {
	mu  sync.Mutex
	set map[chan struct{}]struct{}
}

func newSubscribers() *subscribers { return &subscribers{set: map[chan struct{}]struct{}{}} }

func (s *subscribers) add(ch chan struct{}) {
	s.mu.Lock()
	s.set[ch] = struct{}{}
	s.mu.Unlock()
}

func (s *subscribers) remove(ch chan struct{}) {
	s.mu.Lock()
	delete(s.set, ch)
	s.mu.Unlock()
}

// wake signals every subscriber.
func (s *subscribers) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.set {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
