//go:build linux

package shm

import (
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// standing is a standing grant as the initiator caches it: the target
// checked [base, base+len) of one of its regions for perm once, and until
// it takes the grant back (REVOKE_GRANT) copies inside that range need no
// round trip. refs counts the jobs copying under it; a revoke marks it
// dead, so no new copy step starts under it, and is acknowledged only once
// refs is 0.
type standing struct {
	standingDesc
	refs int         // on conn.gmu
	dead atomic.Bool // set on conn.gmu; read between copy steps
}

// covers reports whether the grant allows op on [addr, addr+n).
func (g *standing) covers(addr, n uint64, op core.Op) bool {
	need := core.PermRemoteWrite
	if op == core.OpRead {
		need = core.PermRemoteRead
	}
	return g.perm&need != 0 && n > 0 && addr >= g.base && n <= g.len && addr-g.base <= g.len-n
}

// addGrants caches the standing grants a GRANT_CACHED announced, kept
// sorted by base. A target that repeats an id or exceeds its own bound
// breaks the protocol.
func (c *conn) addGrants(gs []standingDesc) error {
	if len(gs) == 0 {
		return nil
	}
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if c.isDead() {
		return nil // dropGrants has run: nothing may be cached any more
	}
	for _, d := range gs {
		switch {
		case c.grantIDs[d.id] != nil:
			return status.Errorf(status.Protocol, "shm: %s repeated standing grant id %d", c.cl.name, d.id)
		case len(c.grants) >= maxGrantsPerConn:
			return status.Errorf(status.Protocol, "shm: %s sent more than %d standing grants", c.cl.name, maxGrantsPerConn)
		}
		g := &standing{standingDesc: d}
		at := c.searchGrants(d.base)
		c.grants = slices.Insert(c.grants, at, g)
		c.grantIDs[d.id] = g
		c.t.grantsCached.Add(1)
	}
	return nil
}

// searchGrants returns the index of the first grant whose base is above
// addr; c.gmu is held.
func (c *conn) searchGrants(addr uint64) int {
	lo, hi := 0, len(c.grants)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.grants[m].base <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// findGrant returns a live grant that allows op on [addr, addr+n), or
// nil; c.gmu is held. The target's regions do not overlap, and a region's
// grants are revoked before another can be registered over it, so only
// the grants with the highest base at or below addr can cover it (one
// per permission). Anything else is a miss, which only costs asking.
func (c *conn) findGrant(addr, n uint64, op core.Op) *standing {
	i := c.searchGrants(addr)
	if i == 0 {
		return nil
	}
	base := c.grants[i-1].base
	for k := i - 1; k >= 0 && c.grants[k].base == base; k-- {
		if g := c.grants[k]; g.covers(addr, n, op) {
			return g
		}
	}
	return nil
}

// holdGrants finds a live standing grant for every request and takes a
// reference on each, filling out; it takes none and reports false when
// one is missing. It does not allocate.
func (c *conn) holdGrants(reqs []*core.Request, out []*standing) bool {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if len(c.grants) == 0 {
		return false
	}
	var last *standing
	for i, r := range reqs {
		g := last
		if g == nil || !g.covers(r.Remote, r.Len, r.Op) {
			if g = c.findGrant(r.Remote, r.Len, r.Op); g == nil {
				clear(out[:i])
				return false
			}
			last = g
		}
		out[i] = g
	}
	// One reference per run of requests under one grant: putGrants gives
	// back by the same rule, over the same slice.
	for i, g := range out {
		if i == 0 || g != out[i-1] {
			g.refs++
		}
	}
	return true
}

// putGrants drops the references holdGrants took for gs (one per run of
// one grant), waking a revoke that waits for the last one.
func (c *conn) putGrants(gs []*standing) {
	c.gmu.Lock()
	wake := false
	for i, g := range gs {
		if i > 0 && g == gs[i-1] {
			continue
		}
		if g.refs--; g.refs == 0 && g.dead.Load() {
			wake = true
		}
	}
	if wake {
		c.gidle.Broadcast()
	}
	c.gmu.Unlock()
}

// revokeGrants takes the grants ids out of the cache, so no lookup finds
// them, marks them dead, so no copy step starts under them, and waits for
// the copies in progress under them to end. Unknown ids (the connection
// failed meanwhile) are skipped.
func (c *conn) revokeGrants(ids []uint64) {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	var gone []*standing
	for _, id := range ids {
		if g := c.grantIDs[id]; g != nil {
			delete(c.grantIDs, id)
			g.dead.Store(true)
			gone = append(gone, g)
		}
	}
	if len(gone) == 0 {
		return
	}
	c.grants = slices.DeleteFunc(c.grants, func(g *standing) bool { return g.dead.Load() })
	c.t.grantsCached.Add(-int64(len(gone)))
	c.t.grantsRevoked.Add(int64(len(gone)))
	for _, g := range gone {
		for g.refs > 0 {
			c.gidle.Wait()
		}
	}
}

// ackRevoke tells the target that the grants of revoke seq are gone here.
func (c *conn) ackRevoke(seq uint64) {
	b := appendRevokeAck(nil, seq)
	_ = c.write(b, time.Now().Add(controlWriteTimeout)) // a failure fails the connection
}

// dropGrants forgets every grant of a dying connection: the target ends
// them when the socket closes. Copies in progress stop at their next step.
func (c *conn) dropGrants() {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	for _, g := range c.grants {
		g.dead.Store(true)
	}
	c.t.grantsCached.Add(-int64(len(c.grants)))
	clear(c.grants)
	c.grants = c.grants[:0]
	clear(c.grantIDs)
}

// cachedCopy copies reqs[lo:hi] under the connection's standing grants,
// with no round trip to the target, when every request lies inside a live
// grant with the permission it needs. It reports false (nothing done)
// otherwise; then the job asks for a lease as usual.
//
// leaveLongPVM (a waiter's copy, help) reports false, copying nothing,
// for a run that is longPVM: a split process_vm call joins its second
// thread every chunk, and on a waiter's locked C thread each join is a
// thread wake-up of its own, so such a run goes to a job goroutine at the
// price of two wake-ups a batch.
func (j *job) cachedCopy(c *conn, lo, hi int, deadline time.Time, leaveLongPVM bool) (bool, error) {
	t := j.t
	n := hi - lo
	if cap(j.under) < n {
		j.under = make([]*standing, n)
	}
	under := j.under[:n]
	if !c.holdGrants(j.reqs[lo:hi], under) {
		return false, nil
	}
	defer clear(under)
	defer c.putGrants(under)
	if leaveLongPVM && j.longPVM(lo, under) {
		t.pvmHandedOff.Add(1)
		return false, nil
	}
	if err := c.useCached(); err != nil {
		return true, err
	}
	defer c.unuse()
	if !t.enterCopy() {
		return true, core.ErrUninstalled
	}
	defer t.exitCopy()
	t.grantHits.Add(1)
	j.c, j.stop, j.lo, j.grants = c, deadline, lo, under // copyFrom takes each request's allocation from its grant
	j.copyAll(lo, hi)
	j.c, j.grants = nil, nil
	return true, nil
}

// longPVM reports whether the requests from lo under grants gs move so
// much through process_vm (grants of plain registered memory) that their
// copy is at least pvmHandOffCalls split calls (flushPVM): then the joins
// of a waiter's thread cost more than handing the job to a goroutine.
// On a 2-vCPU VM, through the C ABI, a waiter copying batches of 128 x
// 4 MiB itself moved 5-10% less than a job goroutine; at 128 x 16 KiB to
// 256 KiB (1-16 calls) it moved up to 1.7x more.
func (j *job) longPVM(lo int, gs []*standing) bool {
	if runtime.GOMAXPROCS(0) < 2 {
		return false
	}
	var n uint64
	for i, g := range gs {
		if g.alloc == 0 {
			n += j.reqs[lo+i].Len
		}
	}
	return n >= pvmHandOffCalls*chunk
}

// useCached counts a job copying under standing grants as a user of the
// connection, so a retired connection is not closed under it.
func (c *conn) useCached() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return status.Errorf(status.TransportError, "shm: connection to %s lost: %v", c.cl.name, c.err)
	}
	c.users++
	return nil
}
