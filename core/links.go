package core

import "sync"

// links is the set of an engine's live control links to its peers (the
// initiator's side), with their reader goroutines. The engine's Close
// refuses new links (refuse), closes the live ones (closeAll) and waits
// for their readers (wait). It has its own lock: links come and go while
// the engine's lock is held for other work.
type links struct {
	mu      sync.Mutex
	refused bool
	set     map[*link]struct{}
	readers sync.WaitGroup // counted under mu, so wait never races an add
}

func newLinks() *links { return &links{set: map[*link]struct{}{}} }

// track records a new link and counts its reader, unless the engine is
// closing.
func (s *links) track(l *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused {
		return false
	}
	s.set[l] = struct{}{}
	s.readers.Add(1)
	return true
}

// untrack forgets a link whose reader is ending; the reader calls
// readerDone after it.
func (s *links) untrack(l *link) {
	s.mu.Lock()
	delete(s.set, l)
	s.mu.Unlock()
}

func (s *links) readerDone() { s.readers.Done() }

// refuse makes every later track fail.
func (s *links) refuse() {
	s.mu.Lock()
	s.refused = true
	s.mu.Unlock()
}

// closeAll closes every live link.
func (s *links) closeAll() {
	s.mu.Lock()
	ls := make([]*link, 0, len(s.set))
	for l := range s.set {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
}

// wait returns once every link's reader has ended.
func (s *links) wait() { s.readers.Wait() }

// len is the number of live links.
func (s *links) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.set)
}
