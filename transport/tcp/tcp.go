package tcp

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host/slab"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

const (
	// chunkSize is the most one request on the wire carries: larger
	// requests are split, and their chunks spread over the streams.
	chunkSize = 1 << 20
	// groupBytes is how much a stream is given before the next one gets
	// its turn; many small requests go out together on one stream.
	groupBytes = 1 << 20
)

// Transport moves data to and from peers in other processes and on other
// hosts over TCP. See the package documentation.
type Transport struct {
	mu       sync.Mutex
	e        *core.Engine
	log      *slog.Logger // the engine's from Install; discards before
	streams  int
	closed   bool
	pools    map[peerKey]*pool
	srvConns map[net.Conn]struct{}
	ctx      context.Context // canceled by Uninstall: stops dials
	cancel   context.CancelFunc
	wg       sync.WaitGroup // goroutines this transport started
	srvWG    sync.WaitGroup // connection handlers running
	// bufs holds the connections' receive buffers outside the Go heap; its
	// blocks in use count the readers alive, and Uninstall closes it once
	// every reader has returned.
	bufs *slab.Slab
	// unhandle stops the listener from passing us data connections.
	unhandle func()

	reqMu sync.Mutex
	reqs  map[*core.Request]*reqState // for Cancel

	freeMu sync.Mutex
	free   [subClasses][]*submission // submissions given back, by class, for Submit to reuse

	conns      atomic.Int64
	goroutines atomic.Int64
	handlers   atomic.Int64
	inflight   atomic.Int64
	sent       atomic.Int64
	received   atomic.Int64
	dials      atomic.Int64
	dialErrs   atomic.Int64
	timeouts   atomic.Int64
	protoErrs  atomic.Int64
	rejected   atomic.Int64
	stageBufs  atomic.Int64 // staging buffers mapped (both sides)
	staged     atomic.Int64 // bytes copied through them
	canceled   atomic.Int64 // requests Cancel found in flight
	idleClosed atomic.Int64 // connections closed for being idle
	inlineW    atomic.Int64 // groups written by their submitter
	writerW    atomic.Int64 // groups written by a connection's writer goroutine
	handedOff  atomic.Int64 // inline groups the socket did not take at once, finished by the writer

	repliesByReader atomic.Int64 // replies read by a connection's reader goroutine
	repliesByCaller atomic.Int64 // replies read by a caller waiting for its batch (Help)
	readKicks       atomic.Int64 // callers that took the read side from the reader goroutine at a reply boundary

	// wrapConn, when set (by the tests, before the first dial), wraps
	// each data connection this transport dials: fault injection.
	wrapConn func(net.Conn) net.Conn
	// onCallerRead, when set (by the tests, before the first transfer),
	// runs each time a waiting caller has taken a connection's read side.
	onCallerRead func()
	// onPastLimit, when set (by the tests), runs each time a timed
	// caller's limit passes while it is inside a reply.
	onPastLimit func()
	// watchDelay, when set (by the tests, before the first transfer),
	// replaces the package's watchDelay.
	watchDelay time.Duration

	reaping bool          // a reaper goroutine runs (under mu)
	noConns chan struct{} // dropConn tells the reaper the last connection went
}

// idleTimeout: a connection to a peer that carried nothing for this long
// is closed (the next request dials again), so a long-lived engine that
// talked to many peers does not keep their sockets. Tests shorten it.
var idleTimeout atomic.Int64

func init() { idleTimeout.Store(int64(2 * time.Minute)) }

// reapLocked starts the reaper if none runs; t.mu is held. The reaper
// lives while there are connections, and leaves with the last one.
func (t *Transport) reapLocked() {
	if t.reaping || t.closed {
		return
	}
	t.reaping = true
	t.goroutine(t.reap)
}

func (t *Transport) reap() {
	idle := time.Duration(idleTimeout.Load())
	tick := time.NewTicker(max(idle/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		case <-t.noConns:
		}
		before := time.Now().Add(-idle)
		t.mu.Lock()
		var conns []*conn
		for _, p := range t.pools {
			for _, c := range p.conns {
				if c != nil {
					conns = append(conns, c)
				}
			}
		}
		if len(conns) == 0 {
			t.reaping = false
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		for _, c := range conns {
			c.closeIfIdle(before)
		}
	}
}

// New returns an uninstalled tcp transport with options o.
func New(o Options) *Transport {
	o = o.withDefaults()
	return &Transport{streams: o.Streams, pools: map[peerKey]*pool{}, srvConns: map[net.Conn]struct{}{}, reqs: map[*core.Request]*reqState{},
		noConns: make(chan struct{}, 1), log: slog.New(slog.DiscardHandler)}
}

func (t *Transport) Name() string { return Name }

// Options are the options the transport was made with, defaults filled in.
func (t *Transport) Options() Options                      { return Options{Streams: t.streams} }
func (t *Transport) RegisterMemory([]*core.Region) error   { return nil }
func (t *Transport) UnregisterMemory([]*core.Region) error { return nil }

// Install serves the engine's data connections and remembers the engine
// for dialing peers.
func (t *Transport) Install(e *core.Engine) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.e != nil || t.closed {
		return status.Errorf(status.InvalidArgument, "tcp transport instance already installed")
	}
	// t.mu is held until Install returns, so a connection handed over
	// before then waits in serve for the fields below.
	unhandle, err := e.HandleConn(KindData, t.serve)
	if err != nil {
		return err
	}
	bufs, err := slab.New(readBufSize, 16)
	if err != nil {
		unhandle()
		return err
	}
	t.bufs = bufs
	t.e = e
	t.log = e.Logger().With("transport", "tcp")
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.unhandle = unhandle
	return nil
}

// Endpoints publishes the engine's listener as the tcp endpoint.
func (t *Transport) Endpoints() []wire.Endpoint {
	t.mu.Lock()
	e := t.e
	t.mu.Unlock()
	if e == nil {
		return nil
	}
	return []wire.Endpoint{{Transport: Name, Addr: e.ListenAddr()}}
}

// Eligible: the peer publishes a tcp endpoint. GPU memory goes through
// host memory: this side stages its own (with the engine's memory kind for
// it), the target stages its own.
func (t *Transport) Eligible(r *core.Request) bool {
	return r.Desc != nil && tcpAddr(r.Desc) != "" && r.LocalRegion != nil &&
		(!r.LocalRegion.Loc.IsCUDA() || r.LocalRegion.Engine().Memory().Has(r.LocalRegion.Loc.Kind))
}

func tcpAddr(d *wire.SegmentDesc) string {
	for _, ep := range d.Endpoints {
		if ep.Transport == Name {
			return ep.Addr
		}
	}
	return ""
}

// Submit queues the requests on the peers' streams and returns at once.
// Requests on local GPU memory go to a staging goroutine instead.
func (t *Transport) Submit(reqs []*core.Request) {
	order := reqs // host-memory requests first, then those to stage
	direct := len(reqs)
	for _, r := range reqs {
		if r.LocalRegion.Loc.IsCUDA() {
			direct--
		}
	}
	if direct < len(reqs) {
		order = make([]*core.Request, 0, len(reqs))
		for _, staged := range []bool{false, true} {
			for _, r := range reqs {
				if r.LocalRegion.Loc.IsCUDA() == staged {
					order = append(order, r)
				}
			}
		}
	}
	var states []reqState
	var chunks []chunk
	var sub *submission // nil: the states are not reused (staging holds them on its goroutine)
	if direct == len(order) {
		nchunks := 0
		for _, r := range order {
			nchunks += int((r.Len + chunkSize - 1) / chunkSize)
		}
		sub = t.takeSubmission(len(order), nchunks)
		states, chunks = sub.states[:len(order)], sub.chunksFor(nchunks)
	} else {
		states = make([]reqState, len(order))
	}
	for i, r := range order {
		op := opWrite
		if r.Op == core.OpRead {
			op = opRead
		}
		states[i] = reqState{t: t, r: r, sub: sub, op: op, local: r.Local, remote: r.Remote, n: r.Len, deadline: r.Deadline}
		states[i].prepare(i >= direct)
	}
	// Counted and prepared before Cancel can find them.
	t.inflight.Add(int64(len(states)))
	t.reqMu.Lock()
	for i, r := range order {
		t.reqs[r] = &states[i]
	}
	t.reqMu.Unlock()
	if direct > 0 {
		peers := peerOf{reqs: order[:direct]}
		t.start(states[:direct], chunks, &peers)
	}
	if direct < len(states) {
		t.startStaged(states[direct:], &peerOf{reqs: order[direct:]})
	}
}

// peerOf names the peer of each request given to start: that of
// reqs[i], or key and name for every request when reqs is nil.
type peerOf struct {
	reqs []*core.Request
	key  peerKey
	name string
	desc *wire.SegmentDesc // the descriptor key was made from
}

func (p *peerOf) at(i int) (peerKey, string) {
	if p.reqs == nil {
		return p.key, p.name
	}
	r := p.reqs[i]
	if r.Desc != p.desc { // a batch's requests to one peer share its descriptor
		p.desc, p.key = r.Desc, peerKey{addr: tcpAddr(r.Desc), incarnation: r.Desc.Incarnation}
	}
	return p.key, r.Peer.Name()
}

// Cancel drops the requests as soon as no goroutine is inside their local
// memory; chunks already sent are answered into scratch.
func (t *Transport) Cancel(reqs []*core.Request) {
	states := make([]*reqState, 0, len(reqs))
	t.reqMu.Lock()
	for _, r := range reqs {
		if s := t.reqs[r]; s != nil {
			s.hold()
			states = append(states, s)
		}
	}
	t.reqMu.Unlock()
	t.canceled.Add(int64(len(states)))
	for _, s := range states {
		s.kill(errCanceled)
		if c := s.conn.Load(); c != nil {
			c.kickCaller() // a caller reading for this batch looks up
		}
		s.unhold()
	}
}

// Help lets the goroutine waiting for r's batch read the replies of r's
// connection itself, if no other goroutine is inside a reply there, until
// done closes or nothing more is due: the reply then wakes no reader
// goroutine that would wake the caller (see conn.help). A timed wait
// lets go at the first reply boundary after until.
func (t *Transport) Help(r *core.Request, done <-chan struct{}, until time.Time) {
	t.reqMu.Lock()
	s := t.reqs[r]
	if s != nil {
		s.hold()
	}
	t.reqMu.Unlock()
	if s == nil {
		return
	}
	c := s.conn.Load()
	s.unhold()
	if c != nil {
		c.help(done, until)
	}
}

var errCanceled = status.Errorf(status.Canceled, "tcp: request canceled")

// peerKey names one incarnation of a peer: a restarted peer gets a new
// incarnation, hence new connections.
type peerKey struct {
	addr        string
	incarnation uint64
}

// pool holds the streams to one peer.
type pool struct {
	key   peerKey
	name  string // the peer's segment name, to invalidate its descriptor
	conns []*conn
	cur   int    // stream being filled
	fill  uint64 // bytes given to it
	// spill holds, per stream, the chunks start is about to queue there
	// (under t.mu; kept empty between calls, its room reused).
	spill   [][]*chunk
	touched bool // start has chunks for it in spill
}

// prepare sets the chunks the request will count down: one for a request
// that is staged (its pieces are requests of their own), else one per
// chunkSize bytes. The caller counts it in t.inflight, before anything
// else can see it.
func (s *reqState) prepare(staged bool) {
	s.remaining = 1
	if !staged {
		s.remaining = int((s.n + chunkSize - 1) / chunkSize)
	}
}

// start splits prepared requests into chunks and queues them, in chunks
// if it has room for them all (else in new memory). peers gives the peer
// of request i.
func (t *Transport) start(states []reqState, chunks []chunk, peers *peerOf) {
	total := 0
	for i := range states {
		total += int((states[i].n + chunkSize - 1) / chunkSize)
	}
	if len(chunks) < total {
		chunks = make([]chunk, total)
	}
	var failed []*reqState
	var failErr []error
	now := time.Now()

	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		for i := range states {
			states[i].settleAll(core.ErrUninstalled)
		}
		return
	}
	var p *pool
	var touchedBuf [4]*pool
	touched := touchedBuf[:0]
	var firstPool *pool // the stream of the first chunk: the one a waiting caller reads (Help)
	firstSlot := 0
	next := 0
	for i := range states {
		s := &states[i]
		k, name := peers.at(i)
		switch {
		case !s.deadline.IsZero() && !now.Before(s.deadline):
			failed, failErr = append(failed, s), append(failErr, status.Errorf(status.Timeout, "tcp: deadline passed before the request was sent"))
			continue
		case k.addr == "":
			failed, failErr = append(failed, s), append(failErr, status.Errorf(status.Unsupported, "tcp: peer %s publishes no tcp endpoint", name))
			continue
		}
		if p == nil || p.key != k {
			p = t.poolLocked(k, name)
			if !p.touched {
				p.touched = true
				touched = append(touched, p)
			}
		}
		for off := uint64(0); off < s.n; off += chunkSize {
			c := &chunks[next]
			next++
			*c = chunk{s: s, off: off, n: uint32(min(chunkSize, s.n-off))}
			if p.fill > 0 && p.fill+uint64(c.n) > groupBytes {
				p.cur = (p.cur + 1) % len(p.conns)
				p.fill = 0
			}
			p.fill += uint64(c.n)
			p.spill[p.cur] = append(p.spill[p.cur], c)
			if firstPool == nil {
				firstPool, firstSlot = p, p.cur
			}
		}
	}
	var inlineBuf [4]*conn
	inline := inlineBuf[:0] // the streams this goroutine writes itself
	// One group larger than inlineMax may be written here too: the
	// writer's wake-up is then saved where a batch's bytes are, and the
	// other streams still go in parallel (their writers are woken before
	// this goroutine writes).
	largeTaken := false
	for _, p := range touched {
		for i, cs := range p.spill {
			// A connection that died since connLocked looked is replaced.
			// A caller reads the replies of one stream only (its
			// first request's): the reader goroutines of the others
			// are woken for theirs.
			helped := p == firstPool && i == firstSlot // every caller will read its replies (Help)
			for _, ch := range cs {
				helped = helped && ch.s.r != nil && ch.s.r.CallerWaits()
			}
			for len(cs) > 0 {
				c := t.connLocked(p, i)
				for _, ch := range cs {
					ch.s.conn.Store(c) // for Help and Cancel
				}
				w := wireBytes(cs)
				ok, now := c.enqueue(cs, helped, w <= inlineMax || (w <= inlineGroupMax && !largeTaken))
				if now {
					inline = append(inline, c)
					largeTaken = largeTaken || w > inlineMax
				}
				if ok {
					break
				}
			}
			clear(cs)
			p.spill[i] = cs[:0]
		}
		p.touched = false
	}
	t.mu.Unlock()
	for _, c := range inline {
		c.writeInline()
	}
	for i, s := range failed {
		s.settleAll(failErr[i])
	}
}

// wireBytes is what writing the chunks puts on the wire: a header each,
// and the payloads of WRITEs. (A state's op is set before its chunks are
// queued.)
func wireBytes(cs []*chunk) int {
	n := len(cs) * reqHeaderSize
	for _, ch := range cs {
		if ch.s.op == opWrite {
			n += int(ch.n)
		}
	}
	return n
}

// settleAll fails a request none of whose chunks was queued.
func (s *reqState) settleAll(err error) {
	s.mu.Lock()
	s.remaining = 0
	s.mu.Unlock()
	s.kill(err)
}

// poolLocked returns the pool for k, creating it. (The connections of an
// earlier incarnation at the same address fail by themselves: that
// process is gone.)
func (t *Transport) poolLocked(k peerKey, name string) *pool {
	if p := t.pools[k]; p != nil {
		return p
	}
	p := &pool{key: k, name: name, conns: make([]*conn, max(1, t.streams)), spill: make([][]*chunk, max(1, t.streams))}
	t.pools[k] = p
	return p
}

// connLocked returns a live connection for stream i of p, starting one
// if needed.
func (t *Transport) connLocked(p *pool, i int) *conn {
	if c := p.conns[i]; c != nil && !c.isDead() {
		return c
	}
	c := newConn(t, p, i)
	p.conns[i] = c
	t.reapLocked()
	return c
}

// dropConn forgets a dead connection.
func (t *Transport) dropConn(c *conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := c.pool
	if p.conns[c.slot] == c {
		p.conns[c.slot] = nil
	}
	if t.pools[p.key] != p {
		return
	}
	for _, x := range p.conns {
		if x != nil {
			return
		}
	}
	delete(t.pools, p.key)
	if len(t.pools) == 0 {
		select {
		case t.noConns <- struct{}{}:
		default:
		}
	}
}

func (t *Transport) goroutine(f func()) {
	t.wg.Add(1)
	t.goroutines.Add(1)
	go func() {
		defer t.wg.Done()
		defer t.goroutines.Add(-1)
		f()
	}()
}

// Uninstall stops serving, fails requests in flight with ErrUninstalled,
// closes every connection and waits for every goroutine.
func (t *Transport) Uninstall() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	unhandle := t.unhandle
	var conns []*conn
	for _, p := range t.pools {
		for _, c := range p.conns {
			if c != nil {
				conns = append(conns, c)
			}
		}
	}
	srv := make([]net.Conn, 0, len(t.srvConns))
	for nc := range t.srvConns {
		srv = append(srv, nc)
	}
	t.mu.Unlock()
	if unhandle != nil {
		unhandle()
	}
	for _, c := range conns {
		c.fail(core.ErrUninstalled)
	}
	if t.cancel != nil {
		t.cancel() // dials in progress give up (their requests have failed above)
	}
	for _, nc := range srv {
		nc.Close()
	}
	t.wg.Wait()
	t.srvWG.Wait()
	if t.bufs != nil {
		return t.bufs.Close() // no reader is left to use a buffer
	}
	return nil
}

// recvBuffer takes a receive buffer for one connection; free returns it.
func (t *Transport) recvBuffer() (buf []byte, free func(), err error) {
	if t.bufs == nil { // serving without Install (the fuzz tests)
		return make([]byte, readBufSize), func() {}, nil
	}
	b, err := t.bufs.Alloc()
	if err != nil {
		return nil, nil, err // closed: the transport is being uninstalled
	}
	return b.Bytes()[:readBufSize], func() { _ = t.bufs.Free(b) }, nil
}

// Stats reports what the transport holds (connections, goroutines,
// requests) and what it has done (bytes, dials, failures).
func (t *Transport) Stats() map[string]int64 {
	return map[string]int64{
		"connections":        t.conns.Load(),
		"server_connections": t.handlers.Load(),
		"goroutines":         t.goroutines.Load(),
		"requests_in_flight": t.inflight.Load(),
		"bytes_sent":         t.sent.Load(),
		"bytes_received":     t.received.Load(),
		"dials":              t.dials.Load(),
		"dial_failures":      t.dialErrs.Load(),
		"timeouts":           t.timeouts.Load(),
		"protocol_errors":    t.protoErrs.Load(),
		"rejected":           t.rejected.Load(),
		"receive_buffers":    t.buffersInUse(),
		"staging_buffers":    t.stageBufs.Load(),
		"bytes_staged":       t.staged.Load(),
		"canceled":           t.canceled.Load(),
		"idle_closed":        t.idleClosed.Load(),
		"writes_inline":      t.inlineW.Load(),
		"writes_by_writer":   t.writerW.Load(),
		"writes_handed_off":  t.handedOff.Load(),
		"replies_by_reader":  t.repliesByReader.Load(),
		"replies_by_caller":  t.repliesByCaller.Load(),
		"read_side_kicks":    t.readKicks.Load(),
	}
}

func (t *Transport) buffersInUse() int64 {
	t.mu.Lock()
	b := t.bufs
	t.mu.Unlock()
	if b == nil {
		return 0
	}
	return int64(b.Stats().InUse)
}
