package core

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// ListenerStats are the counts of one listener's accept loop.
type ListenerStats = acceptloop.Stats

// ListenerReporter is implemented by transports that may run a listener
// of their own; Engine.Stats reports it under the transport's name while
// ok says one is running.
type ListenerReporter interface {
	ListenerStats() (s ListenerStats, ok bool)
}

// ListenerConfig is the accept-loop configuration for a listener of this
// engine named name: the engine's limits on unauthenticated connections.
// sameUser admits only Unix-socket peers of this process's user (or
// root), for listeners that hand out same-host capabilities.
func (e *Engine) ListenerConfig(name string, sameUser bool) acceptloop.Config {
	return acceptloop.Config{
		Name:               name,
		Logger:             e.log,
		MaxUnauthenticated: e.opts.MaxUnauthenticated,
		HandshakeTimeout:   e.opts.HandshakeTimeout,
		SameUser:           sameUser,
	}
}

// ConnHandler serves one accepted, authenticated connection until it fails
// or is closed; the engine closes it on Close.
type ConnHandler func(conn net.Conn, peerName string)

// server is the engine's listener: it accepts peers, runs the handshake,
// and hands each connection to the handler of the kind it asked for.
type server struct {
	e        *Engine
	loop     *acceptloop.Loop
	mu       sync.Mutex
	handlers map[uint8]handlerEntry
	nextH    uint64
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

func newServer(e *Engine, addr string) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, status.Errorf(status.TransportError, "listen on %s: %w", addr, err)
	}
	loop := acceptloop.New(ln, e.ListenerConfig("engine", false))
	return &server{e: e, loop: loop, handlers: map[uint8]handlerEntry{}, conns: map[net.Conn]struct{}{}}, nil
}

func (s *server) addr() string { return s.loop.Addr().String() }

// handlerEntry is a registered handler; id tells registrations of one kind
// apart, so only its owner can remove it.
type handlerEntry struct {
	id uint64
	h  ConnHandler
}

// handle makes h serve kind and returns the function that removes exactly
// this registration (a later registration of the same kind stays).
func (s *server) handle(kind uint8, h ConnHandler) (remove func()) {
	s.mu.Lock()
	s.nextH++
	id := s.nextH
	s.handlers[kind] = handlerEntry{id: id, h: h}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.handlers[kind].id == id {
			delete(s.handlers, kind)
		}
		s.mu.Unlock()
	}
}

func (s *server) start() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.loop.Serve(s.admit)
	}()
}

// admit starts serving an accepted connection (on the loop's goroutine).
func (s *server) admit(c net.Conn, p *acceptloop.Pending) {
	if !s.track(c) {
		p.Done(false)
		c.Close()
		return
	}
	s.wg.Add(1)
	go s.serve(c, p)
}

func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) serve(c net.Conn, p *acceptloop.Pending) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	kind, peer, err := wire.ServerHandshake(c, wire.HandshakeConfig{
		Secret: s.e.opts.Secret, Deadline: p.Deadline(), LocalName: s.e.Name(),
	})
	p.Done(err == nil)
	if err != nil {
		// Info, not Debug: a peer with the wrong secret is a setup problem
		// someone is looking for; per connection, never per request.
		s.e.log.Info("handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	s.mu.Lock()
	h := s.handlers[kind].h
	s.mu.Unlock()
	if h == nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = safeCall("connection handler", func() error { h(c, peer); return nil })
}

// close stops accepting, closes every connection, and waits for handlers.
func (s *server) close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.loop.Close()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
}

func (s *server) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// HandleConn makes the engine's listener pass connections of kind to h.
// Transports call it from Install and call the returned remove from
// Uninstall; remove leaves alone a handler registered for the kind since.
// The kind must be one a spec in Options.Available declares: a transport
// cannot take core's kind or one no spec reserved.
func (e *Engine) HandleConn(kind uint8, h ConnHandler) (remove func(), err error) {
	if _, ok := e.available.byKind[kind]; !ok {
		return nil, status.Errorf(status.InvalidArgument,
			"channel kind %d is declared by no available transport's spec", kind)
	}
	return e.srv.handle(kind, h), nil
}

// ListenAddr is the engine listener's address ("host:port").
func (e *Engine) ListenAddr() string { return e.srv.addr() }

// Dial connects to a peer's listener and runs the client handshake for
// kind, with the engine's secret, by deadline.
func (e *Engine) Dial(addr string, kind uint8, deadline time.Time) (net.Conn, error) {
	return e.DialContext(context.Background(), addr, kind, deadline)
}

// DialContext is Dial that also gives up, with ErrCanceled, as soon as ctx
// is done: a transport being uninstalled cancels the dials it has in
// progress instead of waiting for their deadlines.
func (e *Engine) DialContext(ctx context.Context, addr string, kind uint8, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.Errorf(status.Canceled, "connect to %s: %w", addr, ctx.Err())
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil, status.Errorf(status.Timeout, "connect to %s: %w", addr, err)
		}
		return nil, status.Errorf(status.TransportError, "connect to %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() }) // interrupts the handshake
	_, err = wire.ClientHandshake(c, wire.HandshakeConfig{
		Secret: e.opts.Secret, Deadline: deadline, LocalName: e.Name(),
	}, kind)
	if !stop() {
		c.Close()
		return nil, status.Errorf(status.Canceled, "handshake with %s: %w", addr, ctx.Err())
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return c, nil
}
