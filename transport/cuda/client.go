package cuda

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// sessKey names a session: the target engine's incarnation and whether it
// runs over the engine's TCP listener (fabric) or our Unix endpoint.
type sessKey struct {
	inc uint64
	tcp bool
}

// session is the initiator's connection to a target: imports (Unix only)
// and leases. Calls from several batches share it; replies are matched by
// id.
type session struct {
	t    *Transport
	log  *slog.Logger // the engine's
	key  sessKey
	name string // the target's segment name, for messages
	c    net.Conn
	r    io.Reader
	fdr  *lease.FDReader // nil over TCP

	wmu sync.Mutex

	mu   sync.Mutex
	next uint64
	wait map[uint64]*call
	err  error // set once the session is dead
	done chan struct{}
}

type call struct {
	ch chan reply
	// orphan disposes of a reply nobody waits for any more (a late import
	// carries an fd; a late lease holds regions at the target).
	orphan func(reply)
}

type reply struct {
	typ     uint8
	payload []byte
	fds     []int
	err     error
}

func (t *Transport) endpoint(desc *wire.SegmentDesc, transport string) string {
	for _, ep := range desc.Endpoints {
		if ep.Transport == transport {
			return ep.Addr
		}
	}
	return ""
}

// session returns a live session to the target of desc, dialing one if
// needed.
func (t *Transport) session(desc *wire.SegmentDesc, tcp bool, deadline time.Time) (*session, error) {
	key := sessKey{desc.Incarnation, tcp}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, core.ErrUninstalled
	}
	if s := t.sessions[key]; s != nil && !s.dead() {
		t.mu.Unlock()
		return s, nil
	}
	e := t.e
	t.mu.Unlock()

	s, err := t.dial(e, desc, tcp, deadline)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		s.c.Close()
		return nil, core.ErrUninstalled
	}
	if old := t.sessions[key]; old != nil && !old.dead() {
		t.mu.Unlock()
		s.c.Close() // lost a race with another dialer
		return old, nil
	}
	t.sessions[key] = s
	t.readers.Add(1)
	t.mu.Unlock()
	go s.readLoop()
	return s, nil
}

// dial opens a lease session with the target of desc and logs the outcome.
func (t *Transport) dial(e *core.Engine, desc *wire.SegmentDesc, tcp bool, deadline time.Time) (*session, error) {
	log := e.Logger().With("transport", Name)
	via := map[bool]string{true: "tcp", false: "unix"}[tcp]
	s, err := t.dialSession(e, desc, tcp, deadline)
	if err != nil {
		log.Debug("cuda lease session failed", "peer", desc.Name, "via", via, "err", err)
		return nil, err
	}
	s.log = log
	log.Debug("cuda lease session up", "peer", desc.Name, "via", via)
	return s, nil
}

func (t *Transport) dialSession(e *core.Engine, desc *wire.SegmentDesc, tcp bool, deadline time.Time) (*session, error) {
	s := &session{t: t, key: sessKey{desc.Incarnation, tcp}, name: desc.Name, wait: map[uint64]*call{}, done: make(chan struct{})}
	if tcp {
		addr := t.endpoint(desc, wire.ControlEndpoint)
		if addr == "" {
			return nil, status.Errorf(status.TransportError, "cuda: %s publishes no control endpoint", desc.Name)
		}
		c, err := e.Dial(addr, KindCUDA, deadline)
		if err != nil {
			return nil, status.Errorf(status.CodeOf(err), "cuda: lease session with %s: %w", desc.Name, err)
		}
		s.c, s.r = c, c
	} else {
		addr := t.endpoint(desc, "cuda")
		if addr == "" {
			return nil, status.Errorf(status.TransportError, "cuda: %s publishes no cuda endpoint", desc.Name)
		}
		d := net.Dialer{Deadline: deadline}
		c, err := d.Dial("unix", addr)
		if err != nil {
			code := status.TransportError
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				code = status.Timeout
			}
			return nil, status.Errorf(code, "cuda: connect to %s at %s: %w", desc.Name, addr, err)
		}
		// Until the session is registered, Uninstall finds the connection
		// here and closes it, rather than waiting out a slow handshake.
		if !t.trackDial(c, true) {
			c.Close()
			return nil, core.ErrUninstalled
		}
		defer t.trackDial(c, false)
		if _, err := wire.ClientHandshake(c, wire.HandshakeConfig{
			Secret: e.Options().Secret, Deadline: deadline, LocalName: e.Name(),
		}, KindCUDA); err != nil {
			c.Close()
			return nil, status.Errorf(status.CodeOf(err), "cuda: handshake with %s: %w", desc.Name, err)
		}
		uc := c.(*net.UnixConn)
		s.c, s.fdr = c, lease.NewFDReader(uc, maxFDsPerMsg, lease.FDCounts{})
		s.r = s.fdr
	}
	_ = s.c.SetReadDeadline(deadline)
	typ, payload, err := wire.ReadFrame(s.r, maxFrame, nil)
	_ = s.c.SetReadDeadline(time.Time{})
	if err == nil && typ != msgHello {
		err = status.Errorf(status.Protocol, "cuda: %s sent frame %d instead of hello", desc.Name, typ)
	}
	if err == nil {
		d := wire.NewDecoder(payload)
		inc := d.U64()
		_ = d.U32()
		if err = d.Finish(); err == nil && inc != desc.Incarnation {
			err = status.Errorf(status.TransportError,
				"cuda: the endpoint of %s belongs to engine incarnation %#x, not %#x (restarted?)", desc.Name, inc, desc.Incarnation)
		}
	}
	if err != nil {
		s.c.Close()
		if s.fdr != nil {
			s.fdr.CloseAll()
		}
		return nil, err
	}
	return s, nil
}

func (s *session) dead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// fail marks the session dead, closes it and fails every waiting call.
func (s *session) fail(err error) {
	s.abort(err)
	s.c.Close()
}

// abort marks the session dead and fails every waiting call, but keeps
// the connection, and with it the leases the target holds for copies
// still in flight; Uninstall closes it once the copies are done.
func (s *session) abort(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	waits := s.wait
	s.wait = map[uint64]*call{}
	s.mu.Unlock()
	if s.log != nil {
		s.log.Debug("cuda lease session closed", "peer", s.name, "waiting_calls", len(waits), "reason", err)
	}
	for _, c := range waits {
		c.ch <- reply{err: err}
	}
}

func (s *session) readLoop() {
	t := s.t
	defer t.readers.Done()
	defer func() {
		if p := recover(); p != nil { // a bug here must not take the host process down
			s.fail(status.Errorf(status.Internal, "cuda: session reader panicked: %v", p))
		}
		// Fds that arrived for nobody, and the session's imports: a dead
		// session means the target can no longer grant leases over it.
		if s.fdr != nil {
			s.fdr.CloseAll()
		}
		t.sessionDied(s)
		close(s.done)
	}()
	for {
		typ, payload, err := wire.ReadFrame(s.r, maxFrame, nil)
		if err != nil {
			s.fail(status.Errorf(status.TransportError, "cuda: session with %s: %w", s.name, err))
			return
		}
		d := wire.NewDecoder(payload)
		if typ == msgRevoke {
			n := d.Count(maxRanges, 8)
			allocs := make([]uint64, 0, n)
			for i := 0; i < n && d.Err() == nil; i++ {
				allocs = append(allocs, d.U64())
			}
			if d.Finish() != nil {
				s.fail(status.Errorf(status.Protocol, "cuda: %s sent a bad revocation", s.name))
				return
			}
			t.revoked(s.key.inc, allocs)
			continue
		}
		id := d.U64()
		rep := reply{typ: typ, payload: payload}
		switch typ {
		case msgImported:
			n := int(d.U32())
			if d.Err() != nil || n > maxFDsPerMsg || s.fdr == nil && n != 0 {
				s.fail(status.Errorf(status.Protocol, "cuda: %s sent a bad import reply", s.name))
				return
			}
			if n > 0 {
				fds, err := s.fdr.Take(n)
				if err != nil {
					s.fail(err)
					return
				}
				rep.fds = fds
			}
		case msgLeased:
		default:
			s.fail(status.Errorf(status.Protocol, "cuda: %s sent unexpected frame %d", s.name, typ))
			return
		}
		if d.Err() != nil {
			closeFDs(rep.fds)
			s.fail(status.Errorf(status.Protocol, "cuda: %s sent a truncated reply", s.name))
			return
		}
		s.mu.Lock()
		c := s.wait[id]
		delete(s.wait, id)
		s.mu.Unlock()
		if c == nil {
			closeFDs(rep.fds) // a reply to nothing we asked: drop it
			continue
		}
		c.ch <- rep
	}
}

func (s *session) write(typ uint8, payload []byte, deadline time.Time) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.c.SetWriteDeadline(deadline)
	if err := wire.WriteFrame(s.c, typ, payload); err != nil {
		s.fail(status.Errorf(status.TransportError, "cuda: session with %s: %w", s.name, err))
		return err
	}
	return nil
}

// call sends a request built by build (after the id) and waits for the
// reply until deadline.
func (s *session) call(typ uint8, build func(*wire.Encoder), orphan func(reply), deadline time.Time) (reply, error) {
	c := &call{ch: make(chan reply, 1), orphan: orphan}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return reply{}, err
	}
	s.next++
	id := s.next
	s.wait[id] = c
	s.mu.Unlock()
	enc := wire.NewEncoder(nil)
	enc.U64(id)
	build(&enc)
	if err := s.write(typ, enc.Out(), deadline); err != nil {
		s.forget(id, c)
		return reply{}, err
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case rep := <-c.ch:
		return rep, rep.err
	case <-timer.C:
		s.forget(id, c)
		return reply{}, status.Errorf(status.Timeout, "cuda: no answer from %s before the deadline", s.name)
	}
}

// forget withdraws a call; a reply that already arrived is disposed of.
func (s *session) forget(id uint64, c *call) {
	s.mu.Lock()
	_, waiting := s.wait[id]
	delete(s.wait, id)
	s.mu.Unlock()
	if waiting {
		return
	}
	select {
	case rep := <-c.ch:
		if rep.err == nil && c.orphan != nil {
			c.orphan(rep)
		}
	default:
		// The reader has taken the call and will deliver into the buffered
		// channel; dispose of it then.
		go func() {
			select {
			case rep := <-c.ch:
				if rep.err == nil && c.orphan != nil {
					c.orphan(rep)
				}
			case <-s.done:
				select {
				case rep := <-c.ch:
					if rep.err == nil && c.orphan != nil {
						c.orphan(rep)
					}
				default:
				}
			}
		}()
	}
}

// importFD asks the target for an fd of allocation alloc; it returns the fd
// (the caller owns it) and the allocation's address and size at the target.
func (s *session) importFD(alloc uint64, deadline time.Time) (fd int, base, size uint64, err error) {
	rep, err := s.call(msgImport, func(enc *wire.Encoder) { enc.U64(alloc) },
		func(r reply) { closeFDs(r.fds) }, deadline)
	if err != nil {
		return -1, 0, 0, err
	}
	d := wire.NewDecoder(rep.payload)
	d.U64()
	d.U32()
	serr := d.Status(s.name)
	base, size = d.U64(), d.U64()
	if err := d.Finish(); err != nil {
		closeFDs(rep.fds)
		return -1, 0, 0, err
	}
	if serr != nil {
		closeFDs(rep.fds)
		return -1, 0, 0, serr
	}
	if len(rep.fds) != 1 {
		closeFDs(rep.fds)
		return -1, 0, 0, status.Errorf(status.Protocol, "cuda: %s answered an import with %d fds", s.name, len(rep.fds))
	}
	return rep.fds[0], base, size, nil
}

// leaseRange is one range the initiator wants to touch.
type leaseRange struct {
	addr, len uint64
	write     bool
}

// grant is the target's answer for one range.
type grant struct {
	err        error // the target's refusal, with its code
	alloc      uint64
	base, size uint64 // the region holding the range
	cuda       bool
	uuid       string
}

// lease asks the target to hold ranges until release; it returns the lease
// id (0 when nothing was granted) and one grant per range.
func (s *session) lease(ranges []leaseRange, deadline time.Time) (uint64, []grant, error) {
	ttl := time.Until(deadline)
	if ttl < 0 {
		ttl = 0
	}
	rep, err := s.call(msgLease, func(enc *wire.Encoder) {
		// The call id the caller wrote is the request's id.
		enc.U64(uint64(ttl))
		enc.U32(uint32(len(ranges)))
		for _, r := range ranges {
			op := core.OpRead
			if r.write {
				op = core.OpWrite
			}
			lease.AppendRange(enc, op, r.addr, r.len)
		}
	}, func(r reply) {
		d := wire.NewDecoder(r.payload)
		d.U64()
		if id := d.U64(); d.Err() == nil && id != 0 {
			s.release(id)
		}
	}, deadline)
	if err != nil {
		return 0, nil, err
	}
	d := wire.NewDecoder(rep.payload)
	d.U64()
	id := d.U64()
	n := d.Count(maxRanges, lease.MinAnswerEntry)
	if d.Err() == nil && n != len(ranges) {
		d.Fail(status.Errorf(status.Protocol, "cuda: %s answered %d of %d lease ranges", s.name, n, len(ranges)))
	}
	grants := make([]grant, 0, len(ranges))
	for i := 0; i < n && d.Err() == nil; i++ {
		var g grant
		if code, msg := lease.DecodeAnswerEntry(&d); code != status.OK {
			g.err = status.Errorf(code, "%s: %s", s.name, msg)
		} else {
			g.alloc, g.base, g.size = d.U64(), d.U64(), d.U64()
			g.cuda = d.U8() == 1
			g.uuid = d.String(maxUUID)
		}
		grants = append(grants, g)
	}
	if err := d.Finish(); err != nil {
		if id != 0 {
			s.release(id)
		}
		s.fail(err)
		return 0, nil, err
	}
	return id, grants, nil
}

// release ends a lease at the target (best effort: a lost release is
// undone by the target when the session ends or the lease expires).
func (s *session) release(id uint64) {
	if id == 0 {
		return
	}
	enc := wire.NewEncoder(nil)
	enc.U64(id)
	_ = s.write(msgRelease, enc.Out(), time.Now().Add(5*time.Second))
}

// trackDial adds (or removes) a connection being set up; it reports false
// when the transport is closed.
func (t *Transport) trackDial(c net.Conn, add bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !add {
		delete(t.dialing, c)
		return true
	}
	if t.closed {
		return false
	}
	t.dialing[c] = struct{}{}
	return true
}
