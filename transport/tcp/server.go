package tcp

import (
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	tmem "github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

const (
	// flushBytes and flushPieces bound the replies (and the regions held
	// for them) collected before they are written.
	flushBytes  = 2 << 20
	flushPieces = 512
)

// serve is the engine's handler for KindData connections: it runs the
// target side of one stream until the peer leaves, breaks the protocol,
// stalls, or the transport is uninstalled.
func (t *Transport) serve(nc net.Conn, _ string) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.srvConns[nc] = struct{}{}
	t.srvWG.Add(1)
	e := t.e
	t.mu.Unlock()
	t.handlers.Add(1)
	defer func() {
		t.mu.Lock()
		delete(t.srvConns, nc)
		t.mu.Unlock()
		nc.Close()
		t.handlers.Add(-1)
		t.srvWG.Done()
	}()
	buf, free, err := t.recvBuffer()
	if err != nil {
		return
	}
	defer free()
	s := &server{t: t, e: e, nc: nc, stall: e.Options().DefaultTimeout}
	s.rd = newBufReader(serverSource{s}, reqHeaderSize, buf)
	s.rd.guarded = true // run is guarded: one guard for the connection, not one per copy
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.rd.setRaw(raw)
		}
		s.rd.count = &t.received
	}
	t.log.Debug("tcp connection accepted", "from", nc.RemoteAddr().String())
	// A fault on registered memory (unmapped by its owner without being
	// unregistered) ends the connection, not the process.
	err = host.Guard(s.run)
	var fault *host.Fault
	if errors.As(err, &fault) {
		// The guard covers the whole handler, not only its copies: a fault
		// here is registered memory unmapped by its owner, or a bug.
		t.log.Error("tcp connection ended by a memory fault", "from", nc.RemoteAddr().String(), "err", err)
	} else if err != nil && status.CodeOf(err) == status.Protocol {
		t.protoErrs.Add(1)
		t.log.Warn("tcp peer broke the protocol; connection closed", "from", nc.RemoteAddr().String(), "err", err)
	} else {
		t.log.Debug("tcp connection ended", "from", nc.RemoteAddr().String(), "reason", err)
	}
}

// server is the target side of one stream. Requests are served in order,
// one at a time; replies are collected and written together when the
// next request is not in yet (or enough has piled up).
type server struct {
	t     *Transport
	e     *core.Engine
	nc    net.Conn
	rd    *bufReader
	stall time.Duration // how long a peer may stall inside a request or a reply

	iov     iovec
	held    []*core.Region // acquired for the requests whose replies are in iov
	cur     *core.Region   // the last of held: the next request is likely in it too
	replies int            // replies in iov
	stage   []byte         // host buffer for GPU regions (mmap), grown on demand
}

type serverSource struct{ s *server }

func (src serverSource) Read(p []byte) (int, error) {
	n, err := src.s.nc.Read(p)
	src.s.t.received.Add(int64(n))
	return n, err
}

func (s *server) run() error {
	defer s.releaseHeld()
	defer s.freeStage()
	var hello [helloSize]byte
	putHello(hello[:], s.e.Incarnation())
	_ = s.nc.SetWriteDeadline(time.Now().Add(s.stall))
	if _, err := s.nc.Write(hello[:]); err != nil {
		return err
	}
	s.t.sent.Add(helloSize)
	for {
		// Replies wait while requests keep coming; before waiting for
		// more, they go out.
		if s.rd.buffered() < reqHeaderSize && !s.iov.empty() {
			got, err := s.rd.tryFill()
			if err != nil {
				return err
			}
			if !got {
				if err := s.flush(); err != nil {
					return err
				}
			}
		}
		b, err := s.rd.next(reqHeaderSize) // idle connections wait without a deadline
		if err != nil {
			return err
		}
		h, err := parseReqHeader(b)
		if err != nil {
			return err
		}
		switch h.op {
		case opWrite:
			s.rd.expect(int(h.n))
			if err := s.write(h); err != nil {
				return err
			}
		case opRead:
			s.rd.expect(0)
			if err := s.read(h); err != nil {
				return err
			}
		}
		if s.iov.bytes >= flushBytes || len(s.iov.pays) >= flushPieces || s.replies >= flushPieces {
			if err := s.flush(); err != nil {
				return err
			}
		}
	}
}

// write serves a WRITE: the payload goes straight into the registered
// memory (through the staging buffer for GPU memory), or, when the target
// refuses, into scratch.
func (s *server) write(h reqHeader) error {
	n := int(h.n)
	region, held, aerr := s.acquire(h, core.AccessRemoteWrite)
	if s.rd.buffered() < n {
		_ = s.nc.SetReadDeadline(time.Now().Add(s.stall))
		defer s.nc.SetReadDeadline(time.Time{})
	}
	var stage []byte
	var kind tmem.Kind
	if aerr == nil && region.Loc.IsCUDA() {
		if stage, kind, aerr = s.stageBuf(region.Loc, n); aerr != nil {
			s.e.Release(region)
		}
	}
	if aerr != nil {
		s.t.rejected.Add(1)
		if err := s.rd.discard(n); err != nil {
			return err
		}
		s.reply(h, aerr, nil, 0)
		return nil
	}
	if stage == nil {
		err := s.rd.readInto(host.Bytes(h.addr, uint64(h.n)))
		if !held {
			s.e.Release(region)
		}
		if err != nil {
			return err
		}
		s.reply(h, nil, nil, 0)
		return nil
	}
	if err := s.rd.readInto(stage); err != nil {
		s.e.Release(region)
		return err
	}
	err := kind.CopyIn(h.addr, stage)
	s.e.Release(region)
	if err != nil {
		s.t.rejected.Add(1)
		s.reply(h, err, nil, 0)
		return nil
	}
	s.t.staged.Add(int64(n))
	s.reply(h, nil, nil, replyStaged)
	return nil
}

// read serves a READ: the payload will be written from the registered
// memory, which stays acquired until then. GPU memory is copied into the
// staging buffer and sent at once (with what was collected before it), so
// the buffer is free for the next.
func (s *server) read(h reqHeader) error {
	region, held, aerr := s.acquire(h, core.AccessRemoteRead)
	if aerr != nil {
		s.t.rejected.Add(1)
		s.reply(h, aerr, nil, 0)
		return nil
	}
	if held {
		s.reply(h, nil, host.Bytes(h.addr, uint64(h.n)), 0)
		return nil
	}
	stage, kind, err := s.stageBuf(region.Loc, int(h.n))
	if err == nil {
		err = kind.CopyOut(stage, h.addr)
	}
	s.e.Release(region)
	if err != nil {
		s.t.rejected.Add(1)
		s.reply(h, err, nil, 0)
		return nil
	}
	s.t.staged.Add(int64(h.n))
	s.reply(h, nil, stage, replyStaged)
	return s.flush()
}

// acquire checks a request against the engine's registrations and pins
// its region. A host region stays pinned (held) until the stream's replies
// are written, and the next requests that lie inside it with the access
// it grants take no further Acquire: the engine's lock, its index and an
// atomic after each copy (which waits for the copy's stores) per request
// are then one per run. Unregistering the region waits for that write, as
// it waits for a READ payload in it. GPU regions are pinned per request
// (held is false): the caller releases them.
func (s *server) acquire(h reqHeader, access core.Access) (r *core.Region, held bool, err error) {
	if r := s.cur; r != nil && r.Contains(h.addr, uint64(h.n)) && r.Permits(access) {
		return r, true, nil
	}
	r, err = s.e.Acquire(h.addr, uint64(h.n), access)
	if err != nil || r.Loc.IsCUDA() {
		return r, false, err
	}
	s.held = append(s.held, r)
	s.cur = r
	return r, true, nil
}

// stageBuf returns the connection's staging buffer, at least n bytes,
// and the engine's memory kind to copy with, for a request on GPU memory
// at loc.
func (s *server) stageBuf(loc core.Location, n int) ([]byte, tmem.Kind, error) {
	kind := s.e.Memory().Kind(loc.Kind)
	if kind == nil {
		return nil, nil, status.Errorf(status.Unsupported, "tcp: the target has no CUDA driver to stage GPU memory with")
	}
	if len(s.stage) < n {
		s.freeStage()
		b, err := unix.Mmap(-1, 0, max(n, chunkSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, nil, status.Errorf(status.NoMemory, "tcp: staging buffer of %d bytes: %v", n, err)
		}
		s.stage = b
		s.t.stageBufs.Add(1)
	}
	return s.stage[:n], kind, nil
}

func (s *server) freeStage() {
	if s.stage != nil {
		_ = unix.Munmap(s.stage)
		s.stage = nil
		s.t.stageBufs.Add(-1)
	}
}

func (s *server) reply(h reqHeader, err error, payload []byte, flags uint8) {
	var msg string
	if err != nil {
		msg = err.Error()
		if len(msg) > maxMessage {
			msg = msg[:maxMessage]
		}
		flags = 0
	}
	s.replies++
	b := s.iov.header(replyHeaderSize + len(msg))
	putReplyHeader(b, replyHeader{op: h.op, flags: flags, msgLen: uint16(len(msg)), code: status.CodeOf(err), id: h.id, n: uint32(len(payload))})
	copy(b[replyHeaderSize:], msg)
	if payload != nil {
		s.iov.payload(payload)
	}
}

func (s *server) flush() error {
	_ = s.nc.SetWriteDeadline(time.Now().Add(s.stall))
	n, err := s.iov.writeTo(s.nc)
	s.t.sent.Add(n)
	s.iov.reset()
	s.replies = 0
	s.releaseHeld()
	return err
}

func (s *server) releaseHeld() {
	s.cur = nil
	for i, r := range s.held {
		s.e.Release(r)
		s.held[i] = nil
	}
	s.held = s.held[:0]
}
