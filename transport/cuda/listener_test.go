package cuda

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/wire"
)

// The same-host cuda listener runs the engine's accept loop: its counts
// are in the engine's stats while the transport runs, and a connection
// that does not finish its handshake closes at HandshakeTimeout.
func TestListenerClosesIdleConnection(t *testing.T) {
	f, _ := useFake(t)
	e, err := core.New(core.Options{Available: available(), Transports: []string{"cuda"}, HandshakeTimeout: 100 * time.Millisecond, Memory: gpuMemory()})
	require.NoError(t, err)
	defer e.Close()
	ep := cudaOf(e).Endpoints()
	require.Len(t, ep, 1)
	require.Contains(t, e.Stats().Listeners, "cuda")

	c, err := net.Dial("unix", ep[0].Addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound for a broken loop, not the wait
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	s := e.Stats().Listeners["cuda"]
	require.EqualValues(t, 1, s.Accepted)
	require.EqualValues(t, 1, s.HandshakeTimeouts)
	require.Zero(t, s.PeerRejected, "our own uid passes")

	require.NoError(t, e.Uninstall("cuda"))
	require.NotContains(t, e.Stats().Listeners, "cuda")
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// A session that begins a frame and stalls is cut off within the engine's
// timeout, instead of holding the server's goroutine and buffer forever.
func TestServerCutsOffAHalfFrame(t *testing.T) {
	f, _ := useFake(t)
	e, err := core.New(core.Options{Available: available(), Transports: []string{"cuda"},
		DefaultTimeout: 300 * time.Millisecond, Memory: gpuMemory()})
	require.NoError(t, err)
	defer e.Close()
	ep := cudaOf(e).Endpoints()
	require.Len(t, ep, 1)
	c, err := net.Dial("unix", ep[0].Addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = wire.ClientHandshake(c, wire.HandshakeConfig{LocalName: "half-frame"}, KindCUDA)
	require.NoError(t, err)
	typ, _, err := wire.ReadFrame(c, 0, nil)
	require.NoError(t, err)
	require.Equal(t, msgHello, typ)
	_, err = c.Write([]byte{msgImport, 0, 0, 0, 16, 0, 0, 0, 1, 2})
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a bound for a broken server, not the wait
	_, err = io.Copy(io.Discard, c)
	require.NoError(t, err, "the server should have closed the session")
	require.NoError(t, e.Close())
	f.AssertClean(t)
}
