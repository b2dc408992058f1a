package core

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
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
		MaxConnsPerPeer:    e.opts.MaxConnsPerPeer,
		MaxConns:           e.opts.MaxConns,
		SameUser:           sameUser,
	}
}

// ConnHandler serves one accepted, authenticated connection until it fails
// or is closed; the engine closes it on Close.
type ConnHandler func(conn net.Conn, peerName string)

// listener is the engine's network listener: it accepts peers through the
// accept loop, runs the authenticated handshake, and hands each connection
// to the handler of the channel kind it asked for; it also dials peers'
// listeners with the same handshake. It knows the engine only by what the
// handshake needs (secret, name, logger), so the engine keeps one field
// for it.
type listener struct {
	loop   *acceptloop.Loop
	secret []byte
	log    *slog.Logger
	name   atomic.Pointer[string] // the engine's name, set before start

	// closing is done once close began: it ends the dials in progress
	// (connect and handshake), which would otherwise hold their sockets
	// and their callers until the deadline, after the engine is gone.
	closing   context.Context
	stopDials context.CancelFunc

	mu       sync.Mutex
	handlers map[uint8]handlerEntry
	nextH    uint64
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// newListener listens on addr; it accepts nothing before start.
func newListener(addr string, cfg acceptloop.Config, secret []byte) (*listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, status.Errorf(status.TransportError, "listen on %s: %w", addr, err)
	}
	l := &listener{loop: acceptloop.New(ln, cfg), secret: secret, log: cfg.Logger,
		handlers: map[uint8]handlerEntry{}, conns: map[net.Conn]struct{}{}}
	l.closing, l.stopDials = context.WithCancel(context.Background())
	l.setName(l.addr())
	return l, nil
}

// setName is the name the handshake gives peers, and log is where handshake
// failures go; both are the engine's once it knows its name.
func (l *listener) setName(name string)        { l.name.Store(&name) }
func (l *listener) localName() string          { return *l.name.Load() }
func (l *listener) setLogger(log *slog.Logger) { l.log = log }
func (l *listener) addr() string               { return l.loop.Addr().String() }
func (l *listener) stats() acceptloop.Stats    { return l.loop.Stats() }

// handlerEntry is a registered handler; id tells registrations of one kind
// apart, so only its owner can remove it.
type handlerEntry struct {
	id uint64
	h  ConnHandler
}

// handle makes h serve kind and returns the function that removes exactly
// this registration (a later registration of the same kind stays).
func (l *listener) handle(kind uint8, h ConnHandler) (remove func()) {
	l.mu.Lock()
	l.nextH++
	id := l.nextH
	l.handlers[kind] = handlerEntry{id: id, h: h}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		if l.handlers[kind].id == id {
			delete(l.handlers, kind)
		}
		l.mu.Unlock()
	}
}

func (l *listener) start() {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.loop.Serve(l.admit)
	}()
}

// admit starts serving an accepted connection (on the loop's goroutine).
func (l *listener) admit(c net.Conn, p *acceptloop.Pending) {
	if !l.track(c) {
		p.Done(false)
		c.Close()
		p.Release()
		return
	}
	l.wg.Add(1)
	go l.serve(c, p)
}

func (l *listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *listener) serve(c net.Conn, p *acceptloop.Pending) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
		p.Release()
	}()
	kind, peer, err := wire.ServerHandshake(c, wire.HandshakeConfig{
		Secret: l.secret, Deadline: p.Deadline(), LocalName: l.localName(),
	})
	p.Done(err == nil)
	if err != nil {
		// Info, not Debug: a peer with the wrong secret is a setup problem
		// someone is looking for; per connection, never per request.
		l.log.Info("handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	l.mu.Lock()
	h := l.handlers[kind].h
	l.mu.Unlock()
	if h == nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = safeCall("connection handler", func() error { h(c, peer); return nil })
}

// close stops accepting, closes every connection, and waits for handlers.
func (l *listener) close() {
	l.stopDials()
	l.mu.Lock()
	l.closed = true
	conns := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	l.loop.Close()
	for _, c := range conns {
		c.Close()
	}
	l.wg.Wait()
}

func (l *listener) connCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// dial connects to a peer's listener and runs the client handshake for
// kind by deadline, giving up with ErrCanceled as soon as ctx is done and
// with ErrClosed as soon as the listener closes.
func (l *listener) dial(ctx context.Context, addr string, kind uint8, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if l.closing.Err() != nil {
			return nil, status.Errorf(status.Closed, "connect to %s: the engine closed", addr)
		}
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
		Secret: l.secret, Deadline: deadline, LocalName: l.localName(),
	}, kind)
	if !stop() {
		c.Close()
		if l.closing.Err() != nil {
			return nil, status.Errorf(status.Closed, "handshake with %s: the engine closed", addr)
		}
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
	return e.ln.handle(kind, h), nil
}

// ListenAddr is the engine listener's address ("host:port").
func (e *Engine) ListenAddr() string { return e.ln.addr() }

// Dial connects to a peer's listener and runs the client handshake for
// kind, with the engine's secret, by deadline.
func (e *Engine) Dial(addr string, kind uint8, deadline time.Time) (net.Conn, error) {
	return e.DialContext(context.Background(), addr, kind, deadline)
}

// DialContext is Dial that also gives up, with ErrCanceled, as soon as ctx
// is done: a transport being uninstalled cancels the dials it has in
// progress instead of waiting for their deadlines.
func (e *Engine) DialContext(ctx context.Context, addr string, kind uint8, deadline time.Time) (net.Conn, error) {
	return e.ln.dial(ctx, addr, kind, deadline)
}
