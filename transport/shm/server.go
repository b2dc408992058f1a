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

	leases *lease.Table

	mu     sync.Mutex
	closed bool
	dead   chan struct{}       // closed by close
	sent   map[uint64]struct{} // allocation ids
	// Standing grants the initiator holds, one per (region, permission),
	// and the revokes of them it has not acknowledged yet.
	grants    map[grantKey]*standingGrant
	nextGrant uint64
	revokeSeq uint64
	acks      map[uint64]chan struct{} // revoke seq -> closed on REVOKE_ACK

	// shareFDs: the peer runs as our uid or as root (SO_PEERCRED), so it
	// may be sent memfds. Any other peer is served by process_vm only,
	// which the kernel refuses it unless it may ptrace us anyway.
	shareFDs bool
}

// grantKey names a standing grant on a connection: one per region and
// permission.
type grantKey struct {
	region *core.Region
	perm   core.Perm
}

// standingGrant is the target's record of a standing grant: checked once
// (Engine.Acquire, while the lease that created it pinned the region),
// valid until the region is unregistered (revoked then, synchronously) or
// the connection ends.
type standingGrant struct {
	desc   standingDesc
	region *core.Region
}

// admit starts serving an accepted connection (on the loop's goroutine).
func (t *Transport) admit(c *net.UnixConn, p *acceptloop.Pending) {
	sc := &serverConn{t: t, c: c, sent: map[uint64]struct{}{}, dead: make(chan struct{}),
		grants: map[grantKey]*standingGrant{}, acks: map[uint64]chan struct{}{},
		leases: lease.NewTable(t.e, lease.TableCounts{Held: &t.leases, Expired: &t.expired})}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		p.Done(false)
		_ = c.Close()
		p.Release()
		return
	}
	t.servers[sc] = struct{}{}
	t.spawnLocked(func() { sc.serve(p) })
}

func (sc *serverConn) serve(p *acceptloop.Pending) {
	t := sc.t
	defer func() {
		sc.close()
		p.Release()
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
		// Idle between leases, but a frame once begun must arrive
		// within the engine's timeout.
		typ, payload, err := wire.ReadFrameWithin(br, sc.c, maxFrame, buf, t.e.Options().DefaultTimeout)
		if err != nil {
			return
		}
		if cap(payload) > cap(buf) {
			buf = payload[:0]
		}
		switch typ {
		case frameLease, frameLeaseCached:
			if decodeLease(payload, &msg) != nil {
				return
			}
			if out, ents, err = sc.grant(&msg, typ == frameLeaseCached, out[:0], ents); err != nil {
				return
			}
		case frameRevokeAck:
			seq, err := decodeRevokeAck(payload)
			if err != nil {
				return
			}
			sc.acked(seq)
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
// granted allocations not yet sent on this connection. For a cached lease
// it also answers with standing grants for the regions it granted entries
// in (see standing). An error closes the connection.
func (sc *serverConn) grant(m *leaseMsg, cached bool, out []byte, ents []grantEntry) ([]byte, []grantEntry, error) {
	t := sc.t
	if h := t.hooks.grant.Load(); h != nil {
		(*h)()
	}
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
	var want wanted
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
		if cached {
			want.add(r, rg.Op, ents[i].alloc)
		}
	}
	gen := t.e.Generation() // after the acquisitions: every granted allocation is registered at gen
	if len(pins.Regions) > 0 {
		if err := sc.hold(m.ID, pins, att.fds, ttl+leaseGrace); err != nil {
			pins.Release(t.e)
			return out, ents, err
		}
	}
	// Standing grants are recorded and their frame written under wmu: a
	// REVOKE_GRANT for them (their region unregistered once this lease is
	// released) can only follow the frame that announces them.
	err = sc.sendGrant(func() []byte {
		if !cached {
			out = appendGrant(out, m.ID, gen, ttl, att.fds, ents)
		} else {
			out = appendGrantFrame(out, frameGrantCached, m.ID, gen, ttl, att.fds, sc.standing(&want), ents)
		}
		return out
	}, att.raw)
	return out, ents, err
}

// wanted collects, for one cached lease, the permissions its granted
// entries used per region.
type wanted struct {
	regions []wantedRegion
}

type wantedRegion struct {
	r     *core.Region
	perm  core.Perm
	alloc uint64
}

func (w *wanted) add(r *core.Region, op core.Op, alloc uint64) {
	need := core.PermRemoteWrite
	if op == core.OpRead {
		need = core.PermRemoteRead
	}
	for i := len(w.regions) - 1; i >= 0; i-- {
		if x := &w.regions[i]; x.r == r {
			x.perm |= need
			if alloc != 0 {
				x.alloc = alloc
			}
			return
		}
	}
	w.regions = append(w.regions, wantedRegion{r: r, perm: need, alloc: alloc})
}

// standing records a standing grant for every region of w the connection
// holds none for yet with the permission asked, and returns them to be
// announced. The lease's pins hold every such region, so it is
// registered and not yet handed to UnregisterMemory: its revoke comes
// later. The permission is what was asked, within what the region allows
// remotely (Engine.Acquire checked it for every entry). Past
// maxGrantsPerConn, or while the transport shuts down, none is made.
func (sc *serverConn) standing(w *wanted) []standingDesc {
	t := sc.t
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []standingDesc
	for _, x := range w.regions {
		perm := x.perm & x.r.Perm & (core.PermRemoteRead | core.PermRemoteWrite)
		if perm == 0 || sc.closed || t.closing.Load() || len(sc.grants) >= maxGrantsPerConn {
			continue
		}
		if sc.covered(x.r, perm) {
			continue
		}
		sc.nextGrant++
		g := &standingGrant{region: x.r, desc: standingDesc{id: sc.nextGrant, base: x.r.Addr, len: x.r.Len,
			perm: perm, alloc: x.alloc}}
		sc.grants[grantKey{x.r, perm}] = g
		t.grantsHeld.Add(1)
		out = append(out, g.desc)
	}
	return out
}

// covered reports whether the connection holds a standing grant on r for
// every bit of perm; sc.mu is held.
func (sc *serverConn) covered(r *core.Region, perm core.Perm) bool {
	var have core.Perm
	for _, p := range []core.Perm{core.PermRemoteRead, core.PermRemoteWrite, core.PermRemoteRead | core.PermRemoteWrite} {
		if sc.grants[grantKey{r, p}] != nil {
			have |= p
		}
	}
	return have&perm == perm
}

// admitLease says what the connection's state leaves for a new lease: an
// error (the connection is closed, or the peer reused a lease id) closes
// it; a refusal answers every entry (the transport shuts down, or the
// connection holds maxLeasesPerConn leases).
func (sc *serverConn) admitLease(id uint64) (refusal *grantEntry, err error) {
	sc.mu.Lock()
	closed := sc.closed
	sc.mu.Unlock()
	dup := sc.leases.Has(id)
	busy := sc.leases.Len() >= maxLeasesPerConn
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

// hold records a granted lease (its pins until ttl from now, and the
// descriptors about to go out) on the connection, unless the connection
// closed meanwhile.
func (sc *serverConn) hold(id uint64, pins lease.Pins, fds []grantFD, ttl time.Duration) error {
	if err := sc.leases.Hold(id, pins, ttl); err != nil {
		return err
	}
	sc.mu.Lock()
	for _, f := range fds {
		sc.sent[f.alloc] = struct{}{}
	}
	sc.mu.Unlock()
	return nil
}

// sendGrant writes the grant frame that frame builds, with its
// descriptors. frame runs under the write lock, so that what it records
// (standing grants) is announced before any later frame on the
// connection.
func (sc *serverConn) sendGrant(frame func() []byte, raw []int) error {
	t := sc.t
	// Counted before the write, so whoever receives the grant already
	// sees it counted; taken back if the write failed.
	t.fdsSent.Add(int64(len(raw)))
	sc.wmu.Lock()
	err := sc.writeLocked(frame(), raw)
	sc.wmu.Unlock()
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
	return sc.writeLocked(b, fds)
}

// writeLocked is write with sc.wmu held.
func (sc *serverConn) writeLocked(b []byte, fds []int) error {
	_ = sc.c.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	return lease.WriteFrame(sc.c, b, fds)
}

func (sc *serverConn) release(id uint64) { sc.leases.Release(id) }

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

// takeGrants removes the connection's standing grants on the regions
// match selects and returns their ids (to revoke).
func (sc *serverConn) takeGrants(match func(*core.Region) bool) []uint64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var ids []uint64
	for k, g := range sc.grants {
		if match(k.region) {
			delete(sc.grants, k)
			sc.t.grantsHeld.Add(-1)
			ids = append(ids, g.desc.id)
		}
	}
	return ids
}

// revokeGrants sends REVOKE_GRANT for ids and returns the channels that
// close when the initiator acknowledges them; nil when the connection is
// gone (closed now if the write failed): its initiator holds nothing.
func (sc *serverConn) revokeGrants(ids []uint64) []chan struct{} {
	var acks []chan struct{}
	for len(ids) > 0 {
		n := min(len(ids), maxRevoke)
		sc.mu.Lock()
		if sc.closed {
			sc.mu.Unlock()
			return nil
		}
		sc.revokeSeq++
		seq := sc.revokeSeq
		ch := make(chan struct{})
		sc.acks[seq] = ch
		sc.mu.Unlock()
		if sc.write(appendRevokeGrant(nil, seq, ids[:n]), nil) != nil {
			sc.close()
			return nil
		}
		sc.t.revokesSent.Add(1)
		acks = append(acks, ch)
		ids = ids[n:]
	}
	return acks
}

// acked handles a REVOKE_ACK; an unknown seq (one given up on) is ignored.
func (sc *serverConn) acked(seq uint64) {
	sc.mu.Lock()
	ch := sc.acks[seq]
	delete(sc.acks, seq)
	sc.mu.Unlock()
	if ch != nil {
		sc.t.revokesAcked.Add(1) // before the wake-up: counted once Unregister returns
		close(ch)
	}
}

// close releases every lease and standing grant of the connection and
// closes it. Idempotent.
func (sc *serverConn) close() {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return
	}
	sc.closed = true
	close(sc.dead)
	sc.t.grantsHeld.Add(-int64(len(sc.grants)))
	clear(sc.grants)
	clear(sc.acks)
	sc.mu.Unlock()
	_ = sc.c.Close()
	sc.leases.Close()
}
