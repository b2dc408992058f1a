package cuda

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/wire"
)

// The cuda listener's per-peer cap (a peer is a process here): sessions
// up to it are served, the connections past it are closed by the server
// before any handshake, and once the client closes them all the live
// count and the server's connections are back to zero.
func TestPerPeerCapRefusesPastItAndCountsBack(t *testing.T) {
	const perPeer = 3
	f, _ := useFake(t)
	e, err := core.New(core.Options{Available: available(), Transports: []string{"cuda"},
		MaxConnsPerPeer: perPeer, Memory: gpuMemory()})
	require.NoError(t, err)
	defer e.Close()
	ep := cudaOf(e).Endpoints()
	require.Len(t, ep, 1)
	stats := func() core.ListenerStats { return e.Stats().Listeners["cuda"] }
	serverConns := func() int {
		tr := cudaOf(e)
		tr.mu.Lock()
		srv := tr.srv
		tr.mu.Unlock()
		return srv.connCount()
	}

	dial := func() (net.Conn, error) {
		c, err := net.Dial("unix", ep[0].Addr)
		require.NoError(t, err)
		if _, err := wire.ClientHandshake(c, wire.HandshakeConfig{LocalName: "flooder"}, KindCUDA); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < perPeer; i++ {
		c, err := dial()
		require.NoError(t, err)
		held = append(held, c)
		typ, _, err := wire.ReadFrame(c, 0, nil)
		require.NoError(t, err)
		require.Equal(t, msgHello, typ)
	}
	require.Equal(t, perPeer, stats().Live)
	const extra = 3
	for i := 0; i < extra; i++ {
		_, err := dial()
		require.Error(t, err, "the server closes a connection past the cap")
	}
	require.EqualValues(t, extra, stats().Refused)
	require.EqualValues(t, perPeer, serverConns(), "no server state for a refused connection")

	for _, c := range held {
		c.Close()
	}
	held = nil
	require.Eventually(t, func() bool { return stats().Live == 0 && serverConns() == 0 },
		20*time.Second, time.Millisecond)
	require.NoError(t, e.Close())
	f.AssertClean(t)
}
