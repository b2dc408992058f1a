package shm

import (
	"bytes"
	"testing"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// payload strips the frame header that the append functions write.
func payload(frame []byte) []byte { return frame[wire.FrameHeaderSize:] }

// FuzzDecodeLease: what an initiator sends the target. Any input decodes
// or fails with a Protocol error, never panics, and a decoded lease
// encodes back to the same bytes.
func FuzzDecodeLease(f *testing.F) {
	f.Add(payload(appendLease(nil, 1, time.Second, []*core.Request{{Op: core.OpRead, Remote: 0x1000, Len: 8}})))
	f.Add(payload(appendLease(nil, 7, 0, []*core.Request{
		{Op: core.OpWrite, Remote: 1, Len: 1}, {Op: core.OpRead, Remote: ^uint64(0), Len: ^uint64(0)}})))
	f.Add([]byte{})
	f.Add(make([]byte, leaseHeadSize))
	f.Fuzz(func(t *testing.T, p []byte) {
		var m leaseMsg
		err := decodeLease(p, &m)
		if err != nil {
			if status.CodeOf(err) != status.Protocol {
				t.Fatalf("error with code %v: %v", status.CodeOf(err), err)
			}
			return
		}
		if len(m.Ranges) == 0 || len(m.Ranges) > MaxLeaseEntries {
			t.Fatalf("%d entries accepted", len(m.Ranges))
		}
		if uint64(m.TTL) > 1<<62 {
			t.Fatalf("ttl %d not clamped", m.TTL)
		}
		if uint64(m.TTL) == 1<<62 {
			return // clamped: does not encode back to the same bytes
		}
		reqs := make([]*core.Request, len(m.Ranges))
		for i, en := range m.Ranges {
			reqs[i] = &core.Request{Op: en.Op, Remote: en.Addr, Len: en.Len}
		}
		if again := payload(appendLease(nil, m.ID, m.TTL, reqs)); !bytes.Equal(again, p) {
			t.Fatalf("re-encoded lease differs:\n% x\n% x", again, p)
		}
	})
}

// FuzzDecodeGrant: what a target sends the initiator (its reader decodes
// the head and descriptors, the waiter the entries).
func FuzzDecodeGrant(f *testing.F) {
	f.Add(payload(appendGrant(nil, 1, 2, time.Second,
		[]grantFD{{alloc: 3, base: 0x7000, size: 4096, writable: true}},
		[]grantEntry{{code: status.OK, alloc: 3}, {code: status.NotRegistered, msg: "gone"}, {code: status.OK}})))
	f.Add(payload(appendGrant(nil, 9, 0, 0, nil, []grantEntry{{code: status.PermissionDenied, msg: ""}})))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		d := wire.NewDecoder(p)
		var h grantHead
		decodeGrantHead(&d, &h)
		if err := d.Err(); err != nil {
			if status.CodeOf(err) != status.Protocol {
				t.Fatalf("error with code %v: %v", status.CodeOf(err), err)
			}
			return
		}
		rest := p[d.Offset():]
		n := 0
		if len(rest) >= 4 {
			n = int(uint32(rest[0]) | uint32(rest[1])<<8 | uint32(rest[2])<<16 | uint32(rest[3])<<24)
		}
		if n > MaxLeaseEntries {
			n = MaxLeaseEntries // a waiter expects at most this many
		}
		ents := make([]grantEntry, n)
		if err := decodeGrantEntries(rest, ents); err != nil {
			if status.CodeOf(err) != status.Protocol {
				t.Fatalf("error with code %v: %v", status.CodeOf(err), err)
			}
			return
		}
		for _, g := range ents {
			if g.code > 0 {
				t.Fatalf("positive code %d accepted", g.code)
			}
		}
		if uint64(h.ttl) == 1<<62 {
			return
		}
		if again := payload(appendGrant(nil, h.id, h.gen, h.ttl, h.fds, ents)); !bytes.Equal(again, p) {
			t.Fatalf("re-encoded grant differs:\n% x\n% x", again, p)
		}
	})
}

func FuzzDecodeRevoke(f *testing.F) {
	f.Add(payload(appendRevoke(nil, []uint64{1, 2, 3})))
	f.Add(payload(appendRelease(nil, 5)))
	f.Fuzz(func(t *testing.T, p []byte) {
		if ids, err := decodeRevoke(p, nil); err == nil {
			if again := payload(appendRevoke(nil, ids)); !bytes.Equal(again, p) {
				t.Fatalf("re-encoded revoke differs")
			}
		}
		if id, err := decodeRelease(p); err == nil {
			if again := payload(appendRelease(nil, id)); !bytes.Equal(again, p) {
				t.Fatalf("re-encoded release differs")
			}
		}
	})
}

// FuzzDecodeGrantCached: the standing grants of a GRANT_CACHED. Any input
// decodes or fails with a Protocol error; a decoded grant names a non-zero
// id, a known non-empty permission and a range that does not wrap, and
// re-encodes to the same bytes.
func FuzzDecodeGrantCached(f *testing.F) {
	f.Add(payload(appendGrantFrame(nil, frameGrantCached, 1, 2, time.Second,
		[]grantFD{{alloc: 3, base: 0x7000, size: 4096, writable: true}},
		[]standingDesc{{id: 1, base: 0x7000, len: 4096, perm: core.PermRemoteRead, alloc: 3},
			{id: 2, base: 0x9000, len: 8, perm: core.PermRemoteRead | core.PermRemoteWrite}},
		[]grantEntry{{code: status.OK, alloc: 3}})))
	f.Add(payload(appendGrantFrame(nil, frameGrantCached, 9, 0, 0, nil, nil,
		[]grantEntry{{code: status.PermissionDenied, msg: "no"}})))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		d := wire.NewDecoder(p)
		var h grantHead
		decodeGrantHead(&d, &h)
		decodeStanding(&d, &h)
		if err := d.Err(); err != nil {
			if status.CodeOf(err) != status.Protocol {
				t.Fatalf("error with code %v: %v", status.CodeOf(err), err)
			}
			return
		}
		for _, g := range h.standing {
			if g.id == 0 || g.len == 0 || g.base+g.len < g.base || g.perm == 0 ||
				g.perm&^(core.PermRemoteRead|core.PermRemoteWrite) != 0 {
				t.Fatalf("bad standing grant accepted: %+v", g)
			}
		}
		rest := p[d.Offset():]
		n := 0
		if len(rest) >= 4 {
			n = min(int(uint32(rest[0])|uint32(rest[1])<<8|uint32(rest[2])<<16|uint32(rest[3])<<24), MaxLeaseEntries)
		}
		ents := make([]grantEntry, n)
		if decodeGrantEntries(rest, ents) != nil || uint64(h.ttl) == 1<<62 {
			return
		}
		if again := payload(appendGrantFrame(nil, frameGrantCached, h.id, h.gen, h.ttl, h.fds, h.standing, ents)); !bytes.Equal(again, p) {
			t.Fatalf("re-encoded cached grant differs:\n% x\n% x", again, p)
		}
	})
}

func FuzzDecodeRevokeGrant(f *testing.F) {
	f.Add(payload(appendRevokeGrant(nil, 4, []uint64{1, 2, 3})))
	f.Add(payload(appendRevokeAck(nil, 4)))
	f.Fuzz(func(t *testing.T, p []byte) {
		if seq, ids, err := decodeRevokeGrant(p, nil); err == nil {
			if len(ids) == 0 {
				t.Fatalf("empty revoke accepted")
			}
			if again := payload(appendRevokeGrant(nil, seq, ids)); !bytes.Equal(again, p) {
				t.Fatalf("re-encoded revoke grant differs")
			}
		} else if status.CodeOf(err) != status.Protocol {
			t.Fatalf("error with code %v: %v", status.CodeOf(err), err)
		}
		if seq, err := decodeRevokeAck(p); err == nil {
			if again := payload(appendRevokeAck(nil, seq)); !bytes.Equal(again, p) {
				t.Fatalf("re-encoded revoke ack differs")
			}
		}
	})
}
