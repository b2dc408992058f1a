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
	// maxFrame bounds every frame: a grant of MaxLeaseEntries denied
	// entries with full messages is the largest.
	maxFrame = 64 + maxGrantFDs*25 + MaxLeaseEntries*(4+4+maxDenyMsg)

	leaseHeadSize = lease.RequestHeadSize
	grantFDSize   = 8 + 8 + 8 + 1
	minGrantEntry = lease.MinAnswerEntry
	fdWritable    = 1 << 0
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

// grantHead is the part of a grant the connection reader handles itself.
type grantHead struct {
	id  uint64
	gen uint64 // the target's registration generation when it granted
	ttl time.Duration
	fds []grantFD
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
	start := len(b)
	b = lease.BeginFrame(b, frameLease)
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
	start := len(b)
	b = lease.BeginFrame(b, frameGrant)
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

func appendRelease(b []byte, id uint64) []byte {
	start := len(b)
	b = lease.BeginFrame(b, frameRelease)
	b = binary.LittleEndian.AppendUint64(b, id)
	return lease.EndFrame(b, start)
}

func decodeRelease(p []byte) (uint64, error) {
	d := wire.NewDecoder(p)
	id := d.U64()
	return id, d.Finish()
}

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

func decodeRevoke(p []byte, ids []uint64) ([]uint64, error) {
	d := wire.NewDecoder(p)
	n := d.Count(maxRevoke, 8)
	ids = ids[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		ids = append(ids, d.U64())
	}
	return ids, d.Finish()
}
