package cuda

import (
	"time"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// importKey names an import: the target engine's incarnation, its
// allocation id (never reused within an incarnation) and the local device
// the mapping is made accessible to. Never an address: a restarted or
// reallocating peer may reuse one.
type importKey struct {
	inc   uint64
	alloc uint64
	dev   int
}

// entry is one cached import. m records exactly what it holds; the entry
// is released (m.Release) when it is dead and its last user is done.
// Fields other than the immutable ones are guarded by Transport.mu.
type entry struct {
	key        importKey
	base, size uint64 // the allocation at the target
	gen        uint64 // Transport.gen when imported
	ready      chan struct{}

	m    *cu.Mapping // nil until ready, after a failure, and once released
	err  error
	refs int
	dead bool // out of the cache; released when refs drops to 0
}

// take removes m from the entry for release (Uninstall, with no user
// left).
func (ent *entry) take() *cu.Mapping {
	m := ent.m
	ent.m = nil
	ent.dead = true
	return m
}

// peerView is what the cache last checked of a peer.
type peerView struct {
	epoch uint64
	inc   uint64
	gen   uint64
}

// acquireEntry returns the import for key with a reference, importing it
// with get on a miss (once, however many batches want it). The generation
// rule: an entry is used only if it is alive and was imported in the
// current generation of the transport.
func (t *Transport) acquireEntry(key importKey, base, size uint64, get func() (*cu.Mapping, error), deadline time.Time) (*entry, *cu.Mapping, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, nil, core.ErrUninstalled
	}
	ent := t.cache[key]
	if ent != nil && (ent.gen != t.gen || ent.dead) {
		rel := t.killLocked(ent)
		ent = nil
		if rel != nil {
			t.mu.Unlock()
			_ = t.releaseMapping(rel)
			t.mu.Lock()
		}
	}
	if ent = t.cache[key]; ent != nil {
		ent.refs++
		t.mu.Unlock()
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		select {
		case <-ent.ready:
		case <-timer.C:
			t.unref(ent)
			return nil, nil, status.Errorf(status.Timeout, "cuda: waiting for an import of allocation %d: deadline exceeded", key.alloc)
		}
		t.mu.Lock()
		m, err := ent.m, ent.err
		t.mu.Unlock()
		if err == nil && m == nil {
			err = status.Errorf(status.Internal, "cuda: import of allocation %d was released while in use", key.alloc)
		}
		if err == nil && (ent.base != base || ent.size != size) {
			err = status.Errorf(status.Protocol, "cuda: allocation %d moved from [%#x, +%d) to [%#x, +%d)",
				key.alloc, ent.base, ent.size, base, size)
		}
		if err != nil {
			t.unref(ent)
			return nil, nil, err
		}
		return ent, m, nil
	}
	ent = &entry{key: key, base: base, size: size, gen: t.gen, ready: make(chan struct{}), refs: 1}
	t.cache[key] = ent
	t.mu.Unlock()

	m, err := get()
	if err == nil {
		t.importsTotal.Add(1)
		t.liveMappings.Add(1)
	} else {
		t.importFailures.Add(1)
	}
	t.mu.Lock()
	ent.m, ent.err = m, err
	if err != nil || ent.gen != t.gen {
		// A failed import leaves nothing behind (the driver package undid
		// its steps); an import that raced with Uninstall is not cached.
		if t.cache[key] == ent {
			delete(t.cache, key)
		}
		ent.dead = true
	}
	close(ent.ready)
	t.mu.Unlock()
	if err != nil {
		t.unref(ent)
		return nil, nil, err
	}
	return ent, m, nil
}

// unref drops a reference; the last user of a dead entry releases it.
func (t *Transport) unref(ent *entry) {
	t.mu.Lock()
	ent.refs--
	var m *cu.Mapping
	if ent.refs == 0 && ent.dead {
		m = ent.take()
	}
	t.mu.Unlock()
	if m != nil {
		_ = t.releaseMapping(m)
	}
}

// killLocked takes ent out of the cache; it returns the mapping to release
// when nobody uses it, else its last user releases it.
func (t *Transport) killLocked(ent *entry) *cu.Mapping {
	if t.cache[ent.key] == ent {
		delete(t.cache, ent.key)
	}
	ent.dead = true
	if ent.refs == 0 {
		return ent.take()
	}
	return nil
}

// killWhere kills the cached entries whose key matches and releases the
// unused ones.
func (t *Transport) killWhere(match func(importKey) bool) {
	t.mu.Lock()
	var rel []*cu.Mapping
	for k, ent := range t.cache {
		if match(k) {
			if m := t.killLocked(ent); m != nil {
				rel = append(rel, m)
			}
		}
	}
	t.mu.Unlock()
	for _, m := range rel {
		_ = t.releaseMapping(m)
	}
}

// revoked: the target says these allocations are gone.
func (t *Transport) revoked(inc uint64, allocs []uint64) {
	if t.noInvalidate.Load() {
		return
	}
	set := make(map[uint64]bool, len(allocs))
	for _, a := range allocs {
		set[a] = true
	}
	t.killWhere(func(k importKey) bool { return k.inc == inc && set[k.alloc] })
}

// sessionDied forgets a dead session and the imports of its target: a
// target we cannot reach cannot grant leases, and a target that exited
// keeps its memory alive only through our mappings.
func (t *Transport) sessionDied(s *session) {
	t.mu.Lock()
	if t.sessions[s.key] == s {
		delete(t.sessions, s.key)
	}
	t.mu.Unlock()
	t.killWhere(func(k importKey) bool { return k.inc == s.key.inc })
}

// observe invalidates the cache for a peer whose descriptor changed: all
// imports of an incarnation the peer no longer has, and the imports of
// allocations that left its descriptor.
func (t *Transport) observe(p *core.Peer, routed *wire.SegmentDesc) {
	if t.noInvalidate.Load() {
		return
	}
	ep := p.Epoch()
	desc := p.Desc()
	if desc == nil || desc.Incarnation != routed.Incarnation {
		desc = routed
	}
	t.mu.Lock()
	v, seen := t.peers[p]
	if seen && v.epoch == ep && v.inc == desc.Incarnation && v.gen == desc.Generation {
		t.mu.Unlock()
		return
	}
	t.peers[p] = peerView{epoch: ep, inc: desc.Incarnation, gen: desc.Generation}
	var oldSess []*session
	if seen && v.inc != desc.Incarnation {
		for k, s := range t.sessions {
			if k.inc == v.inc {
				oldSess = append(oldSess, s)
			}
		}
	}
	t.mu.Unlock()
	for _, s := range oldSess {
		s.fail(status.Errorf(status.TransportError, "cuda: %s restarted", s.name))
	}
	live := map[uint64]bool{}
	for i := range desc.Regions {
		if a := desc.Regions[i].AllocID; a != 0 {
			live[a] = true
		}
	}
	t.killWhere(func(k importKey) bool {
		return (seen && v.inc != desc.Incarnation && k.inc == v.inc) || (k.inc == desc.Incarnation && !live[k.alloc])
	})
}

// streamPool holds a device's streams (round robin) and spare events.
type streamPool struct {
	streams []*cu.Stream
	next    int
	events  []*cu.Event // created, currently unused
}

// stream returns a stream of dev, creating the pool's streams on demand.
func (t *Transport) stream(dev int) (*cu.Stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, core.ErrUninstalled
	}
	p := t.pools[dev]
	if p == nil {
		p = &streamPool{}
		t.pools[dev] = p
	}
	if len(p.streams) < streamsPerDevice {
		s, err := t.d.NewStream(dev)
		if err != nil {
			if len(p.streams) == 0 {
				return nil, err
			}
		} else {
			p.streams = append(p.streams, s)
			return s, nil
		}
	}
	s := p.streams[p.next%len(p.streams)]
	p.next++
	return s, nil
}

func (t *Transport) getEvent(dev int) (*cu.Event, error) {
	t.mu.Lock()
	p := t.pools[dev]
	if p != nil && len(p.events) > 0 {
		ev := p.events[len(p.events)-1]
		p.events = p.events[:len(p.events)-1]
		t.mu.Unlock()
		return ev, nil
	}
	t.mu.Unlock()
	return t.d.NewEvent(dev)
}

// putEvent returns an event to its pool, or destroys it when the pool is
// gone (Uninstall destroys the pooled ones).
func (t *Transport) putEvent(dev int, ev *cu.Event) {
	t.mu.Lock()
	p := t.pools[dev]
	if p != nil && !t.closed {
		p.events = append(p.events, ev)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	_ = ev.Destroy()
}

// fence waits for the work queued on s so far and returns its error: an
// event recorded after the copies, waited for with a host function when
// the driver has them (no thread blocked), then queried for the outcome.
func (t *Transport) fence(s *cu.Stream, deadline time.Time) error {
	ev, err := t.getEvent(s.Device())
	if err != nil {
		return s.Synchronize()
	}
	if err := ev.Record(s); err != nil {
		_ = ev.Destroy()
		return s.Synchronize()
	}
	defer t.putEvent(s.Device(), ev)
	if t.d.Features().HostFunc {
		ch := make(chan struct{})
		if s.LaunchHostFunc(func() { close(ch) }) == nil {
			timer := time.NewTimer(time.Until(deadline) + leaseGrace)
			select {
			case <-ch:
			case <-timer.C: // late: fall back to waiting on the event
			}
			timer.Stop()
		}
	}
	if done, err := ev.Query(); err != nil || done {
		return err
	}
	return ev.Synchronize()
}
