package tcp_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// Connections that carried nothing for the idle timeout are closed, the
// reaper leaves with the last of them, and the next request dials again.
func TestIdleConnectionsClosed(t *testing.T) {
	defer tcp.SetIdleTimeout(50 * time.Millisecond)()
	peer := startPeer(t, 4<<20)
	fds, goroutines := fdCount(t), runtime.NumGoroutine()
	e, tr := newEngine(t, core.Options{})
	local := register(t, e, 4<<20, 0)
	seg := openSegment(t, e, peer.Name)
	moveAll := func() {
		t.Helper()
		code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
			Remote: peer.Buffers[0].Addr, Len: 4 << 20}}, 10*time.Second)
		require.Equal(t, status.OK, code, "%v", err)
	}
	moveAll()
	// Counted, not looked for: at 50 ms they may be reaped already.
	require.Positive(t, tr.Stats()["dials"], "the transfer opened connections")
	require.Eventually(t, func() bool {
		st := tr.Stats()
		return st["connections"] == 0 && st["goroutines"] == 0
	}, 5*time.Second, time.Millisecond)
	require.Positive(t, tr.Stats()["idle_closed"])
	dials := tr.Stats()["dials"]
	moveAll()
	require.Greater(t, tr.Stats()["dials"], dials, "dialed again")
	require.NoError(t, e.Close())
	requireIdle(t, tr)
	requireBaseline(t, fds, goroutines)
}

// With connections reaped whenever they are momentarily empty, batches
// from two goroutines keep succeeding: a chunk either reaches a live
// connection or a new one, never a connection closed for idleness.
func TestIdleReapUnderLoad(t *testing.T) {
	defer tcp.SetIdleTimeout(time.Nanosecond)()
	peer := startPeer(t, 32<<20)
	e, tr := newEngine(t, core.Options{})
	local := register(t, e, 32<<20, 0)
	seg := openSegment(t, e, peer.Name)
	stop := make(chan struct{})
	wait := load(t, e, seg, host.Addr(local), peer.Buffers[0].Addr, stop) // only OK is accepted
	require.Eventually(t, func() bool { return tr.Stats()["idle_closed"] >= 20 }, 20*time.Second, time.Millisecond)
	close(stop)
	require.Positive(t, wait())
	require.NoError(t, e.Close())
	requireIdle(t, tr)
}
