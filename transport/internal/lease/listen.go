package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Listener is a same-host transport's endpoint: a Unix stream socket in
// the abstract namespace, "@tent-<name>-<pid>-<16 hex digits>", served by
// the engine's accept loop with the peer-credential check on. Abstract
// sockets have no file permissions, so the kernel's word on who connected
// (SO_PEERCRED) is what keeps other users out: only a peer running as
// this process's uid, or as root, reaches the handshake.
type Listener struct {
	loop *acceptloop.Loop
	addr string
	kind uint8
	e    *core.Engine
}

// Listen opens the endpoint of transport name for e; kind is the channel
// kind its handshake must ask for.
func Listen(e *core.Engine, name string, kind uint8) (*Listener, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	addr := fmt.Sprintf("@tent-%s-%d-%s", name, os.Getpid(), hex.EncodeToString(rnd[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, status.Errorf(status.TransportError, "%s: listen on %s: %w", name, addr, err)
	}
	return &Listener{loop: acceptloop.New(ln, e.ListenerConfig(name, true)), addr: addr, kind: kind, e: e}, nil
}

// Addr is the endpoint's address, as published in the descriptor.
func (l *Listener) Addr() string { return l.addr }

// Stats are the accept loop's counts.
func (l *Listener) Stats() acceptloop.Stats { return l.loop.Stats() }

// Serve accepts until Close. admit runs on the loop's goroutine for each
// connection of an admitted peer: it must start a goroutine of its own
// (which calls Handshake) and return, or close c and call p.Done(false);
// either way p.Release once c is closed, so c stops counting against the
// per-peer and global connection caps.
func (l *Listener) Serve(admit func(c *net.UnixConn, p *acceptloop.Pending)) {
	l.loop.Serve(func(c net.Conn, p *acceptloop.Pending) { admit(c.(*net.UnixConn), p) })
}

// Close stops accepting and closes the connections still in their
// handshake.
func (l *Listener) Close() error { return l.loop.Close() }

// Handshake runs the server side of the engine's handshake on c by the
// accept loop's deadline and ends its pending phase. It fails unless the
// peer has the engine's secret and asks for the listener's channel kind.
// peer is the kernel's record of who connected.
func (l *Listener) Handshake(c *net.UnixConn, p *acceptloop.Pending) (peer acceptloop.Cred, err error) {
	kind, _, err := wire.ServerHandshake(c, wire.HandshakeConfig{
		Secret: l.e.Options().Secret, Deadline: p.Deadline(), LocalName: l.e.Name(),
	})
	if err == nil && kind != l.kind {
		err = status.Errorf(status.Protocol, "lease: peer asked for channel kind %d on a kind %d endpoint", kind, l.kind)
	}
	p.Done(err == nil)
	if err != nil {
		return acceptloop.Cred{}, err
	}
	peer, ok := p.Peer()
	if !ok { // the loop always checks: Listen turns SameUser on
		return acceptloop.Cred{}, status.Errorf(status.Internal, "lease: no peer credentials")
	}
	return peer, nil
}
