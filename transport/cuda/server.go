package cuda

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// export is a GPU allocation of this engine that peers may import: the
// registered region and the allocator's record of it.
type export struct {
	region *core.Region
	rec    *allocRec
	attach []byte // fabric attachment, nil when the allocation has none
}

// server is the target side: an abstract-namespace Unix listener for
// same-host peers (fd passing) plus the sessions that arrive through the
// engine's own listener (KindCUDA, leases for fabric imports).
type server struct {
	t    *Transport
	e    *core.Engine
	ln   *lease.Listener
	addr string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	served map[*sconn]struct{}
	closed bool
	wg     sync.WaitGroup

	nextLease atomic.Uint64
	leases    atomic.Int64 // live leases, all sessions
}

func newServer(t *Transport, e *core.Engine) (*server, error) {
	// Abstract sockets have no file permissions: the listener admits only
	// processes of our own user (or root), which alone may import our
	// memory, secret or not.
	ln, err := lease.Listen(e, "cuda", KindCUDA)
	if err != nil {
		return nil, err
	}
	s := &server{t: t, e: e, ln: ln, addr: ln.Addr(), conns: map[net.Conn]struct{}{}, served: map[*sconn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ln.Serve(s.admit)
	}()
	return s, nil
}

// admit starts serving an accepted connection (on the loop's goroutine).
func (s *server) admit(c *net.UnixConn, p *acceptloop.Pending) {
	if !s.track(c) {
		p.Done(false)
		c.Close()
		p.Release()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer p.Release()
		defer s.untrack(c)
		defer func() { _ = recover() }() // a bug here must not take the host process down
		if _, err := s.ln.Handshake(c, p); err != nil {
			return
		}
		s.serve(c, c)
	}()
}

// serveTCP serves a session that arrived through the engine's listener
// (already authenticated); the engine closes c when it returns.
func (s *server) serveTCP(c net.Conn) {
	if !s.track(c) {
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	defer s.untrack(c)
	s.serve(c, nil)
}

// track adds c to the connections closed by close; false once closed.
// The caller holds a wg count only after track succeeded.
func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

func (s *server) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// closeWait bounds how long close waits for initiators to release their
// leases (their copies in flight) before it closes their sessions.
const closeWait = leaseGrace

// close stops accepting and granting, gives the initiators up to
// closeWait to release their leases (a copy they queued may still be
// writing), then closes every session, which releases what is left, and
// waits for the goroutines.
func (s *server) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.ln.Close()
	deadline := time.Now().Add(closeWait)
	for s.leases.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
}

func (s *server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// sconn is the state of one served session.
type sconn struct {
	s   *server
	c   net.Conn
	uc  *net.UnixConn // nil for sessions over the engine's TCP listener
	wmu sync.Mutex

	leases *lease.Table

	mu       sync.Mutex
	imported map[uint64]bool // allocations this session was given an fd of
}

func (sc *sconn) write(typ uint8, payload []byte, fds []int) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_ = sc.c.SetWriteDeadline(time.Now().Add(sc.s.e.Options().DefaultTimeout))
	if len(fds) > 0 {
		if err := lease.WriteFrame(sc.uc, lease.Frame(typ, payload), fds); err != nil {
			return status.Errorf(status.TransportError, "cuda: sendmsg: %w", err)
		}
		return nil
	}
	return wire.WriteFrame(sc.c, typ, payload)
}

// serve answers one session until it fails or is closed, then releases the
// leases it still holds.
func (s *server) serve(c net.Conn, uc *net.UnixConn) {
	sc := &sconn{s: s, c: c, uc: uc, imported: map[uint64]bool{},
		leases: lease.NewTable(s.e, lease.TableCounts{Held: &s.leases})}
	s.mu.Lock()
	s.served[sc] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.served, sc)
		s.mu.Unlock()
		sc.leases.Close()
	}()
	enc := wire.NewEncoder(nil)
	enc.U64(s.e.Incarnation())
	enc.U32(uint32(os.Getpid()))
	if sc.write(msgHello, enc.Out(), nil) != nil {
		return
	}
	var buf []byte
	for {
		// A session idles between calls, but a frame once begun must
		// arrive within the engine's timeout.
		typ, payload, err := wire.ReadFrameWithin(c, c, maxFrame, buf, s.e.Options().DefaultTimeout)
		if err != nil {
			return
		}
		buf = payload[:0]
		d := wire.NewDecoder(payload)
		switch typ {
		case msgImport:
			id := d.U64()
			alloc := d.U64()
			if d.Finish() != nil {
				return
			}
			if sc.handleImport(id, alloc) != nil {
				return
			}
		case msgLease:
			if sc.handleLease(payload) != nil {
				return
			}
		case msgRelease:
			id := d.U64()
			if d.Finish() != nil {
				return
			}
			sc.release(id)
		default:
			return // the peer speaks something else
		}
	}
}

// handleImport exports the allocation's handle as an fd and sends it.
func (sc *sconn) handleImport(id, alloc uint64) error {
	t := sc.s.t
	fd, base, size, err := t.exportFD(alloc, sc.uc != nil)
	enc := wire.NewEncoder(nil)
	enc.U64(id)
	nfd := uint32(0)
	if err == nil {
		nfd = 1
	}
	enc.U32(nfd)
	enc.Status(err)
	enc.U64(base)
	enc.U64(size)
	if err != nil {
		return sc.write(msgImported, enc.Out(), nil)
	}
	sc.mu.Lock()
	sc.imported[alloc] = true
	sc.mu.Unlock()
	werr := sc.write(msgImported, enc.Out(), []int{fd})
	closeFDs([]int{fd}) // the message carries its own duplicate
	return werr
}

// exportFD checks that alloc is a registered GPU allocation of this engine
// that permits remote read and write (core.Region.HandleShareable), and
// exports it as a new fd.
func (t *Transport) exportFD(alloc uint64, unixSession bool) (fd int, base, size uint64, err error) {
	if !unixSession {
		return -1, 0, 0, status.Errorf(status.Unsupported,
			"cuda: file descriptors travel only over the same-host Unix endpoint")
	}
	t.mu.Lock()
	ex := t.exports[alloc]
	e := t.e
	t.mu.Unlock()
	if ex == nil || e == nil {
		return -1, 0, 0, status.Errorf(status.NotFound, "cuda: allocation %d is not registered GPU memory here", alloc)
	}
	r, err := e.Acquire(ex.region.Addr, ex.region.Len, core.AccessLocal)
	if err != nil {
		return -1, 0, 0, err
	}
	defer e.Release(r)
	if r != ex.region {
		return -1, 0, 0, status.Errorf(status.NotFound, "cuda: allocation %d is no longer registered", alloc)
	}
	if !r.HandleShareable() {
		// An imported handle is mapped with whatever access the importer
		// sets (cuMemSetAccess), over the whole allocation: it is handed
		// out only where the registration grants that much.
		return -1, 0, 0, status.Errorf(status.PermissionDenied,
			"cuda: allocation %d [%#x, %#x) is not registered for remote read and write; its handle would grant both",
			alloc, r.Addr, r.End())
	}
	fd, err = ex.rec.Mapping.ExportFD()
	if err != nil {
		t.exportFailures.Add(1)
		return -1, 0, 0, status.Errorf(status.CodeOf(err), "cuda: exporting allocation %d: %w", alloc, err)
	}
	t.exportsTotal.Add(1)
	return fd, r.Addr, r.Len, nil
}

// handleLease acquires each requested range and answers with one status
// per range; the granted ranges stay held until release, the end of the
// session, or the ttl plus leaseGrace.
func (sc *sconn) handleLease(payload []byte) error {
	s := sc.s
	var m lease.Request
	if err := lease.DecodeRequest(payload, maxRanges, &m); err != nil {
		return err
	}
	id, ttl, ranges := m.ID, min(m.TTL, maxTTL), m.Ranges
	e := s.e
	var pins lease.Pins
	enc := wire.NewEncoder(make([]byte, 0, 64+len(ranges)*64))
	var body wire.Encoder
	body.Reset(make([]byte, 0, len(ranges)*64))
	closing := s.isClosed()
	for _, q := range ranges {
		var r *core.Region
		err := status.Errorf(status.Closed, "cuda: the target's transport is being uninstalled")
		if !closing {
			r, err = pins.Acquire(e, q)
		}
		if err != nil {
			s.t.leasesDenied.Add(1)
			lease.AppendAnswerEntry(&body, status.CodeOf(err), err.Error())
			continue
		}
		lease.AppendAnswerEntry(&body, status.OK, "")
		var alloc uint64
		if r.Alloc != nil {
			alloc = r.Alloc.ID
		}
		body.U64(alloc)
		body.U64(r.Addr)
		body.U64(r.Len)
		isCUDA := uint8(0)
		if r.Loc.IsCUDA() {
			isCUDA = 1
		}
		body.U8(isCUDA)
		body.String(s.t.uuidOf(r.Loc.Device, r.Loc.IsCUDA()))
	}
	var leaseID uint64
	if len(pins.Regions) > 0 {
		leaseID = s.nextLease.Add(1)
		if err := sc.leases.Hold(leaseID, pins, ttl+leaseGrace); err != nil {
			pins.Release(e)
			return err
		}
		s.t.leasesTotal.Add(1)
	}
	enc.U64(id)
	enc.U64(leaseID)
	enc.U32(uint32(len(ranges)))
	enc.Raw(body.Out())
	return sc.write(msgLeased, enc.Out(), nil)
}

// release ends a lease once (unknown ids are ignored: expired already).
func (sc *sconn) release(id uint64) { sc.leases.Release(id) }

// revoke tells the sessions that imported any of allocs that they are
// gone, so the importers release their mappings (which keep the memory
// alive) without waiting for their next transfer. Best effort, in the
// background: the importers also find out from the descriptor and the
// leases.
func (s *server) revoke(allocs []uint64) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	type job struct {
		sc     *sconn
		allocs []uint64
	}
	var jobs []job
	for sc := range s.served {
		var mine []uint64
		sc.mu.Lock()
		for _, a := range allocs {
			if sc.imported[a] {
				mine = append(mine, a)
				delete(sc.imported, a)
			}
		}
		sc.mu.Unlock()
		if len(mine) > 0 {
			jobs = append(jobs, job{sc, mine})
		}
	}
	if len(jobs) == 0 {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		for _, j := range jobs {
			enc := wire.NewEncoder(nil)
			enc.U32(uint32(len(j.allocs)))
			for _, a := range j.allocs {
				enc.U64(a)
			}
			if j.sc.write(msgRevoke, enc.Out(), nil) != nil {
				j.sc.c.Close()
			}
		}
	}()
}
