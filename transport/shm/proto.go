package shm

import (
	"encoding/binary"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// Frame types on an shm connection (after the handshake). The layouts are
// documented in doc.go.
const (
	frameLease   uint8 = 1 // initiator -> target
	frameGrant   uint8 = 2 // target -> initiator, may carry SCM_RIGHTS
	frameRelease uint8 = 3 // initiator -> target, no answer
	frameRevoke  uint8 = 4 // target -> initiator push, no answer

	// Standing grants: grants the initiator caches and reuses with no
	// round trip, which the target takes back synchronously.
	frameLeaseCached uint8 = 5 // initiator -> target: a LEASE that accepts standing grants
	frameGrantCached uint8 = 6 // target -> initiator: a GRANT with standing grants, may carry SCM_RIGHTS
	frameRevokeGrant uint8 = 7 // target -> initiator: take standing grants back; answered by REVOKE_ACK
	frameRevokeAck   uint8 = 8 // initiator -> target: no copy runs under those grants any more
)

// kindShm is the channel kind the initiator asks for in the handshake.
const kindShm uint8 = 3

// Limits of the protocol. They are part of the format: raising one needs a
// new handshake version.
const (
	// MaxLeaseEntries bounds the requests of one lease; larger submissions
	// are split into several leases.
	MaxLeaseEntries = 4096
	// maxGrantFDs bounds the descriptors attached to one grant (the kernel
	// allows 253 per message); allocations past it are served by
	// process_vm in that lease and get their descriptor in a later one.
	maxGrantFDs = 32
	// maxDenyMsg bounds the explanation of a denied entry.
	maxDenyMsg = lease.MaxAnswerMessage
	// maxRevoke bounds the allocation ids of one revoke frame.
	maxRevoke = 4096
	// maxGrantsPerConn bounds the standing grants one connection holds;
	// past it the target answers with ordinary leases only.
	maxGrantsPerConn = 4096
	// maxFrame bounds every frame: a cached grant of MaxLeaseEntries
	// denied entries with full messages (and the most standing grants one
	// grant can name) is the largest.
	maxFrame = 64 + maxGrantFDs*25 + MaxLeaseEntries*(4+4+maxDenyMsg) + 4 + MaxLeaseEntries*standingSize

	leaseHeadSize = lease.RequestHeadSize
	grantFDSize   = 8 + 8 + 8 + 1
	minGrantEntry = lease.MinAnswerEntry
	fdWritable    = 1 << 0
	standingSize  = 8 + 8 + 8 + 1 + 8
	maxMapSize    = 1 << 46 // same bound as core's allocations
)

// leaseEntry is one (op, remote addr, len) of a lease request, and
// leaseMsg a decoded request: the same-host lease request of package
// lease.
type (
	leaseEntry = lease.Range
	leaseMsg   = lease.Request
)

// grantFD describes one memfd attached to a grant, in attachment order.
type grantFD struct {
	alloc    uint64 // the target's allocation id (never 0)
	base     uint64 // the allocation's address in the target
	size     uint64 // bytes to map
	writable bool   // the descriptor is open read-write
}

// grantEntry is the target's answer for one lease entry.
type grantEntry struct {
	code  status.Code // OK or the reason of the refusal
	alloc uint64      // OK only: allocation to copy through, 0 = process_vm
	msg   string      // refusals only
}

// standingDesc is a standing grant as the target announces it: the exact
// range of one of its regions, the permission it covers, and the
// allocation its copies may go through (0: process_vm).
type standingDesc struct {
	id    uint64 // unique per connection, never 0
	base  uint64
	len   uint64
	perm  core.Perm // PermRemoteRead, PermRemoteWrite or both
	alloc uint64
}

// grantHead is the part of a grant the connection reader handles itself.
type grantHead struct {
	id       uint64
	gen      uint64 // the target's registration generation when it granted
	ttl      time.Duration
	fds      []grantFD
	standing []standingDesc // cached grants only
}

func durationNS(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d)
}

func nsDuration(ns uint64) time.Duration {
	if ns > uint64(1<<62) {
		return time.Duration(1 << 62)
	}
	return time.Duration(ns)
}

// appendLease appends a lease frame for reqs.
func appendLease(b []byte, id uint64, ttl time.Duration, reqs []*core.Request) []byte {
	return appendLeaseFrame(b, frameLease, id, ttl, reqs)
}

// appendLeaseFrame appends a LEASE or LEASE_CACHED frame (same payload).
func appendLeaseFrame(b []byte, typ uint8, id uint64, ttl time.Duration, reqs []*core.Request) []byte {
	start := len(b)
	b = lease.BeginFrame(b, typ)
	e := wire.NewEncoder(b)
	lease.BeginRequest(&e, id, ttl, len(reqs))
	for _, r := range reqs {
		lease.AppendRange(&e, r.Op, r.Remote, r.Len)
	}
	return lease.EndFrame(e.Out(), start)
}

// decodeLease decodes a lease payload into m, reusing m.Ranges.
func decodeLease(p []byte, m *leaseMsg) error {
	return lease.DecodeRequest(p, MaxLeaseEntries, m)
}

// appendGrant appends a grant frame.
func appendGrant(b []byte, id, gen uint64, ttl time.Duration, fds []grantFD, ents []grantEntry) []byte {
	return appendGrantFrame(b, frameGrant, id, gen, ttl, fds, nil, ents)
}

// appendGrantFrame appends a GRANT, or a GRANT_CACHED with its standing
// grants between the descriptors and the entries.
func appendGrantFrame(b []byte, typ uint8, id, gen uint64, ttl time.Duration, fds []grantFD,
	standing []standingDesc, ents []grantEntry) []byte {
	start := len(b)
	b = lease.BeginFrame(b, typ)
	e := wire.NewEncoder(b)
	e.U64(id)
	e.U64(gen)
	e.U64(durationNS(ttl))
	e.U32(uint32(len(fds)))
	for _, f := range fds {
		e.U64(f.alloc)
		e.U64(f.base)
		e.U64(f.size)
		var fl uint8
		if f.writable {
			fl |= fdWritable
		}
		e.U8(fl)
	}
	if typ == frameGrantCached {
		e.U32(uint32(len(standing)))
		for _, g := range standing {
			e.U64(g.id)
			e.U64(g.base)
			e.U64(g.len)
			e.U8(uint8(g.perm))
			e.U64(g.alloc)
		}
	}
	e.U32(uint32(len(ents)))
	for _, g := range ents {
		lease.AppendAnswerEntry(&e, g.code, g.msg)
		if g.code == status.OK {
			e.U64(g.alloc)
		}
	}
	return lease.EndFrame(e.Out(), start)
}

// decodeGrantHead decodes a grant up to and including its descriptor list,
// reusing h.fds, and leaves d at the entries.
func decodeGrantHead(d *wire.Decoder, h *grantHead) {
	h.id = d.U64()
	h.gen = d.U64()
	h.ttl = nsDuration(d.U64())
	n := d.Count(maxGrantFDs, grantFDSize)
	h.fds = h.fds[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		f := grantFD{alloc: d.U64(), base: d.U64(), size: d.U64()}
		fl := d.U8()
		f.writable = fl&fdWritable != 0
		switch {
		case d.Err() != nil:
		case fl&^fdWritable != 0:
			d.Fail(status.Errorf(status.Protocol, "shm: grant fd %d has unknown flags %#x", i, fl))
		case f.alloc == 0:
			d.Fail(status.Errorf(status.Protocol, "shm: grant fd %d has allocation id 0", i))
		case f.size == 0 || f.size > maxMapSize || f.base+f.size < f.base:
			d.Fail(status.Errorf(status.Protocol, "shm: grant fd %d has bad extent %#x+%#x", i, f.base, f.size))
		}
		h.fds = append(h.fds, f)
	}
}

// decodeStanding decodes the standing grants of a GRANT_CACHED (what
// follows its descriptor list), reusing h.standing, and leaves d at the
// entries.
func decodeStanding(d *wire.Decoder, h *grantHead) {
	n := d.Count(MaxLeaseEntries, standingSize)
	h.standing = h.standing[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		g := standingDesc{id: d.U64(), base: d.U64(), len: d.U64()}
		perm := d.U8()
		g.alloc = d.U64()
		g.perm = core.Perm(perm)
		switch {
		case d.Err() != nil:
		case g.id == 0:
			d.Fail(status.Errorf(status.Protocol, "shm: standing grant %d has id 0", i))
		case perm == 0 || core.Perm(perm)&^(core.PermRemoteRead|core.PermRemoteWrite) != 0:
			d.Fail(status.Errorf(status.Protocol, "shm: standing grant %d has bad permission %#x", i, perm))
		case g.len == 0 || g.base+g.len < g.base:
			d.Fail(status.Errorf(status.Protocol, "shm: standing grant %d has bad range %#x+%#x", i, g.base, g.len))
		}
		h.standing = append(h.standing, g)
	}
}

// decodeGrantEntries decodes the entries of a grant (what follows the
// descriptor list) into ents, which must hold want entries.
func decodeGrantEntries(p []byte, ents []grantEntry) error {
	d := wire.NewDecoder(p)
	n := d.Count(MaxLeaseEntries, minGrantEntry)
	if d.Err() == nil && n != len(ents) {
		d.Fail(status.Errorf(status.Protocol, "shm: grant has %d entries for a lease of %d", n, len(ents)))
	}
	for i := 0; i < n && d.Err() == nil; i++ {
		var g grantEntry
		g.code, g.msg = lease.DecodeAnswerEntry(&d)
		if g.code == status.OK {
			g.alloc = d.U64()
		}
		ents[i] = g
	}
	return d.Finish()
}

// appendU64Frame appends a frame whose payload is one u64 (RELEASE: the
// lease id; REVOKE_ACK: the revoke's seq).
func appendU64Frame(b []byte, typ uint8, v uint64) []byte {
	start := len(b)
	b = lease.BeginFrame(b, typ)
	b = binary.LittleEndian.AppendUint64(b, v)
	return lease.EndFrame(b, start)
}

// decodeU64Frame decodes the payload of a one-u64 frame.
func decodeU64Frame(p []byte) (uint64, error) {
	d := wire.NewDecoder(p)
	v := d.U64()
	return v, d.Finish()
}

func appendRelease(b []byte, id uint64) []byte { return appendU64Frame(b, frameRelease, id) }

func decodeRelease(p []byte) (uint64, error) { return decodeU64Frame(p) }

func appendRevoke(b []byte, ids []uint64) []byte {
	start := len(b)
	b = lease.BeginFrame(b, frameRevoke)
	e := wire.NewEncoder(b)
	e.U32(uint32(len(ids)))
	for _, id := range ids {
		e.U64(id)
	}
	return lease.EndFrame(e.Out(), start)
}

// appendRevokeGrant appends a REVOKE_GRANT frame: revoke seq, then the
// standing grant ids (at most maxRevoke).
func appendRevokeGrant(b []byte, seq uint64, ids []uint64) []byte {
	start := len(b)
	b = lease.BeginFrame(b, frameRevokeGrant)
	e := wire.NewEncoder(b)
	e.U64(seq)
	e.U32(uint32(len(ids)))
	for _, id := range ids {
		e.U64(id)
	}
	return lease.EndFrame(e.Out(), start)
}

func decodeRevokeGrant(p []byte, ids []uint64) (uint64, []uint64, error) {
	d := wire.NewDecoder(p)
	seq := d.U64()
	n := d.Count(maxRevoke, 8)
	if d.Err() == nil && n == 0 {
		d.Fail(status.Errorf(status.Protocol, "shm: empty REVOKE_GRANT"))
	}
	ids = ids[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		ids = append(ids, d.U64())
	}
	return seq, ids, d.Finish()
}

func appendRevokeAck(b []byte, seq uint64) []byte { return appendU64Frame(b, frameRevokeAck, seq) }

func decodeRevokeAck(p []byte) (uint64, error) { return decodeU64Frame(p) }

func decodeRevoke(p []byte, ids []uint64) ([]uint64, error) {
	d := wire.NewDecoder(p)
	n := d.Count(maxRevoke, 8)
	ids = ids[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		ids = append(ids, d.U64())
	}
	return ids, d.Finish()
}
