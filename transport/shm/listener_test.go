//go:build linux

package shm

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
)

// The shm listener runs the engine's accept loop: its counts are in the
// engine's stats while it is installed, and a connection that does not
// finish its handshake closes at the engine's HandshakeTimeout.
func TestListenerClosesIdleConnection(t *testing.T) {
	e, tr := newEngine(t, core.Options{HandshakeTimeout: 100 * time.Millisecond})
	require.Contains(t, e.Stats().Listeners, "shm")

	c, err := net.Dial("unix", tr.addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound for a broken loop, not the wait
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	s := e.Stats().Listeners["shm"]
	require.EqualValues(t, 1, s.Accepted)
	require.EqualValues(t, 1, s.HandshakeTimeouts)
	require.Zero(t, s.Unauthenticated)

	require.NoError(t, e.Uninstall("shm"))
	require.NotContains(t, e.Stats().Listeners, "shm")
	require.Contains(t, e.Stats().Listeners, "engine")
}

// A connection that begins a frame and stalls is cut off within the
// engine's timeout, instead of holding the server's goroutine and buffer
// forever.
func TestServerCutsOffAHalfFrame(t *testing.T) {
	_, tr := newEngine(t, core.Options{DefaultTimeout: 300 * time.Millisecond})
	rc, err := dialRaw(t, tr.addr, nil)
	require.NoError(t, err)
	_, err = rc.c.Write([]byte{frameLease, 0, 0, 0, 0, 0, 1, 0, 1, 2, 3})
	require.NoError(t, err)
	_ = rc.c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a bound for a broken server, not the wait
	_, err = io.Copy(io.Discard, rc.c)
	require.NoError(t, err, "the server should have closed the connection")
}
