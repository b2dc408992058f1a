package core_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// A segment being opened when its engine closes fails with CLOSED at once,
// whether it is still connecting or waiting in the handshake for a peer
// that never answers; it does not hold its socket and its caller until
// the engine's timeout, after the engine is gone.
func TestCloseEndsTheDialsInProgress(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	inHandshake := make(chan net.Conn, 1)
	go func() {
		c, err := silent.Accept()
		if err != nil {
			return
		}
		_, _ = io.ReadFull(c, make([]byte, 4)) // the client's hello has begun: it waits for ours
		inHandshake <- c
	}()

	e := newLocalEngine(t, core.Options{DefaultTimeout: time.Hour})
	opened := make(chan error, 1)
	go func() {
		_, err := e.OpenSegment(silent.Addr().String())
		opened <- err
	}()
	c := <-inHandshake
	defer c.Close()
	require.NoError(t, e.Close())
	err = <-opened
	require.Equal(t, status.Closed, status.CodeOf(err), "%v", err)
	// the client's end of the connection is closed too
	_, err = io.ReadAll(c) // the rest of the hello, then EOF
	require.NoError(t, err)

	// and a dial after the close fails the same way
	_, err = e.Dial(silent.Addr().String(), core.KindControl, time.Now().Add(time.Hour))
	require.Equal(t, status.Closed, status.CodeOf(err), "%v", err)
}
