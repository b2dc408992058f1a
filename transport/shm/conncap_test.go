//go:build linux

package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
)

// The shm listener's per-peer cap (a peer is a process here): a raw
// client fills it with handshaken sessions, the connections past it are
// closed by the server before any handshake, and once the client closes
// them all the live count, the server connections and their goroutines
// are back to zero, so a new session is admitted again.
func TestPerPeerCapRefusesPastItAndCountsBack(t *testing.T) {
	const perPeer = 4
	e, tr := newEngine(t, core.Options{MaxConnsPerPeer: perPeer})
	stats := func() core.ListenerStats { return e.Stats().Listeners["shm"] }
	servers := func() int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.servers)
	}
	goroutines := tr.goroutines.Load()

	var held []*rawClient
	for i := 0; i < perPeer; i++ {
		rc, err := dialRaw(t, tr.addr, nil)
		require.NoError(t, err)
		held = append(held, rc)
	}
	require.Equal(t, perPeer, stats().Live)
	const extra = 3
	for i := 0; i < extra; i++ {
		_, err := dialRaw(t, tr.addr, nil)
		require.Error(t, err, "the server closes a connection past the cap")
	}
	require.EqualValues(t, extra, stats().Refused)
	require.Equal(t, perPeer, servers(), "no server state for a refused connection")

	for _, rc := range held {
		rc.fr.CloseAll()
		rc.c.Close()
	}
	require.Eventually(t, func() bool { return stats().Live == 0 }, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return servers() == 0 && tr.goroutines.Load() == goroutines },
		20*time.Second, time.Millisecond)

	_, err := dialRaw(t, tr.addr, nil)
	require.NoError(t, err, "admitted again once the peer's count dropped")
	require.Equal(t, 1, stats().Live)
}
