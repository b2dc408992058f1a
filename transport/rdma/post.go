package rdma

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// chunk is the largest piece of a request one work request carries; a
// larger request is split into chunks striped across the queue pairs of
// its NICs.
const chunk = 1 << 20

// workRequest is one posted (or waiting) RDMA operation: a whole small
// request or one chunk of a large one.
type workRequest struct {
	wr       sendWR
	req      *pending
	qp       *queuePair
	deadline time.Time
}

// pending is one core request in flight: done when all its work requests
// are.
type pending struct {
	done func(n uint64, err error) // the request's Done
	// r, when set, hears which local NICs carried it (MarkNIC) before
	// done: first is the first chunk's NIC, nics every NIC of its chunks.
	r     *core.Request
	first int
	nics  []*nic
	left  atomic.Int32
	bytes atomic.Uint64
	mu    sync.Mutex
	err   error
}

// complete records one work request's outcome; the last one reports the
// request to core. A permission failure (the NIC refused the access) wins
// over the transport failures it causes on the rest of the queue pair, so
// the caller sees why.
func (p *pending) complete(n *nic, wr *workRequest, moved uint64, err error) {
	if err != nil {
		p.mu.Lock()
		if p.err == nil || (status.CodeOf(err) == status.PermissionDenied && status.CodeOf(p.err) != status.PermissionDenied) {
			p.err = err
		}
		p.mu.Unlock()
	} else {
		p.bytes.Add(moved)
		n.bytes.Add(int64(moved))
		n.requests.Add(1)
	}
	if p.left.Add(-1) != 0 {
		return
	}
	p.mu.Lock()
	err = p.err
	p.mu.Unlock()
	if err != nil {
		p.done(0, err)
		return
	}
	for _, n := range p.nics {
		n.served.Add(1)
	}
	if p.r != nil {
		p.r.MarkNIC(p.first, len(p.nics))
	}
	p.done(p.bytes.Load(), nil)
}

// route is where a request goes: its pairs of (local NIC, remote NIC) to
// stripe over, with the keys for each.
type route struct {
	pairs []nicPair
}

type nicPair struct {
	local, remote int
	lkey, rkey    uint32
}

// endpointOf is the peer's rdma endpoint (its listener), or "".
func endpointOf(d *wire.SegmentDesc) string {
	if d == nil {
		return ""
	}
	for _, ep := range d.Endpoints {
		if ep.Transport == Name {
			return ep.Addr
		}
	}
	return ""
}

// routeFor plans r: the local NICs near its memory, the peer's NICs near
// its region, and the keys of both. ok is false when rdma cannot serve r.
func (t *Transport) routeFor(r *core.Request) (route, bool) {
	if t.why != "" || endpointOf(r.Desc) == "" || r.LocalRegion == nil {
		return route{}, false
	}
	lkeys := t.lkeys(r.LocalRegion)
	if lkeys == nil {
		return route{}, false
	}
	keys, err := remoteKeys(r.RemoteRegion)
	if err != nil {
		return route{}, false
	}
	var near, all []remoteKey
	for _, k := range keys {
		all = append(all, k)
		if k.Near {
			near = append(near, k)
		}
	}
	if len(near) == 0 {
		near = all
	}
	local := nicsFor(t.infos(), numaOf(r.LocalRegion.Loc))
	n := max(len(local), len(near))
	rt := route{pairs: make([]nicPair, n)}
	for i := range n {
		l, k := local[i%len(local)], near[i%len(near)]
		rt.pairs[i] = nicPair{local: l, remote: int(k.NIC), lkey: lkeys[l], rkey: k.RKey}
	}
	return rt, true
}

// Eligible reports whether rdma can serve r: the peer publishes an rdma
// endpoint and keys for the region, and the local memory is registered
// with this transport's NICs.
// ForgetsRequests: a request's pending reports Done once, when its last
// work request completes (each work request completes once: whoever takes
// it out of the NIC's in-flight table or a queue completes it), and
// MarkNIC comes before that Done (core.Forgetter).
func (t *Transport) ForgetsRequests() {}

func (t *Transport) Eligible(r *core.Request) bool {
	_, ok := t.routeFor(r)
	return ok
}

// Submit splits each request into work requests, groups them by queue
// pair and posts each group as one chain.
func (t *Transport) Submit(reqs []*core.Request) {
	type target struct {
		key  connKey
		addr string
	}
	groups := map[target][]*workRequest{}
	var order []target
	deadlines := map[target]time.Time{}
	for _, r := range reqs {
		rt, ok := t.routeFor(r)
		if !ok {
			r.Done(0, status.Errorf(status.TransportError, "rdma: cannot serve this request (no keys or endpoint)"))
			continue
		}
		p := &pending{done: r.Done, r: r}
		pieces := int((r.Len + chunk - 1) / chunk)
		if pieces == 0 {
			pieces = 1
		}
		p.left.Store(int32(pieces))
		first := int(t.spread.Add(1))
		for i := range pieces {
			off := uint64(i) * chunk
			n := min(r.Len-off, chunk)
			pair := rt.pairs[(first+i)%len(rt.pairs)]
			if i == 0 {
				p.first = pair.local
			}
			if i < len(rt.pairs) { // the pairs rotate: the first len(pairs) chunks meet every NIC there is
				if nn := t.nics[pair.local]; !slices.Contains(p.nics, nn) {
					p.nics = append(p.nics, nn)
				}
			}
			op := opWrite
			if r.Op == core.OpRead {
				op = opRead
			}
			wr := &workRequest{req: p, deadline: r.Deadline, wr: sendWR{
				ID: t.ids.Add(1), Op: op, LocalAddr: r.Local + off, Length: uint32(n), LKey: pair.lkey,
				RemoteAddr: r.Remote + off, RKey: pair.rkey, Signaled: true,
			}}
			tg := target{key: connKey{peer: r.Desc.Name, incarnation: r.Desc.Incarnation, local: pair.local, remote: pair.remote},
				addr: endpointOf(r.Desc)}
			if _, seen := groups[tg]; !seen {
				order = append(order, tg)
			}
			groups[tg] = append(groups[tg], wr)
			if d := deadlines[tg]; d.IsZero() || r.Deadline.Before(d) {
				deadlines[tg] = r.Deadline
			}
		}
	}
	for _, tg := range order {
		t.post(tg.key, tg.addr, deadlines[tg], groups[tg])
	}
}

// post hands work to the queue pair for key. A queue pair that broke
// between the lookup and the enqueue (its error seen by the poller
// meanwhile) never had this work on it, so the work goes to the queue
// pair rebuilt in its place; only a second break in a row fails it.
func (t *Transport) post(key connKey, addr string, deadline time.Time, wrs []*workRequest) {
	var err error
	for range 2 {
		var qp *queuePair
		if qp, err = t.queuePairFor(key, addr, deadline); err != nil {
			break
		}
		if t.opts.beforeEnqueue != nil {
			t.opts.beforeEnqueue(qp)
		}
		if err = t.enqueue(qp, wrs); err == nil {
			return
		}
	}
	n := t.nics[key.local]
	for _, wr := range wrs {
		wr.req.complete(n, wr, 0, err)
	}
}

// enqueue adds work to a queue pair and posts what its send queue has room
// for. A queue pair already broken takes nothing: enqueue returns the
// error the work would fail with, and the caller still owns the work.
func (t *Transport) enqueue(qp *queuePair, wrs []*workRequest) error {
	n := qp.nic
	n.mu.Lock()
	if qp.state == qpBroken {
		err := qp.err
		n.mu.Unlock()
		if err == nil || status.CodeOf(err) == status.PermissionDenied {
			// A refused access broke it; this work was not refused.
			err = status.Errorf(status.TransportError, "rdma: queue pair to %s broke", qp.key.peer)
		}
		return err
	}
	for _, wr := range wrs {
		wr.qp = qp
	}
	qp.queue = append(qp.queue, wrs...)
	failed := t.flushLocked(qp)
	n.mu.Unlock()
	n.poke()
	if failed != nil {
		t.breakQP(qp, failed)
	}
	return nil
}

// flushLocked posts queued work while the send queue has room, at most
// maxPost work requests per post. It returns the error of a failed post;
// the caller breaks the queue pair (outside the lock). Call with qp.nic.mu
// held.
func (t *Transport) flushLocked(qp *queuePair) error {
	n := qp.nic
	if qp.state != qpReady {
		return nil
	}
	for len(qp.queue) > 0 && qp.posted < sendDepth {
		k := min(len(qp.queue), sendDepth-qp.posted, maxPost)
		batch := qp.queue[:k]
		wrs := make([]sendWR, k)
		every := t.signalEvery()
		for i, wr := range batch {
			// Selective signalling: every Nth work request of a chain, and
			// its last, asks for a completion; the others complete with the
			// next signalled one (a queue pair completes in order).
			wr.wr.Signaled = i%every == every-1 || i == k-1
			if wr.wr.Signaled {
				t.signaled.Add(1)
			}
			wrs[i] = wr.wr
			n.inflight[wr.wr.ID] = wr
		}
		qp.queue = qp.queue[k:]
		qp.sent = append(qp.sent, batch...)
		qp.posted += k
		t.posts.Add(1)
		if err := qp.qp.PostSend(wrs); err != nil {
			return status.Errorf(status.TransportError, "rdma: posting to %s: %v", qp.key.peer, err)
		}
	}
	return nil
}

// signalEvery is how many work requests of a chain share one completion.
func (t *Transport) signalEvery() int {
	if t.opts.SignalEvery > 0 {
		return t.opts.SignalEvery
	}
	return defaultSignalEvery
}

// defaultSignalEvery signals one work request in 16: fewer completions to
// poll, and a send queue of 256 still frees room 16 at a time.
const defaultSignalEvery = 16

// wcError is the status a failed completion reports: the NIC refusing an
// access (a key revoked by unregister, a write to read-only memory) is a
// permission failure, not worth a retry; anything else is the transport's
// (retried once on the next transport).
func wcError(c completion, peer string) error {
	if c.Status == wcRemoteAccessError {
		return status.Errorf(status.PermissionDenied, "rdma: %s refused the access at its NIC (%v)", peer, c.Status)
	}
	return status.Errorf(status.TransportError, "rdma: work request to %s failed: %v", peer, c.Status)
}
