package lease

import (
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// A lease request is the same in every same-host transport: what the
// initiator is about to touch, for how long. Its payload layout:
//
//	u64 id      the request's id (the transport says whose: shm's lease id,
//	            cuda's call id)
//	u64 ttl     nanoseconds left until the requests' deadline
//	u32 count   1 <= count <= the transport's limit, then per range:
//	  u8  op    0 read (target -> initiator), 1 write; others rejected
//	  u64 addr  the target's address
//	  u64 len
const (
	RequestHeadSize = 8 + 8 + 4
	RangeSize       = 1 + 8 + 8
)

// Range is one range of a lease request.
type Range struct {
	Op   core.Op
	Addr uint64
	Len  uint64
}

// Access is what the target checks the range for (Engine.Acquire).
func (r Range) Access() core.Access {
	if r.Op == core.OpRead {
		return core.AccessRemoteRead
	}
	return core.AccessRemoteWrite
}

// Request is a decoded lease request.
type Request struct {
	ID     uint64
	TTL    time.Duration
	Ranges []Range
}

// BeginRequest appends the head of a request of n ranges; AppendRange
// appends each.
func BeginRequest(e *wire.Encoder, id uint64, ttl time.Duration, n int) {
	e.U64(id)
	e.U64(durationNS(ttl))
	e.U32(uint32(n))
}

// AppendRange appends one range of a request.
func AppendRange(e *wire.Encoder, op core.Op, addr, n uint64) {
	e.U8(uint8(op))
	e.U64(addr)
	e.U64(n)
}

// DecodeRequest decodes a request of at most max ranges into m, reusing
// m.Ranges. Anything malformed is a Protocol error.
func DecodeRequest(p []byte, max int, m *Request) error {
	d := wire.NewDecoder(p)
	m.ID = d.U64()
	m.TTL = nsDuration(d.U64())
	n := d.Count(uint32(max), RangeSize)
	if d.Err() == nil && n == 0 {
		d.Fail(status.Errorf(status.Protocol, "lease: empty lease request"))
	}
	if cap(m.Ranges) < n {
		m.Ranges = make([]Range, 0, n)
	}
	m.Ranges = m.Ranges[:0]
	for i := 0; i < n && d.Err() == nil; i++ {
		op := d.U8()
		addr := d.U64()
		ln := d.U64()
		if op > uint8(core.OpWrite) {
			d.Fail(status.Errorf(status.Protocol, "lease: range %d has unknown op %d", i, op))
		}
		m.Ranges = append(m.Ranges, Range{Op: core.Op(op), Addr: addr, Len: ln})
	}
	return d.Finish()
}

// MaxTTL is the longest ttl a request carries; longer ones are clamped
// when decoded.
const MaxTTL = time.Duration(1 << 62)

func durationNS(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d)
}

func nsDuration(ns uint64) time.Duration {
	if ns > uint64(MaxTTL) {
		return MaxTTL
	}
	return time.Duration(ns)
}

// pinWindow is how many of a grant's latest pins a range is matched
// against before the engine is asked again.
const pinWindow = 8

// Pins are the target's holds on its regions for one grant. Acquire
// checks a range with Engine.Acquire (registered, inside one region,
// permitted for the range's access, not being unregistered), which also
// pins the region, so unregistering it waits for Release. A range inside
// a region the grant already pinned, with the permission it needs, shares
// that pin (the region cannot go before the grant does), so a batch into
// one buffer costs one Acquire.
type Pins struct {
	Regions []*core.Region // one pin each
}

// Acquire checks and pins r (or finds a pin that covers it) and returns
// the region that holds it, or the engine's refusal.
func (p *Pins) Acquire(e *core.Engine, r Range) (*core.Region, error) {
	need := core.PermRemoteWrite
	if r.Op == core.OpRead {
		need = core.PermRemoteRead
	}
	if r.Len > 0 {
		for k := len(p.Regions) - 1; k >= 0 && k >= len(p.Regions)-pinWindow; k-- {
			if reg := p.Regions[k]; reg.Perm&need != 0 && reg.Contains(r.Addr, r.Len) {
				return reg, nil
			}
		}
	}
	reg, err := e.Acquire(r.Addr, r.Len, r.Access())
	if err != nil {
		return nil, err
	}
	p.Regions = append(p.Regions, reg)
	return reg, nil
}

// Release gives every pin back.
func (p *Pins) Release(e *core.Engine) {
	for _, r := range p.Regions {
		e.Release(r)
	}
	p.Regions = nil
}
