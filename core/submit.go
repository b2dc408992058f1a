package core

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Submit checks and starts a batch and returns at once. Local problems (bad
// arguments, unregistered local memory, a closed segment) fail the call
// with nothing started; remote checks and transfer failures are reported
// per request.
func (e *Engine) Submit(reqs []TransferRequest, o TransferOptions) (*Batch, error) {
	if len(reqs) == 0 {
		return nil, status.Errorf(status.InvalidArgument, "empty batch")
	}
	if len(reqs) > math.MaxInt32 {
		return nil, status.Errorf(status.InvalidArgument, "batch of %d requests exceeds %d", len(reqs), math.MaxInt32)
	}
	if len(o.Notify) > MaxNotifyLen {
		return nil, status.Errorf(status.InvalidArgument, "notification of %d bytes exceeds %d", len(o.Notify), MaxNotifyLen)
	}
	var hint *installed
	if o.Transport != "" {
		if hint = e.mover(o.Transport); hint == nil {
			if why := e.Unavailable()[o.Transport]; why != "" {
				return nil, status.Errorf(status.Unsupported, "transport %q cannot serve on this machine: %s", o.Transport, why)
			}
			return nil, status.Errorf(status.NotFound, "transport %q is not installed or cannot move data", o.Transport)
		}
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = e.opts.DefaultTimeout
	}
	sl := e.slabs.get(len(reqs))
	b := &Batch{
		e:         e,
		reqs:      sl.reqs,
		ptrs:      sl.ptrs,
		deadline:  time.Now().Add(timeout),
		done:      make(chan struct{}),
		settledCh: make(chan struct{}),
	}
	if len(o.Notify) > 0 {
		b.notify = append([]byte(nil), o.Notify...)
	}
	// fail gives back the uses taken for the first n requests.
	fail := func(n int, err error) (*Batch, error) {
		b.releaseLocal(n)
		e.slabs.put(sl) // no one else saw it
		return nil, err
	}
	var (
		prev *Region  // the local region of the request before, whose use it took or owes
		owed int64    // requests after the one that took prev's use, in prev too, whose uses are taken once the run ends
		seg  *Segment // the segment of the request before, checked (never nil once set)
	)
	for i := range reqs {
		tr := &reqs[i]
		r := &b.reqs[i]
		err := e.checkRequest(tr)
		if err == nil && (tr.Segment != seg || seg == nil) {
			err = e.checkSegment(tr.Segment) // once a run of requests to one segment
			seg = tr.Segment
		}
		if err != nil {
			return fail(i-int(owed), status.Errorf(status.CodeOf(err), "request %d: %w", i, err))
		}
		local := prev
		if prev != nil && prev.Contains(tr.Local, tr.Len) {
			owed++
		} else {
			if !prev.addUses(owed) {
				return fail(i-int(owed), errUnregistering(i-int(owed), prev))
			}
			owed = 0
			var err error
			if local, err = e.Acquire(tr.Local, tr.Len, AccessLocal); err != nil {
				return fail(i, status.Errorf(status.CodeOf(err), "request %d: local memory: %w", i, err))
			}
			if h := e.acquiredHook.Load(); h != nil {
				(*h)(i)
			}
		}
		// Field by field: copying a whole Request value would run the
		// bulk write barrier over every pointer in it. The slab is
		// cleared, so a request starts pending, on its first attempt.
		r.Op, r.Local, r.Remote, r.Len = tr.Op, tr.Local, tr.Remote, tr.Len
		r.Peer, r.LocalRegion, r.Deadline, r.batch, r.index = tr.Segment.peer, local, b.deadline, b, int32(i)
		r.pinned = hint != nil
		prev = local
	}
	if !prev.addUses(owed) {
		return fail(len(reqs)-int(owed), errUnregistering(len(reqs)-int(owed), prev))
	}
	b.pending.Store(int64(len(reqs)))
	b.unsettled.Store(int64(len(reqs)))

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		b.releaseLocal(len(reqs))
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	e.batches[b] = struct{}{}
	e.inflight += int64(len(reqs))
	e.mu.Unlock()

	b.mu.Lock()
	b.timeout = timeout
	b.timer = armDeadline(sl.timer, b, timeout)
	b.mu.Unlock()

	// Group by peer, keeping order; route each group now when its
	// descriptor is fresh, else after a refresh off the caller's thread.
	all := b.ptrs
	for i := range b.reqs {
		all[i] = &b.reqs[i]
	}
	eachGroup(all, func(i int) *Peer { return all[i].Peer }, func(p *Peer, rs []*Request) {
		// Never a network round trip on the caller's thread: without a
		// usable cached descriptor, routing continues on a goroutine.
		if d := p.cached(); d != nil {
			if o.Waiting {
				for _, r := range rs {
					r.setCallerWaits(true)
				}
			}
			e.routeWith(p, rs, hint, d, false)
		} else {
			go e.route(p, rs, hint, true)
		}
	})
	return b, nil
}

// deadlineTimer fires a batch's deadline. It goes back to the slabs with
// its batch's requests, and only when it was stopped before it fired
// (recycle), so it serves the next batch of that slab armed again,
// instead of a timer and a closure allocated per batch: it fails
// whichever batch it was last armed for.
type deadlineTimer struct {
	t     *time.Timer
	batch atomic.Pointer[Batch]
}

func (d *deadlineTimer) fire() {
	if b := d.batch.Load(); b != nil {
		b.deadlinePassed()
	}
}

// armDeadline arms d (nil: a new timer) to fail b after timeout.
func armDeadline(d *deadlineTimer, b *Batch, timeout time.Duration) *deadlineTimer {
	if d == nil {
		d = &deadlineTimer{}
		d.batch.Store(b)
		d.t = time.AfterFunc(timeout, d.fire)
		return d
	}
	d.batch.Store(b)
	d.t.Reset(timeout)
	return d
}

// deadlinePassed fails what is still pending with Timeout, and logs it
// once per batch.
func (b *Batch) deadlinePassed() {
	timeout := b.timeout
	if n := b.pending.Load(); n > 0 {
		b.e.log.Info("batch deadline exceeded", "timeout", timeout, "requests", len(b.reqs), "pending", n,
			"peer", b.reqs[0].Peer.name)
	}
	b.expire(status.Timeout, fmt.Sprintf("deadline of %v exceeded", timeout))
}

// errUnregistering is Submit's failure for request i, in local region r
// that an unregister has started on.
func errUnregistering(i int, r *Region) error {
	return status.Errorf(status.NotRegistered, "request %d: local memory: region [%#x, %#x) is being unregistered",
		i, r.Addr, r.End())
}

func (b *Batch) releaseLocal(n int) {
	for i := 0; i < n; i++ {
		if r := b.reqs[i].LocalRegion; r != nil {
			r.release()
		}
	}
}

func (e *Engine) checkRequest(tr *TransferRequest) error {
	switch {
	case tr.Op != OpRead && tr.Op != OpWrite:
		return status.Errorf(status.InvalidArgument, "unknown opcode %d", tr.Op)
	case tr.Len == 0:
		return status.Errorf(status.InvalidArgument, "zero length")
	case tr.Local == 0:
		return status.Errorf(status.InvalidArgument, "null local address")
	case tr.Remote+tr.Len < tr.Remote:
		return status.Errorf(status.InvalidArgument, "remote address %#x + length %#x overflows", tr.Remote, tr.Len)
	}
	return nil
}

// checkSegment checks a request's segment: Submit asks once per run of
// requests to one segment (a close racing the call is then ordered after
// the run's first request).
func (e *Engine) checkSegment(s *Segment) error {
	switch {
	case s == nil:
		return status.Errorf(status.InvalidHandle, "null segment")
	case s.peer.e != e:
		return status.Errorf(status.InvalidHandle, "segment belongs to another engine")
	case s.closed.Load():
		return status.Errorf(status.InvalidHandle, "segment is closed")
	}
	return nil
}

// route checks each request against the peer's descriptor, picks a mover
// and hands the requests over.
func (e *Engine) route(p *Peer, rs []*Request, hint *installed, refresh bool) {
	for _, r := range rs {
		r.setCallerWaits(false) // routed off the caller's goroutine
	}
	desc, err := p.descriptor(refresh, rs[0].Deadline)
	if err != nil {
		for _, r := range rs {
			r.lastTry.Store(true)
			r.Done(0, err)
		}
		return
	}
	e.routeWith(p, rs, hint, desc, refresh)
}

// routeWith routes with a descriptor in hand. rs is the caller's to give
// away: the routed requests are gathered in place at its front.
func (e *Engine) routeWith(p *Peer, rs []*Request, hint *installed, desc *wire.SegmentDesc, refresh bool) {
	routed := rs[:0] // never ahead of the loop below
	var (
		first  *installed   // the mover of every routed request, until movers is needed
		movers []*installed // the mover of each routed request, once they differ
		retry  []*Request
		prev   *wire.RegionDesc
		// The mover chosen for the request before, and its regions, when
		// every mover asked for it is a RegionEligible: a request in the
		// same regions gets the same answer without asking again.
		last       *installed
		lastLocal  *Region
		lastRemote *wire.RegionDesc
	)
	for _, r := range rs {
		r.Desc = desc
		rr, err := checkRemote(desc, r, prev)
		if err != nil {
			if !refresh && status.CodeOf(err) == status.NotRegistered {
				retry = append(retry, r) // maybe registered since we cached it
				continue
			}
			r.lastTry.Store(true)
			r.Done(0, err)
			continue
		}
		r.RemoteRegion = rr
		prev = rr
		m := last
		if m == nil || r.LocalRegion != lastLocal || rr != lastRemote {
			byRegion := true
			if m = hint; m == nil {
				m, byRegion = e.firstMover(r)
			} else if byRegion = m.byRegion; !e.eligible(m, r) {
				m = nil
			}
			last, lastLocal, lastRemote = nil, nil, nil
			if m != nil && byRegion {
				last, lastLocal, lastRemote = m, r.LocalRegion, rr
			}
		}
		if m == nil {
			r.lastTry.Store(true)
			r.Done(0, status.Errorf(status.Unsupported,
				"no installed transport can move [%#x, +%d) to %s at %#x", r.Local, r.Len, p.name, r.Remote))
			continue
		}
		switch {
		case first == nil:
			first = m
		case movers == nil && m != first:
			movers = make([]*installed, len(routed), len(rs))
			for i := range movers {
				movers[i] = first
			}
		}
		if movers != nil {
			movers = append(movers, m)
		}
		routed = append(routed, r)
	}
	dispatchTo := func(m *installed, rs []*Request) {
		e.noteRoute(p, m, hint != nil)
		e.dispatch(m, rs)
	}
	if movers == nil {
		if len(routed) > 0 {
			dispatchTo(first, routed)
		}
	} else {
		eachGroup(routed, func(i int) *installed { return movers[i] }, dispatchTo)
	}
	if len(retry) > 0 {
		p.invalidate()
		go e.route(p, retry, hint, true)
	}
}

// noteRoute logs, at Debug, the transport chosen for a peer once per
// transport and epoch (a new descriptor or a restarted peer logs again),
// never per request.
func (e *Engine) noteRoute(p *Peer, m *installed, hinted bool) {
	if !e.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c := routeChoice{transport: m.t.Name(), epoch: p.Epoch()}
	if last := p.lastRoute.Load(); last != nil && *last == c {
		return
	}
	p.lastRoute.Store(&c)
	reason := "first eligible in preference order"
	if hinted {
		reason = "named by the caller"
	}
	e.log.Debug("transport chosen", "peer", p.name, "transport", c.transport, "epoch", c.epoch, "reason", reason)
}

// checkRemote finds the peer region holding r's remote range and checks the
// permission r needs. The target checks again: this only fails early.
// A request inside prev (the region of the request before, or nil) is
// checked against it without searching d.
func checkRemote(d *wire.SegmentDesc, r *Request, prev *wire.RegionDesc) (*wire.RegionDesc, error) {
	rr := prev
	if rr == nil || r.Remote < rr.Addr || r.Remote-rr.Addr >= rr.Len {
		if rr = d.RegionAt(r.Remote, 1); rr == nil {
			return nil, status.Errorf(status.NotRegistered, "remote [%#x, %#x) is not registered by %s",
				r.Remote, r.Remote+r.Len, d.Name)
		}
	}
	if r.Remote+r.Len > rr.End() {
		return rr, status.Errorf(status.OutOfRange, "remote [%#x, %#x) runs past %s's region [%#x, %#x)",
			r.Remote, r.Remote+r.Len, d.Name, rr.Addr, rr.End())
	}
	need := wire.PermWrite
	if r.Op == OpRead {
		need = wire.PermRead
	}
	if rr.Perm&need == 0 {
		return rr, status.Errorf(status.PermissionDenied, "%s's region [%#x, %#x) does not permit remote %s",
			d.Name, rr.Addr, rr.End(), map[bool]string{true: "read", false: "write"}[r.Op == OpRead])
	}
	return rr, nil
}

// dispatch hands requests (of one batch) to a mover, or fails them if it
// is uninstalled. The batch counts the call as a request still held, so it
// cannot settle, and its requests cannot be reused, while the mover's
// Submit runs: a mover may look at a request in Submit after it called
// Done for it.
func (e *Engine) dispatch(m *installed, rs []*Request) {
	b := rs[0].batch
	if !m.forgets {
		b.keep.Store(true)
	}
	b.unsettled.Add(1)
	defer b.settle()
	// The mover is also the transport a request's status names. The whole
	// batch, handed over at once (its first dispatch: no request has a
	// mover yet), takes one store for all.
	if len(rs) == len(b.reqs) && b.mover.Load() == nil {
		b.mover.Store(m)
	} else {
		for _, r := range rs {
			r.mover.Store(m)
		}
	}
	if !m.gate.enter() {
		for _, r := range rs {
			r.Done(0, status.Errorf(status.Closed, "transport %s was uninstalled", m.t.Name()))
		}
		return
	}
	defer m.gate.exit()
	if err := submitTo(m, rs); err != nil {
		// A panicking Submit may have completed some requests; the rest
		// would hang, so they are failed here. Done is idempotent enough:
		// settled requests are skipped.
		for _, r := range rs {
			if !r.isSettled() {
				r.lastTry.Store(true)
				r.Done(0, err)
			}
		}
	}
}

// submitTo hands rs to m's Submit; a panic there is returned as safeCall
// returns it (Internal), whose name is built only then: this is the
// transfer path, which allocates nothing per batch for it.
func submitTo(m *installed, rs []*Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(status.Internal, "%s submit panicked: %v\n%s", m.t.Name(), p, debug.Stack())
		}
	}()
	m.t.(Mover).Submit(rs)
	return nil
}

// movers returns the installed Movers in preference order. The slice is
// shared: callers must not modify it.
func (e *Engine) movers() []*installed {
	if p := e.moversCache.Load(); p != nil {
		return *p
	}
	return nil
}

func (e *Engine) mover(name string) *installed {
	for _, m := range e.movers() {
		if m.t.Name() == name {
			return m
		}
	}
	return nil
}

// eligible asks m whether it can serve r. A panicking Eligible is a bug in
// that transport; it counts as "no", so the request goes elsewhere.
func (e *Engine) eligible(m *installed, r *Request) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return m.t.(Mover).Eligible(r)
}

// firstMover returns the first eligible mover for r, and whether every
// mover it asked is a RegionEligible (so the answer holds for any request
// in r's peer, descriptor and regions).
func (e *Engine) firstMover(r *Request) (*installed, bool) {
	byRegion := true
	for _, m := range e.movers() {
		byRegion = byRegion && m.byRegion
		if e.eligible(m, r) {
			return m, byRegion
		}
	}
	return nil, byRegion
}

// nextMover returns the first eligible mover after r's current one.
func (e *Engine) nextMover(r *Request) *installed {
	past := false
	for _, m := range e.movers() {
		if m == r.moverOf() {
			past = true
			continue
		}
		if past && e.eligible(m, r) {
			return m
		}
	}
	return nil
}

func (e *Engine) cancelMovers(b *Batch) {
	by := map[*installed][]*Request{}
	for i := range b.reqs {
		r := &b.reqs[i]
		if m := r.moverOf(); !r.isSettled() && m != nil {
			by[m] = append(by[m], r)
		}
	}
	for m, rs := range by {
		if c, ok := m.t.(Canceler); ok && m.gate.enter() {
			_ = safeCall(m.t.Name()+" cancel", func() error { c.Cancel(rs); return nil })
			m.gate.exit()
		}
	}
}

func (e *Engine) batchSettled(b *Batch) {
	e.mu.Lock()
	e.inflight -= int64(len(b.reqs))
	e.mu.Unlock()
}

// ReleaseBatch forgets a batch whose requests are all settled or canceled.
// Its requests may then serve a later batch (see Forgetter), so the
// caller must not use the batch afterwards: its Status, Wait and Cancel
// may report InvalidHandle. A call of them in progress finishes first.
func (e *Engine) ReleaseBatch(b *Batch) {
	e.mu.Lock()
	delete(e.batches, b)
	closed := e.closed
	e.mu.Unlock()
	if closed {
		b.keep.Store(true) // Close may still expire it
	}
	b.release()
}

// group is the requests of one key, in their order.
type group[K comparable] struct {
	key  K
	reqs []*Request
}

// eachGroup calls f with each group of groupBy(rs, key), in order. The
// common case, a single key, allocates nothing.
func eachGroup[K comparable](rs []*Request, key func(i int) K, f func(K, []*Request)) {
	if len(rs) == 0 {
		return
	}
	k0 := key(0)
	same := 1
	for same < len(rs) && key(same) == k0 {
		same++
	}
	if same == len(rs) {
		f(k0, rs)
		return
	}
	for _, g := range groupBy(rs, key) {
		f(g.key, g.reqs)
	}
}

// groupBy splits rs by key(i) (the key of rs[i]), groups in the order
// their keys first appear. The common case, a single key, costs no copy.
func groupBy[K comparable](rs []*Request, key func(i int) K) []group[K] {
	if len(rs) == 0 {
		return nil
	}
	k0 := key(0)
	same := 1
	for same < len(rs) && key(same) == k0 {
		same++
	}
	if same == len(rs) {
		return []group[K]{{k0, rs}}
	}
	var gs []group[K]
	at := map[K]int{}
	for i, r := range rs {
		k := key(i)
		j, ok := at[k]
		if !ok {
			j = len(gs)
			at[k] = j
			gs = append(gs, group[K]{key: k})
		}
		gs[j].reqs = append(gs[j].reqs, r)
	}
	return gs
}
