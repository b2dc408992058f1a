package tcp_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// engineListener returns the peer's engine-listener counts.
func engineListener(t *testing.T, p *peertest.Peer) core.ListenerStats {
	t.Helper()
	ls, err := p.Listeners()
	require.NoError(t, err)
	s, ok := ls["engine"]
	require.True(t, ok, "no engine listener in %v", ls)
	return s
}

// dialIdle opens n TCP connections to addr that never send a byte.
func dialIdle(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

// writeAndCheck writes a random buffer to the peer's buffer 0 over seg and
// checks it arrived.
func writeAndCheck(t *testing.T, e *core.Engine, seg *core.Segment, p *peertest.Peer, size int) {
	t.Helper()
	src := register(t, e, size, 0)
	random(src)
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: p.Buffers[0].Addr, Len: uint64(size)}}, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, status.OK, code)
	require.Equal(t, peertest.Sum(src), peerSum(t, p, 0))
}

// A target out of descriptors keeps its listener: accept fails with
// EMFILE while 400 idle connections hold more descriptors than its limit
// of 256 allows, and once they close a client opens the segment and
// transfers as if nothing happened.
func TestListenerSurvivesDescriptorExhaustion(t *testing.T) {
	const size = 64 << 10
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		NoFileLimit: 256, MaxUnauthenticated: 4096, // the fd limit, not the bound, is what runs out
		Buffers: []peertest.Buffer{{Size: size, Perm: rw}}})
	idle := dialIdle(t, peer.Name, 400)
	require.Eventually(t, func() bool { return engineListener(t, peer).AcceptErrors > 0 },
		30*time.Second, 10*time.Millisecond, "the target never ran out of descriptors")
	s := engineListener(t, peer)
	require.Contains(t, s.LastAcceptError, "too many open files")
	for _, c := range idle {
		c.Close()
	}

	e, _ := newEngine(t, core.Options{})
	seg := openSegment(t, e, peer.Name)
	writeAndCheck(t, e, seg, peer, size)
	s = engineListener(t, peer)
	require.GreaterOrEqual(t, s.Accepted, uint64(401), "every idle connection was accepted in the end, then the client")
	require.GreaterOrEqual(t, s.Authenticated, uint64(1))
	t.Logf("listener after recovery: %+v", s)
}

// More idle connections than MaxUnauthenticated cannot keep a client out:
// each new connection past the bound closes the oldest unauthenticated
// one, and a client finishes its handshake long before it is the oldest.
func TestIdleConnectionsDoNotStarveAClient(t *testing.T) {
	const size = 64 << 10
	const max = 8
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"}, MaxUnauthenticated: max,
		Buffers: []peertest.Buffer{{Size: size, Perm: rw}}})
	idle := dialIdle(t, peer.Name, 3*max)
	require.Eventually(t, func() bool {
		s := engineListener(t, peer)
		return s.Accepted == 3*max && s.Evicted == 2*max && s.Unauthenticated == max
	}, 30*time.Second, 10*time.Millisecond)

	// The bound is full of idle connections, all still open on our side.
	e, _ := newEngine(t, core.Options{})
	seg := openSegment(t, e, peer.Name)
	writeAndCheck(t, e, seg, peer, size)

	s := engineListener(t, peer)
	require.GreaterOrEqual(t, s.Evicted, uint64(2*max+1), "the client's connections made room")
	require.LessOrEqual(t, s.Unauthenticated, max)
	require.Zero(t, s.HandshakeTimeouts)
	closed := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	require.GreaterOrEqual(t, closed, 2*max, "evicted connections are closed")
}

// A connection that does not finish its handshake in time is closed; one
// that did is not, however long it lives afterwards.
func TestIdleConnectionClosedAtHandshakeTimeout(t *testing.T) {
	const size = 64 << 10
	const timeout = 300 * time.Millisecond
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"}, HandshakeTimeout: timeout,
		Buffers: []peertest.Buffer{{Size: size, Perm: rw}}})
	idle := dialIdle(t, peer.Name, 1)[0]
	e, _ := newEngine(t, core.Options{})
	seg := openSegment(t, e, peer.Name)
	writeAndCheck(t, e, seg, peer, size)

	start := time.Now()
	_ = idle.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound for a broken target, not the wait
	_, err := idle.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the target closed the idle connection")
	s := engineListener(t, peer)
	require.EqualValues(t, 1, s.HandshakeTimeouts)
	require.Zero(t, s.Unauthenticated)
	t.Logf("idle connection closed %v after the first transfer", time.Since(start))

	// The engine's connections, authenticated before the idle one's
	// deadline, outlive it.
	before := s.Accepted
	writeAndCheck(t, e, seg, peer, size)
	require.Equal(t, before, engineListener(t, peer).Accepted, "the second transfer reused the connections")
}
