package core_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/wire"
)

// waitClosed reads c until the engine closes it; bound is only a limit for
// a broken engine, not the wait.
func waitClosed(t *testing.T, c net.Conn, bound time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(bound))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, syscall.ECONNRESET) {
		return // closed with our bytes unread: the kernel answers with a reset
	}
	require.NoError(t, err, "the engine should have closed the connection by now")
}

// The engine's listener against peers that flood it: slowloris handshakes
// dripping a byte at a time, and after a real handshake a frame longer
// than the limit and a half-frame that never finishes. Each is cut off
// within its bound while a real peer still opens a segment, and the
// listener's unauthenticated count never passes its limit.
func TestEngineListenerFloods(t *testing.T) {
	const maxUnauth = 4
	target, err := core.New(core.Options{Transports: []string{}, MaxUnauthenticated: maxUnauth,
		HandshakeTimeout: 300 * time.Millisecond, DefaultTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	defer target.Close()
	addr := target.ListenAddr()

	// Slowloris: 3x the bound of connections, each dripping its hello.
	stop := make(chan struct{})
	dripped := make(chan struct{}, 3*maxUnauth)
	var drips []net.Conn
	for i := 0; i < 3*maxUnauth; i++ {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		drips = append(drips, c)
		go func(c net.Conn) {
			defer func() { dripped <- struct{}{} }()
			for _, b := range []byte(wire.HandshakeMagic + "\x01\x00\x01\x00") {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
			}
		}(c)
	}
	// A real peer gets in meanwhile.
	peer, err := core.New(core.Options{Transports: []string{}})
	require.NoError(t, err)
	defer peer.Close()
	seg, err := peer.OpenSegment(target.Name())
	require.NoError(t, err)
	require.NoError(t, peer.CloseSegment(seg))
	for _, c := range drips {
		waitClosed(t, c, 20*time.Second)
	}
	close(stop)
	s := target.Stats().Listeners["engine"]
	require.LessOrEqual(t, s.Unauthenticated, maxUnauth)
	require.GreaterOrEqual(t, s.HandshakeTimeouts+s.Evicted+s.HandshakeFailures, uint64(3*maxUnauth))

	handshaken := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		_, err = wire.ClientHandshake(c, wire.HandshakeConfig{LocalName: "flooder"}, core.KindControl)
		require.NoError(t, err)
		return c
	}
	// An oversized length: the connection is closed at once.
	c := handshaken()
	defer c.Close()
	var frame bytes.Buffer
	frame.Write([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f})
	_, err = c.Write(frame.Bytes())
	require.NoError(t, err)
	waitClosed(t, c, 20*time.Second)

	// A half-frame: closed within the engine's timeout.
	h := handshaken()
	defer h.Close()
	_, err = h.Write([]byte{4, 0, 0, 0, 0, 0, 0x10, 0, 1, 2, 3})
	require.NoError(t, err)
	start := time.Now()
	waitClosed(t, h, 20*time.Second)
	t.Logf("half-frame connection closed after %v", time.Since(start))

	// Still serving.
	seg, err = peer.OpenSegment(target.Name())
	require.NoError(t, err)
	require.NoError(t, peer.CloseSegment(seg))
}
