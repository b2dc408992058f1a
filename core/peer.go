package core

import (
	"crypto/subtle"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Peer is this engine's view of another engine (or of itself): its cached
// descriptor, its control link, and whether it lives in this process. One
// Peer serves every Segment handle opened on the same name.
type Peer struct {
	e    *Engine
	name string
	refs int // open segments and opens in progress; guarded by e.mu

	mu         sync.Mutex
	desc       *wire.SegmentDesc
	stale      bool
	local      *Engine // the peer engine when it lives in this process
	link       *link
	refreshing chan struct{} // non-nil while a refresh runs (single flight)
	staleCount uint64        // invalidations so far; one during a refresh keeps it stale
	epoch      atomic.Uint64 // bumps whenever the descriptor is replaced

	lastRoute atomic.Pointer[routeChoice] // the last transport choice logged
}

// routeChoice is a transport chosen for a peer at an epoch: logged once.
type routeChoice struct {
	transport string
	epoch     uint64
}

// Name is the segment name the peer was opened with.
func (p *Peer) Name() string { return p.name }

// Local returns the peer engine when it lives in this process, else nil.
func (p *Peer) Local() *Engine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.local
}

// Epoch changes whenever the peer's descriptor is replaced; transports key
// caches of peer mappings on it so they never reuse a stale one.
func (p *Peer) Epoch() uint64 { return p.epoch.Load() }

// Desc returns the cached descriptor (nil before the first resolve).
func (p *Peer) Desc() *wire.SegmentDesc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desc
}

// cached returns a descriptor usable without any network round trip: a
// live in-process peer's own, or an up-to-date cached one; else nil.
func (p *Peer) cached() *wire.SegmentDesc {
	p.mu.Lock()
	local, d, stale := p.local, p.desc, p.stale
	p.mu.Unlock()
	if local != nil {
		if local.Closed() {
			return nil
		}
		ld, err := local.Descriptor()
		if err != nil {
			return nil
		}
		return ld
	}
	if d == nil || stale {
		return nil
	}
	return d
}

// invalidate marks the cached descriptor stale; the next transfer
// refreshes it first.
func (p *Peer) invalidate() {
	p.mu.Lock()
	p.stale = true
	p.staleCount++
	p.mu.Unlock()
}

// descriptor returns the peer's descriptor, refreshing it when force is
// set or the cache is stale. Concurrent callers share one refresh.
func (p *Peer) descriptor(force bool, deadline time.Time) (*wire.SegmentDesc, error) {
	for {
		p.mu.Lock()
		if local := p.local; local != nil {
			if !local.Closed() {
				p.mu.Unlock()
				return local.Descriptor()
			}
			p.local = nil // that engine is gone; resolve the name again
			p.epoch.Add(1)
		}
		if p.desc != nil && !p.stale && !force {
			d := p.desc
			p.mu.Unlock()
			return d, nil
		}
		if wait := p.refreshing; wait != nil {
			p.mu.Unlock()
			select {
			case <-wait:
				force = false // take the result of that refresh
				continue
			case <-time.After(time.Until(deadline)):
				return nil, status.Errorf(status.Timeout, "resolving segment %q timed out", p.name)
			}
		}
		done := make(chan struct{})
		p.refreshing = done
		seen := p.staleCount
		p.mu.Unlock()

		d, err := p.e.resolve(p, deadline)
		p.mu.Lock()
		p.refreshing = nil
		if err != nil {
			p.e.log.Debug("resolving peer failed", "peer", p.name, "err", err)
		}
		if err == nil {
			if p.desc == nil || p.desc.Incarnation != d.Incarnation || p.desc.Generation != d.Generation {
				epoch := p.epoch.Add(1)
				p.e.log.Debug("peer descriptor changed", "peer", p.name, "epoch", epoch,
					"incarnation", d.Incarnation, "generation", d.Generation, "regions", len(d.Regions))
			}
			// An invalidation that arrived during the refresh may describe a
			// change newer than what we fetched: keep the cache stale.
			p.desc, p.stale = d, p.staleCount != seen
		}
		p.mu.Unlock()
		close(done)
		return d, err
	}
}

// controlLink returns a live control link to the peer, dialing addr if
// needed.
func (p *Peer) controlLink(addr string, deadline time.Time) (*link, error) {
	p.mu.Lock()
	if l := p.link; l != nil && !l.dead() {
		p.mu.Unlock()
		return l, nil
	}
	p.mu.Unlock()
	l, err := p.e.dialLink(addr, deadline, func(inc, gen uint64) {
		p.mu.Lock()
		if p.desc == nil || p.desc.Incarnation != inc || p.desc.Generation != gen {
			p.stale = true
			p.staleCount++
		}
		p.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.link; old != nil && !old.dead() {
		l.close() // lost a race with another dialer
		return old, nil
	}
	p.link = l
	return l, nil
}

// controlAddr is where the peer's control service listens.
func controlAddr(d *wire.SegmentDesc) string {
	for _, ep := range d.Endpoints {
		if ep.Transport == wire.ControlEndpoint {
			return ep.Addr
		}
	}
	return ""
}

// resolve fetches p's descriptor: the directory says where the name
// leads, and the engine there answers over its control link.
func (e *Engine) resolve(p *Peer, deadline time.Time) (*wire.SegmentDesc, error) {
	// An engine of this process that answers to the name in this
	// directory's scope is reached directly: a scope grants a name to one
	// engine of a LocalPeers only (LocalPeers.add).
	if local := e.localPeers.lookup(e.scope, p.name); local != nil {
		if err := e.sameSecret(local); err != nil {
			return nil, err
		}
		p.mu.Lock()
		p.local = local
		p.mu.Unlock()
		return local.Descriptor()
	}
	d, err := e.dir.Resolve(p.name, deadline)
	if err != nil {
		return nil, err
	}
	addr := controlAddr(d)
	if addr == "" {
		return nil, status.Errorf(status.Protocol, "segment %q publishes no control endpoint", p.name)
	}
	l, err := p.controlLink(addr, deadline)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "segment %q: %w", p.name, err)
	}
	payload, err := l.call(ctlGetDesc, func(*wire.Encoder) {}, ctlDesc, deadline)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "segment %q: %w", p.name, err)
	}
	dec := wire.NewDecoder(payload)
	serr := dec.Status(p.name)
	raw := dec.Bytes(wire.MaxDescriptorSize)
	if err := dec.Finish(); err != nil {
		l.fail(err)
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	d, err = wire.UnmarshalSegmentDesc(raw)
	if err != nil {
		l.fail(err)
		return nil, status.Errorf(status.CodeOf(err), "segment %q sent a bad descriptor: %w", p.name, err)
	}
	// A descriptor that came over the network never makes the peer "local",
	// whatever incarnation it claims: a remote engine could repeat another
	// in-process engine's and have transfers copied into that one's memory.
	// In-process peers are found by name in the scope (above) only.
	return d, nil
}

// sameSecret holds engines of one process to the rule between processes:
// a peer is reached only with the secret it requires.
func (e *Engine) sameSecret(peer *Engine) error {
	if len(e.opts.Secret) != len(peer.opts.Secret) || subtle.ConstantTimeCompare(e.opts.Secret, peer.opts.Secret) != 1 {
		if len(peer.opts.Secret) == 0 && len(e.opts.Secret) == 0 {
			return nil
		}
		return status.Errorf(status.AuthFailed,
			"engine %q in this process requires a different secret", peer.name)
	}
	return nil
}

// notify delivers msg to the peer engine.
func (p *Peer) notify(msg []byte, deadline time.Time) error {
	if local := p.Local(); local != nil {
		return local.notes.push(p.e.Name(), msg)
	}
	d, err := p.descriptor(false, deadline)
	if err != nil {
		return err
	}
	addr := controlAddr(d)
	if addr == "" {
		addr = p.name
	}
	l, err := p.controlLink(addr, deadline)
	if err != nil {
		return err
	}
	payload, err := l.call(ctlNotify, func(enc *wire.Encoder) {
		enc.String(p.e.Name())
		enc.Bytes(msg)
	}, ctlNotifyDone, deadline)
	if err != nil {
		return err
	}
	dec := wire.NewDecoder(payload)
	serr := dec.Status(p.name)
	if err := dec.Finish(); err != nil {
		return err
	}
	return serr
}

// Segment is an open handle on a peer.
type Segment struct {
	peer   *Peer
	closed atomic.Bool
}

// Peer returns the peer the segment refers to.
func (s *Segment) Peer() *Peer { return s.peer }

// OpenSegment resolves name (waiting up to the engine's default timeout)
// and returns a handle on it.
func (e *Engine) OpenSegment(name string) (*Segment, error) {
	if name == "" {
		return nil, status.Errorf(status.InvalidArgument, "empty segment name")
	}
	if len(name) > wire.MaxNameLen {
		return nil, status.Errorf(status.InvalidArgument, "segment name longer than %d bytes", wire.MaxNameLen)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	p := e.peers[name]
	if p == nil {
		p = &Peer{e: e, name: name}
		e.peers[name] = p
	}
	p.refs++
	e.mu.Unlock()
	if _, err := p.descriptor(false, time.Now().Add(e.opts.DefaultTimeout)); err != nil {
		e.dropPeerRef(p)
		return nil, err
	}
	s := &Segment{peer: p}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, status.Errorf(status.Closed, "engine closed while opening %q", name)
	}
	e.segments[s] = struct{}{}
	e.mu.Unlock()
	e.log.Debug("segment opened", "peer", name, "local", p.Local() != nil)
	return s, nil
}

// dropPeerRef forgets a peer nobody has open any more, and closes its
// control link, so names tried once or used for a while do not pile up.
// Batches still in flight keep their *Peer; they only lose the cache.
func (e *Engine) dropPeerRef(p *Peer) {
	e.mu.Lock()
	p.refs--
	gone := p.refs == 0 && e.peers[p.name] == p
	if gone {
		delete(e.peers, p.name)
	}
	e.mu.Unlock()
	if gone {
		p.mu.Lock()
		l := p.link
		p.link = nil
		p.mu.Unlock()
		if l != nil {
			l.close()
		}
	}
}

// CloseSegment releases a segment handle; submitted transfers continue.
func (e *Engine) CloseSegment(s *Segment) error {
	if s == nil || s.peer.e != e {
		return status.Errorf(status.InvalidHandle, "segment does not belong to this engine")
	}
	if s.closed.Swap(true) {
		return status.Errorf(status.InvalidHandle, "segment already closed")
	}
	e.mu.Lock()
	delete(e.segments, s)
	e.mu.Unlock()
	e.dropPeerRef(s.peer)
	e.log.Debug("segment closed", "peer", s.peer.name)
	return nil
}
