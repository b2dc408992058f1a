package tcp_test

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// gatedConn is a data connection whose writes, once armed, stop until the
// connection is closed: a socket whose peer stopped reading, at the
// moment of a write.
type gatedConn struct {
	net.Conn
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when an armed write starts
	closed  chan struct{}
	once    sync.Once
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	armed := g.armed
	if armed {
		g.armed = false
		close(g.entered)
	}
	g.mu.Unlock()
	if armed {
		<-g.closed
		return 0, net.ErrClosed
	}
	return g.Conn.Write(p)
}

func (g *gatedConn) Close() error {
	g.once.Do(func() { close(g.closed) })
	return g.Conn.Close()
}

// A small request on an idle stream is written by the submitting
// goroutine itself (no hand-off to the writer): Submit is still inside the
// write when the socket stops. Closing the transport then must fail the
// request once, give its memory back and leave nothing running.
func TestInlineWriteRacingClose(t *testing.T) {
	peer := startPeer(t, 1<<20)
	e, tr := newEngine(t, core.Options{})
	conns := make(chan *gatedConn, 8)
	tr.WrapConns(func(nc net.Conn) net.Conn {
		g := &gatedConn{Conn: nc, entered: make(chan struct{}), closed: make(chan struct{})}
		conns <- g
		return g
	})
	local := register(t, e, 4096, 0)
	seg := openSegment(t, e, peer.Name)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[0].Addr, Len: 4096}}

	// The first request dials (through the writer); the stream is then up and idle.
	code, _, err := run(t, e, req, 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Len(t, conns, 1)
	require.Equal(t, int64(1), tr.Stats()["writes_by_writer"], "the first request dials: the writer sends it")
	require.Eventually(t, func() bool { return !tr.Writing() }, 10*time.Second, time.Millisecond)
	g := <-conns
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()

	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		submitted <- b
	}()
	<-g.entered
	select {
	case <-submitted:
		t.Fatal("Submit returned before its write finished: the write was handed off, not inline")
	default:
	}
	require.NoError(t, tr.Uninstall())
	b := <-submitted
	require.NotNil(t, b)
	code, err = b.Wait(-1)
	require.NotEqual(t, status.OK, code, "%v", err)
	require.Contains(t, []status.Code{status.Closed, status.TransportError}, code, "%v", err)
	<-b.Settled()
	e.ReleaseBatch(b)
	requireIdle(t, tr)
	st := e.Stats()
	require.Zero(t, st.DuplicateCompletions)
	require.Zero(t, st.RequestsInFlight)
	require.Zero(t, st.Batches)
}

// Submitters writing inline and the writer goroutine share one stream: a
// write from one may start while the other's replies are due. Every byte
// must still land where its request said, every request complete once,
// and the stream never see a reply out of order (a protocol error).
func TestInlineAndWriterShareAStream(t *testing.T) {
	const workers, rounds, block = 4, 150, 4096
	peer := startPeer(t, workers*2*block)
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	src := alloc(t, e, workers*2*block, 0)
	dst := alloc(t, e, workers*2*block, 0)
	seg := openSegment(t, e, peer.Name)
	remote := peer.Buffers[0].Addr

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uint64(w * 2 * block)
			out, in := src[off:off+2*block], dst[off:off+2*block]
			for i := 0; i < rounds; i++ {
				for k := range out {
					out[k] = byte(w*31 + i + k)
				}
				// A batch of one (inline when the stream is idle), then
				// one of two (to the writer when the stream is busy).
				for _, n := range []int{1, 2} {
					reqs := make([]core.TransferRequest, n)
					for j := range reqs {
						o := off + uint64(j*block)
						reqs[j] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + o, Segment: seg, Remote: remote + o, Len: block}
					}
					if code, _, err := run(t, e, reqs, 30*time.Second); code != status.OK {
						errs <- err
						return
					}
				}
				reqs := []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(dst) + off, Segment: seg, Remote: remote + off, Len: 2 * block}}
				if code, _, err := run(t, e, reqs, 30*time.Second); code != status.OK {
					errs <- err
					return
				}
				if !bytes.Equal(in, out) {
					errs <- fmt.Errorf("worker %d round %d: the data read back differs from the data written", w, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := tr.Stats()
	require.Zero(t, st["protocol_errors"], "%v", st)
	require.Equal(t, int64(1), st["dials"], "one stream carried everything: %v", st)
	require.Positive(t, st["writes_inline"], "%v", st)
	require.Positive(t, st["writes_by_writer"], "%v", st)
	require.Zero(t, e.Stats().DuplicateCompletions)
}

// A peer that answered once and then stops reading, with next to no
// receive window, and a send buffer too small for the next request: that
// request finds the stream idle and is written inline as far as the
// socket takes it, and the writer gets the rest. Submit must not block
// (nor, through Submit, the transport's Uninstall) until the deadline.
func TestInlineWriteNeverBlocksOnAStalledPeer(t *testing.T) {
	f := startFake(t, "once")
	e, tr := newEngine(t, core.Options{})
	tr.WrapConns(func(nc net.Conn) net.Conn {
		require.NoError(t, nc.(*net.TCPConn).SetWriteBuffer(1)) // the kernel's minimum
		return nc
	})
	local := register(t, e, tcp.InlineMax, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: tcp.InlineMax}}
	code, _, err := run(t, e, req, 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Eventually(t, func() bool { return !tr.Writing() }, 10*time.Second, time.Millisecond)

	b, err := e.Submit(req, core.TransferOptions{Timeout: time.Minute})
	require.NoError(t, err)
	// Had the write blocked, Submit would have returned at the deadline,
	// with the request already failed.
	code, _, _ = b.Status(nil)
	require.Equal(t, status.Pending, code)
	require.Equal(t, int64(1), tr.Stats()["writes_inline"])
	require.Equal(t, int64(1), tr.Stats()["writes_handed_off"], "the socket took all of %d bytes", tcp.InlineMax)
	require.NoError(t, e.Uninstall("tcp"))
	code, _ = b.Wait(-1)
	require.Contains(t, []status.Code{status.Closed, status.TransportError}, code)
	<-b.Settled()
	e.ReleaseBatch(b)
	requireIdle(t, tr)
}
