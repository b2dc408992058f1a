//go:build linux

package shm

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// serverConn is the target's side of one initiator connection: the leases
// it holds and the allocations whose descriptors went out on it.
type serverConn struct {
	t *Transport
	c *net.UnixConn

	wmu sync.Mutex // frames written by the serving goroutine and by revoke

	mu     sync.Mutex
	closed bool
	leases map[uint64]*heldLease
	sent   map[uint64]struct{} // allocation ids

	// shareFDs: the peer runs as our uid or as root (SO_PEERCRED), so it
	// may be sent memfds. Any other peer is served by process_vm only,
	// which the kernel refuses it unless it may ptrace us anyway.
	shareFDs bool
}

// heldLease pins the regions of the granted entries until it is released,
// its connection closes, or it expires.
type heldLease struct {
	regions []*core.Region // one pin each (a region may appear twice)
	expires time.Time
}

// admit starts serving an accepted connection (on the loop's goroutine).
func (t *Transport) admit(c *net.UnixConn, p *acceptloop.Pending) {
	sc := &serverConn{t: t, c: c, leases: map[uint64]*heldLease{}, sent: map[uint64]struct{}{}}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		p.Done(false)
		_ = c.Close()
		return
	}
	t.servers[sc] = struct{}{}
	t.spawnLocked(func() { sc.serve(p) })
}

func (sc *serverConn) serve(p *acceptloop.Pending) {
	t := sc.t
	defer func() {
		sc.close()
		t.mu.Lock()
		delete(t.servers, sc)
		t.mu.Unlock()
	}()
	peer, err := t.ln.Handshake(sc.c, p)
	if err != nil {
		return
	}
	// The listener admitted only our uid or root; checked again here
	// because a memfd is the one capability that outlives its lease.
	sc.shareFDs = acceptloop.SameUserOrRoot(peer.UID, uint32(os.Getuid()))
	br := bufio.NewReaderSize(sc.c, 64<<10)
	var (
		buf  []byte
		msg  leaseMsg
		out  []byte
		ents []grantEntry
	)
	for {
		typ, payload, err := wire.ReadFrame(br, maxFrame, buf)
		if err != nil {
			return
		}
		if cap(payload) > cap(buf) {
			buf = payload[:0]
		}
		switch typ {
		case frameLease:
			if decodeLease(payload, &msg) != nil {
				return
			}
			if out, ents, err = sc.grant(&msg, out[:0], ents); err != nil {
				return
			}
		case frameRelease:
			id, err := decodeRelease(payload)
			if err != nil {
				return
			}
			sc.release(id)
		default:
			return // not an initiator of this protocol
		}
	}
}

// grant checks every entry against the engine's registrations, pins what
// it grants, and answers with the per-entry codes, attaching the memfds of
// granted allocations not yet sent on this connection. An error closes the
// connection.
func (sc *serverConn) grant(m *leaseMsg, out []byte, ents []grantEntry) ([]byte, []grantEntry, error) {
	t := sc.t
	if h := testHookGrant.Load(); h != nil {
		(*h)()
	}
	now := time.Now()
	ttl := min(m.TTL, t.maxLease)
	refusal, err := sc.admitLease(m.ID)
	if err != nil {
		return out, ents, err
	}
	if cap(ents) < len(m.Ranges) {
		ents = make([]grantEntry, len(m.Ranges))
	}
	ents = ents[:len(m.Ranges)]
	var pins lease.Pins
	var att attachments
	for i, rg := range m.Ranges {
		if refusal != nil {
			ents[i] = *refusal
			continue
		}
		r, err := pins.Acquire(t.e, rg)
		if err != nil {
			ents[i] = grantEntry{code: status.CodeOf(err), msg: err.Error()}
			t.refused.Add(1)
			continue
		}
		ents[i] = grantEntry{code: status.OK, alloc: sc.share(r, &att)}
	}
	gen := t.e.Generation() // after the acquisitions: every granted allocation is registered at gen
	if len(pins.Regions) > 0 {
		if err := sc.hold(m.ID, pins.Regions, att.fds, now.Add(ttl+leaseGrace)); err != nil {
			pins.Release(t.e)
			return out, ents, err
		}
	}
	out = appendGrant(out, m.ID, gen, ttl, att.fds, ents)
	return out, ents, sc.sendGrant(out, att.raw)
}

// admitLease says what the connection's state leaves for a new lease: an
// error (the connection is closed, or the peer reused a lease id) closes
// it; a refusal answers every entry (the transport shuts down, or the
// connection holds maxLeasesPerConn leases).
func (sc *serverConn) admitLease(id uint64) (refusal *grantEntry, err error) {
	sc.mu.Lock()
	_, dup := sc.leases[id]
	busy := len(sc.leases) >= maxLeasesPerConn
	closed := sc.closed
	sc.mu.Unlock()
	switch {
	case closed:
		return nil, status.Errorf(status.Closed, "connection closed")
	case dup:
		return nil, status.Errorf(status.Protocol, "lease id %d reused", id)
	case sc.t.closing.Load():
		return &grantEntry{code: status.Closed, msg: "the target's shm transport is shutting down"}, nil
	case busy:
		return &grantEntry{code: status.Busy, msg: fmt.Sprintf("connection holds %d leases", maxLeasesPerConn)}, nil
	}
	return nil, nil
}

// attachments are the memfds one grant carries, described and raw, in
// attachment order.
type attachments struct {
	fds []grantFD
	raw []int
}

// share returns the allocation a granted entry in r may be copied
// through, attaching its memfd to the grant if this connection has not
// received it yet; 0 means process_vm.
func (sc *serverConn) share(r *core.Region, att *attachments) uint64 {
	a := r.Alloc
	if a == nil || a.FD < 0 || r.Loc.IsCUDA() || !r.HandleShareable() || !sc.shareFDs {
		// process_vm: the kernel's ptrace check decides, and tent hands
		// out nothing. A memfd would grant read-write access to the
		// whole allocation whatever its open mode (it can be reopened
		// through /proc/self/fd), so it goes only with a read-write
		// registration of the whole allocation, to a peer of our uid.
		return 0
	}
	if sc.hasSent(a.ID) {
		return a.ID
	}
	for _, f := range att.fds {
		if f.alloc == a.ID {
			return a.ID
		}
	}
	if len(att.fds) >= maxGrantFDs {
		return 0 // its descriptor goes with a later grant
	}
	att.fds = append(att.fds, grantFD{alloc: a.ID, base: a.Addr, size: a.Size, writable: true})
	att.raw = append(att.raw, a.FD)
	return a.ID
}

// hold records a granted lease (its pins, and the descriptors about to go
// out) on the connection, unless the connection closed meanwhile.
func (sc *serverConn) hold(id uint64, regions []*core.Region, fds []grantFD, expires time.Time) error {
	l := &heldLease{regions: regions, expires: expires}
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return status.Errorf(status.Closed, "connection closed")
	}
	sc.leases[id] = l
	for _, f := range fds {
		sc.sent[f.alloc] = struct{}{}
	}
	sc.mu.Unlock()
	sc.t.leases.Add(1)
	sc.t.scheduleReap(expires)
	return nil
}

// sendGrant writes a grant frame with its descriptors.
func (sc *serverConn) sendGrant(out []byte, raw []int) error {
	t := sc.t
	// Counted before the write, so whoever receives the grant already
	// sees it counted; taken back if the write failed.
	t.fdsSent.Add(int64(len(raw)))
	err := sc.write(out, raw)
	if err != nil {
		t.fdsSent.Add(-int64(len(raw)))
	}
	return err
}

func (sc *serverConn) hasSent(id uint64) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	_, ok := sc.sent[id]
	return ok
}

// write sends one frame, with descriptors attached to its first byte.
func (sc *serverConn) write(b []byte, fds []int) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_ = sc.c.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	return lease.WriteFrame(sc.c, b, fds)
}

func (sc *serverConn) release(id uint64) {
	sc.mu.Lock()
	l := sc.leases[id]
	delete(sc.leases, id)
	sc.mu.Unlock()
	if l != nil {
		releaseRegions(sc.t.e, l.regions)
		sc.t.leases.Add(-1)
	}
}

func releaseRegions(e *core.Engine, regions []*core.Region) {
	for _, r := range regions {
		e.Release(r)
	}
}

// revoke tells the initiator that allocations it may have mapped are gone.
func (sc *serverConn) revoke(ids []uint64) {
	sc.mu.Lock()
	var gone []uint64
	for _, id := range ids {
		if _, ok := sc.sent[id]; ok {
			delete(sc.sent, id)
			gone = append(gone, id)
		}
	}
	closed := sc.closed
	sc.mu.Unlock()
	if len(gone) == 0 || closed {
		return
	}
	for len(gone) > 0 {
		n := min(len(gone), maxRevoke)
		if sc.write(appendRevoke(nil, gone[:n]), nil) != nil {
			_ = sc.c.Close() // the serving goroutine cleans up
			return
		}
		gone = gone[n:]
	}
}

// close releases every lease of the connection and closes it. Idempotent.
func (sc *serverConn) close() {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return
	}
	sc.closed = true
	leases := sc.leases
	sc.leases = nil
	sc.mu.Unlock()
	_ = sc.c.Close()
	for _, l := range leases {
		releaseRegions(sc.t.e, l.regions)
		sc.t.leases.Add(-1)
	}
}

// expire takes back the leases whose time is up and returns the earliest
// expiry left (zero if none).
func (sc *serverConn) expire(now time.Time) time.Time {
	var next time.Time
	var dead []*heldLease
	sc.mu.Lock()
	for id, l := range sc.leases {
		if !now.Before(l.expires) {
			dead = append(dead, l)
			delete(sc.leases, id)
		} else if next.IsZero() || l.expires.Before(next) {
			next = l.expires
		}
	}
	sc.mu.Unlock()
	for _, l := range dead {
		releaseRegions(sc.t.e, l.regions)
		sc.t.leases.Add(-1)
		sc.t.expired.Add(1)
	}
	return next
}

// scheduleReap makes sure the reaper wakes by at.
func (t *Transport) scheduleReap(at time.Time) {
	t.mu.Lock()
	wake := t.nextReap.IsZero() || at.Before(t.nextReap)
	if wake {
		t.nextReap = at
	}
	t.mu.Unlock()
	if wake {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// reaper takes back expired leases, so a stuck initiator cannot keep the
// target's unregister waiting past a lease's deadline plus leaseGrace.
func (t *Transport) reaper() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-t.kick:
		case <-timer.C:
		}
		now := time.Now()
		t.mu.Lock()
		servers := make([]*serverConn, 0, len(t.servers))
		for sc := range t.servers {
			servers = append(servers, sc)
		}
		t.nextReap = time.Time{}
		t.mu.Unlock()
		var next time.Time
		for _, sc := range servers {
			if n := sc.expire(now); !n.IsZero() && (next.IsZero() || n.Before(next)) {
				next = n
			}
		}
		// A grant since the scan may have set an earlier time (and kicked).
		t.mu.Lock()
		if !next.IsZero() && (t.nextReap.IsZero() || next.Before(t.nextReap)) {
			t.nextReap = next
		}
		at := t.nextReap
		t.mu.Unlock()
		wait := time.Hour
		if !at.IsZero() {
			wait = max(time.Until(at), time.Millisecond)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}
