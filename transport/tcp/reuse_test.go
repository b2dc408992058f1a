package tcp_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// heldConn is a data connection whose next write, once armed, hands its
// bytes to the socket and then does not return until released: the
// writing goroutine is still inside the write while the peer answers.
type heldConn struct {
	net.Conn
	mu      sync.Mutex
	armed   bool
	written chan struct{} // closed when the armed write's bytes are out
	release chan struct{}
}

func (h *heldConn) Write(p []byte) (int, error) {
	n, err := h.Conn.Write(p)
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	h.mu.Unlock()
	if armed {
		close(h.written)
		<-h.release
	}
	return n, err
}

// The states of a Submit call are reused once its requests are over,
// even while the goroutine that wrote them is still inside its write: a
// READ answered before the write returns gives its state back, and the
// next Submit takes it. The write's end must then touch only what it
// entered (its WRITEs), not the reused state: the next batch's WRITE,
// taken with that state, completes once, with its data.
func TestStatesReusedWhileTheirWriteReturns(t *testing.T) {
	const block = 4096
	peer := startPeer(t, 2*block)
	e, tr := newEngine(t, core.Options{})
	conns := make(chan *heldConn, 1)
	tr.WrapConns(func(nc net.Conn) net.Conn {
		h := &heldConn{Conn: nc, written: make(chan struct{}), release: make(chan struct{})}
		conns <- h
		return h
	})
	local := register(t, e, 3*block, 0)
	seg := openSegment(t, e, peer.Name)
	remote := peer.Buffers[0].Addr
	write := func(off uint64) []core.TransferRequest {
		return []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local) + off, Segment: seg, Remote: remote + off, Len: block}}
	}

	// The stream comes up (the writer dials); then it is idle, and the
	// states of that batch are free.
	code, _, err := run(t, e, write(0), 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Eventually(t, func() bool { return !tr.Writing() && tr.FreeSubmissions() == 1 }, 10*time.Second, time.Millisecond)
	h := <-conns
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})

	// A READ, written inline by its submitter, which stays in the write.
	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := e.Submit([]core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local) + 2*block, Segment: seg, Remote: remote, Len: block}},
			core.TransferOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		submitted <- b
	}()
	<-h.written
	// Its reply is read by the reader goroutine meanwhile: the READ is
	// over and its states are free again.
	require.Eventually(t, func() bool { return tr.Stats()["requests_in_flight"] == 0 && tr.FreeSubmissions() == 1 }, 10*time.Second, time.Millisecond)
	require.True(t, tr.Writing(), "the READ's submitter is still inside its write")

	// The next batch takes those states; its WRITE waits for the write side.
	for i := range local[block : 2*block] {
		local[block+i] = byte(i*7 + 3)
	}
	b, err := e.Submit(write(block), core.TransferOptions{Timeout: 30 * time.Second})
	require.NoError(t, err)
	require.Zero(t, tr.FreeSubmissions(), "the free states were taken")
	close(h.release)

	read := <-submitted
	require.NotNil(t, read)
	code, err = read.Wait(-1)
	require.Equal(t, status.OK, code, "%v", err)
	e.ReleaseBatch(read)
	code, err = b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", err)
	e.ReleaseBatch(b)

	back := make([]byte, block)
	copy(back, local[block:2*block])
	clear(local[2*block:])
	code, _, err = run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local) + 2*block, Segment: seg, Remote: remote + block, Len: block}}, 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.True(t, bytes.Equal(back, local[2*block:]), "the WRITE's data did not arrive")
	require.Zero(t, e.Stats().DuplicateCompletions)
	require.Zero(t, tr.Stats()["protocol_errors"])
}
