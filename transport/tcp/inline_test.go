package tcp_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// gatedConn is a data connection whose writes, once armed, stop until the
// connection is closed: a socket whose peer stopped reading, at the
// moment of a write.
type gatedConn struct {
	net.Conn
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when an armed write starts
	closed  chan struct{}
	once    sync.Once
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	armed := g.armed
	if armed {
		g.armed = false
		close(g.entered)
	}
	g.mu.Unlock()
	if armed {
		<-g.closed
		return 0, net.ErrClosed
	}
	return g.Conn.Write(p)
}

func (g *gatedConn) Close() error {
	g.once.Do(func() { close(g.closed) })
	return g.Conn.Close()
}

// A small request on an idle stream is written by the submitting
// goroutine itself (no hand-off to the writer): Submit is still inside the
// write when the socket stops. Closing the transport then must fail the
// request once, give its memory back and leave nothing running.
func TestInlineWriteRacingClose(t *testing.T) {
	peer := startPeer(t, 1<<20)
	e, tr := newEngine(t, core.Options{})
	conns := make(chan *gatedConn, 8)
	tr.WrapConns(func(nc net.Conn) net.Conn {
		g := &gatedConn{Conn: nc, entered: make(chan struct{}), closed: make(chan struct{})}
		conns <- g
		return g
	})
	local := register(t, e, 4096, 0)
	seg := openSegment(t, e, peer.Name)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[0].Addr, Len: 4096}}

	// The first request dials (through the writer); the stream is then up and idle.
	code, _, err := run(t, e, req, 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Len(t, conns, 1)
	g := <-conns
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()

	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		submitted <- b
	}()
	<-g.entered
	select {
	case <-submitted:
		t.Fatal("Submit returned before its write finished: the write was handed off, not inline")
	default:
	}
	require.NoError(t, tr.Uninstall())
	b := <-submitted
	require.NotNil(t, b)
	code, err = b.Wait(-1)
	require.NotEqual(t, status.OK, code, "%v", err)
	require.Contains(t, []status.Code{status.Closed, status.TransportError}, code, "%v", err)
	<-b.Settled()
	e.ReleaseBatch(b)
	requireIdle(t, tr)
	st := e.Stats()
	require.Zero(t, st.DuplicateCompletions)
	require.Zero(t, st.RequestsInFlight)
	require.Zero(t, st.Batches)
}
