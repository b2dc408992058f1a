package tcp_test

import (
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// The per-peer cap of the engine's listener (which carries the tcp data
// streams too) against a raw client on the same host as a real peer:
// the engine pair transfers with the caps in force, the raw client's
// connections past the cap are closed by the target at once, and once it
// closes them all the target's live count, descriptors and goroutines are
// back where they were; the pair still transfers.
func TestConnectionCapsRefuseAFloodAndSpareARealPeer(t *testing.T) {
	const perPeer = 12 // room for the pair's control and 4 data streams
	opts := core.Options{MaxConnsPerPeer: perPeer, MaxConns: 64}
	a, _ := newEngine(t, opts)
	b, _ := newEngine(t, opts)
	src := alloc(t, a, 1<<20, 0)
	dst := alloc(t, b, 1<<20, rw)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	transfer := func() {
		t.Helper()
		random(src)
		code, _, err := run(t, a, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src),
			Segment: seg, Remote: host.Addr(dst), Len: 1 << 20}}, 10*time.Second)
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, src, dst)
	}
	transfer()

	live := func() int { return b.Stats().Listeners["engine"].Live }
	base := live()
	require.Positive(t, base)
	require.Less(t, base, perPeer)
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	refusedBefore := b.Stats().Listeners["engine"].Refused

	// Fill the cap with authenticated, idle connections.
	var raw []net.Conn
	defer func() {
		for _, c := range raw {
			c.Close()
		}
	}()
	for i := base; i < perPeer; i++ {
		c, err := net.Dial("tcp", b.ListenAddr())
		require.NoError(t, err)
		raw = append(raw, c)
		_, err = wire.ClientHandshake(c, wire.HandshakeConfig{LocalName: "flooder"}, core.KindControl)
		require.NoError(t, err)
	}
	require.Equal(t, perPeer, live())
	// Past it: closed by the target, before any handshake.
	const extra = 5
	for i := 0; i < extra; i++ {
		c, err := net.Dial("tcp", b.ListenAddr())
		require.NoError(t, err)
		raw = append(raw, c)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a bound for a broken target only
		n, err := c.Read(make([]byte, 1))
		require.Zero(t, n)
		require.ErrorIs(t, err, io.EOF, "the connection past the cap is closed")
	}
	require.EqualValues(t, extra, b.Stats().Listeners["engine"].Refused-refusedBefore)

	for _, c := range raw {
		c.Close()
	}
	raw = nil
	require.Eventually(t, func() bool { return live() == base }, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return openFDs(t) <= fds }, 20*time.Second, time.Millisecond)
	// Polled here, not with require.Eventually, whose own goroutine the
	// count would include.
	for limit := time.Now().Add(20 * time.Second); runtime.NumGoroutine() > goroutines; {
		if time.Now().After(limit) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the flood\n%s", runtime.NumGoroutine(), goroutines, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
	transfer()
}
