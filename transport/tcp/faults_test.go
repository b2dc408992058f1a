package tcp_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

// fakePeer is a misbehaving engine: it answers the control link with a
// descriptor offering a tcp endpoint and 1 GiB of memory, completes the
// data handshake and hello, and then does what mode says.
type fakePeer struct {
	t    testing.TB
	ln   net.Listener
	mode string // "stall": never read; "silent": read, never answer; "reset": read a little, then reset; "late": answer at answerAt; "coded": answer at once, odd ids with OutOfRange and no message, even ids with success and the staged flag; "once": answer one WRITE, then never read, with the smallest receive buffer; "gated": answer each WRITE when answer gives a token; "split": answer each request in two parts (part of the header, or the header and part of a READ's payload, then the rest), each when answer gives a token
	desc []byte
	inc  uint64
	// answerAt (unix nanoseconds) is when a "late" peer answers the WRITEs
	// it has read; zero: at once.
	answerAt atomic.Int64
	// answer hands a "gated" peer one token per WRITE it may answer.
	answer chan struct{}

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	done  chan struct{}
}

const fakeBase = 1 << 40

func startFake(t testing.TB, mode string) *fakePeer {
	var lc net.ListenConfig
	if mode == "once" {
		// Set on the listener, the small buffer holds from the handshake
		// on: the window stays small, and no autotuning grows it.
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1) })
		}
	}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	f := &fakePeer{t: t, ln: ln, mode: mode, inc: 0xfa4e, done: make(chan struct{}), answer: make(chan struct{}, 64)}
	d := &wire.SegmentDesc{Name: addr, MachineID: "fake", PID: 1, Incarnation: f.inc, Generation: 1,
		Endpoints: []wire.Endpoint{{Transport: "ctl", Addr: addr}, {Transport: "tcp", Addr: addr}},
		Regions:   []wire.RegionDesc{{Addr: fakeBase, Len: 1 << 30, Perm: wire.PermRead | wire.PermWrite, Location: "cpu"}}}
	f.desc, err = d.MarshalBinary()
	require.NoError(t, err)
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakePeer) addr() string { return f.ln.Addr().String() }

// closeConns closes the data and control connections accepted so far.
func (f *fakePeer) closeConns() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

func (f *fakePeer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.serve(c)
		}()
	}
}

func (f *fakePeer) close() {
	close(f.done)
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakePeer) serve(c net.Conn) {
	kind, _, err := wire.ServerHandshake(c, wire.HandshakeConfig{Deadline: time.Now().Add(5 * time.Second), LocalName: f.addr()})
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	switch kind {
	case core.KindControl:
		for {
			typ, payload, err := wire.ReadFrame(c, 0, nil)
			if err != nil {
				return
			}
			if typ != 1 { // ctlGetDesc
				continue
			}
			enc := wire.NewEncoder(nil)
			enc.U64(binary.LittleEndian.Uint64(payload))
			enc.U32(0)
			enc.String("")
			enc.Bytes(f.desc)
			if wire.WriteFrame(c, 2, enc.Out()) != nil {
				return
			}
		}
	case tcp.KindData:
		hello := make([]byte, 16)
		copy(hello, "TTCP")
		binary.LittleEndian.PutUint16(hello[4:], 1)
		binary.LittleEndian.PutUint64(hello[8:], f.inc)
		if _, err := c.Write(hello); err != nil {
			return
		}
		switch f.mode {
		case "stall":
			<-f.done // hold the connection, never read
		case "silent":
			_, _ = io.Copy(io.Discard, c)
		case "reset":
			_, _ = io.ReadFull(c, make([]byte, 1000))
			_ = c.(*net.TCPConn).SetLinger(0)
			c.Close()
		case "split":
			f.serveSplit(c)
		case "late", "once", "gated", "coded":
			hdr := make([]byte, 24)
			for answered := 0; ; answered++ {
				if f.mode == "once" && answered == 1 {
					<-f.done // hold the connection, never read again
					return
				}
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				n := binary.LittleEndian.Uint32(hdr[4:])
				if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
					return
				}
				if f.mode == "gated" {
					select {
					case <-f.answer:
					case <-f.done:
						return
					}
				}
				if at := f.answerAt.Load(); at != 0 {
					select {
					case <-time.After(time.Until(time.Unix(0, at))):
					case <-f.done:
						return
					}
				}
				reply := make([]byte, 24)
				reply[0] = hdr[0]
				copy(reply[8:16], hdr[8:16])
				if f.mode == "coded" {
					if binary.LittleEndian.Uint64(hdr[8:])%2 == 1 {
						code := int32(status.OutOfRange)
						binary.LittleEndian.PutUint32(reply[4:], uint32(code))
					} else {
						reply[1] = 1 // copied through host memory
					}
				}
				if _, err := c.Write(reply); err != nil {
					return
				}
			}
		}
	}
}

// serveSplit answers each request in two parts, each sent when f.answer
// gives a token: a WRITE's reply header cut after 10 bytes, a READ's reply
// cut after its header and 1 KiB of the payload (byte i of the payload is
// byte(i)).
func (f *fakePeer) serveSplit(c net.Conn) {
	hdr := make([]byte, 24)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		n := binary.LittleEndian.Uint32(hdr[4:])
		reply := make([]byte, 24, 24+n)
		reply[0] = hdr[0]
		copy(reply[8:16], hdr[8:16])
		cut := 10
		if hdr[0] == 2 { // READ
			binary.LittleEndian.PutUint32(reply[16:], n)
			for i := uint32(0); i < n; i++ {
				reply = append(reply, byte(i))
			}
			cut = 24 + 1024
		} else if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
			return
		}
		for _, part := range [][]byte{reply[:cut], reply[cut:]} {
			select {
			case <-f.answer:
			case <-f.done:
				return
			}
			if _, err := c.Write(part); err != nil {
				return
			}
		}
	}
}

// settled waits for every request of the batch to be let go by the
// transport and returns the time that took; then it waits for the final
// statuses (which the engine publishes just after).
func settled(t testing.TB, b *core.Batch, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-b.Settled():
	case <-time.After(limit):
		t.Fatalf("requests still held by the transport after %v", limit)
	}
	took := time.Since(start)
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the batch has no final status 5s after its requests settled")
	}
	return took
}

// A peer that stops reading, or stops answering: the requests fail by
// their deadline (Timeout) and the transport lets go of all of them.
func TestUnresponsivePeer(t *testing.T) {
	for _, mode := range []string{"stall", "silent"} {
		t.Run(mode, func(t *testing.T) {
			f := startFake(t, mode)
			e, tr := newEngine(t, core.Options{DefaultTimeout: 5 * time.Second})
			local := register(t, e, 64<<20, 0)
			seg, err := e.OpenSegment(f.addr())
			require.NoError(t, err)
			reqs := []core.TransferRequest{
				{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 64 << 20},
				{Op: core.OpRead, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 4096},
				{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 1},
			}
			const timeout = 700 * time.Millisecond
			b, err := e.Submit(reqs, core.TransferOptions{Timeout: timeout})
			require.NoError(t, err)
			took := settled(t, b, 10*time.Second)
			require.Less(t, took, timeout+500*time.Millisecond)
			code, _ := b.Wait(0)
			require.Equal(t, status.Timeout, code)
			require.Positive(t, tr.Stats()["timeouts"])
			e.ReleaseBatch(b)
			require.Zero(t, tr.Stats()["requests_in_flight"])
		})
	}
}

// A connection reset fails its requests with TransportError at once, and
// the engine goes on working with other peers.
func TestConnectionReset(t *testing.T) {
	f := startFake(t, "reset")
	e, tr := newEngine(t, core.Options{})
	local := register(t, e, 8<<20, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 8)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 1 << 20}
	}
	start := time.Now()
	code, st, err := run(t, e, reqs, 10*time.Second)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, status.TransportError, code, "%v", err)
	for _, s := range st {
		require.Equal(t, status.TransportError, s.Code)
	}
	require.Zero(t, tr.Stats()["requests_in_flight"])

	// Another peer still works.
	b, _ := newEngine(t, core.Options{})
	dst := alloc(t, b, 8<<20, rw)
	seg2, err := e.OpenSegment(b.Name())
	require.NoError(t, err)
	random(local)
	code, _, err = run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg2,
		Remote: host.Addr(dst), Len: 8 << 20}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, local, dst)
}

// Connections the target closes under the initiator (as a network reset
// would): the requests in flight fail with TransportError, and the next
// batch dials again.
func TestReconnectAfterDrop(t *testing.T) {
	a, ta := newEngine(t, core.Options{})
	b, tb := newEngine(t, core.Options{})
	src := alloc(t, a, 64<<20, 0)
	dst := alloc(t, b, 64<<20, rw)
	random(src)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 64)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i<<20), Segment: seg,
			Remote: host.Addr(dst) + uint64(i<<20), Len: 1 << 20}
	}
	bt, err := a.Submit(reqs, core.TransferOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tb.Stats()["bytes_received"] > 1<<20 }, 5*time.Second, time.Millisecond)
	tb.ResetServerConns()
	settled(t, bt, 5*time.Second)
	st := make([]core.RequestStatus, len(reqs))
	bt.Status(st)
	for _, s := range st {
		require.Contains(t, []status.Code{status.OK, status.TransportError}, s.Code)
	}
	a.ReleaseBatch(bt)
	// A connection learns of the reset when its reader gets it; one the
	// batch no longer used may not have yet, and a write to it would fail.
	// Wait until the initiator holds only connections the target still
	// serves (those dialed after the reset); the next batch must then work.
	require.Eventually(t, func() bool {
		return ta.Stats()["connections"] == tb.Stats()["server_connections"]
	}, 10*time.Second, time.Millisecond, "the initiator never noticed the dropped connections")

	code, _, err := run(t, a, reqs, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, src, dst)
	require.GreaterOrEqual(t, ta.Stats()["dials"], int64(2))
}

// kill -9 of the peer in the middle of a batch: every request ends by its
// deadline with TransportError or Timeout (or OK, if it got through);
// another peer still works; the peer restarted at the same address is
// reachable again through the same segment.
func TestPeerKilledMidBatch(t *testing.T) {
	const size = 8 << 20
	cfg := peertest.Config{Transports: []string{"tcp"}, Buffers: []peertest.Buffer{{Size: size, Perm: rw}}}
	peer := peertest.Start(t, cfg)
	e, tr := newEngine(t, core.Options{})
	local := register(t, e, size, 0)
	random(local)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 512)
	for i := range reqs {
		off := uint64(i%8) << 20
		reqs[i] = core.TransferRequest{Op: core.Op(i % 2), Local: host.Addr(local) + off, Segment: seg,
			Remote: peer.Buffers[0].Addr + off, Len: 1 << 20}
	}
	const timeout = 5 * time.Second
	b, err := e.Submit(reqs, core.TransferOptions{Timeout: timeout})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tr.Stats()["bytes_sent"] > 8<<20 }, 5*time.Second, time.Millisecond)
	peer.Kill()
	t.Logf("settled after kill in %v", settled(t, b, timeout+time.Second))
	st := make([]core.RequestStatus, len(reqs))
	b.Status(st)
	failed := 0
	for _, s := range st {
		require.Contains(t, []status.Code{status.OK, status.TransportError, status.Timeout}, s.Code)
		if s.Code != status.OK {
			failed++
		}
	}
	require.Positive(t, failed)
	e.ReleaseBatch(b)
	require.Zero(t, tr.Stats()["requests_in_flight"])

	// Another peer works.
	other := peertest.Start(t, cfg)
	seg2, err := e.OpenSegment(other.Name)
	require.NoError(t, err)
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg2,
		Remote: other.Buffers[0].Addr, Len: 1 << 20}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, peertest.Pattern(0, 1<<20), local[:1<<20])

	// The peer comes back at the same address, as a new incarnation with
	// new content; the old segment reaches it after at most a few failed
	// batches (the first ones may still be routed to the old incarnation).
	cfg.ListenAddr = peer.Name
	back := peertest.Start(t, cfg)
	require.Equal(t, peer.Name, back.Name)
	_, err = back.Cmd("fill 0 77")
	require.NoError(t, err)
	ok := false
	for attempt := 0; attempt < 10 && !ok; attempt++ {
		t0 := time.Now()
		code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
			Remote: back.Buffers[0].Addr, Len: 1 << 20}}, 5*time.Second)
		t.Logf("attempt %d after restart: %v in %v: %v", attempt, code, time.Since(t0), err)
		ok = code == status.OK
	}
	require.True(t, ok, "the restarted peer is not reachable through the old segment")
	require.Equal(t, peertest.Pattern(77, 1<<20), local[:1<<20])
}

// The socket deadline left from a batch that completed does not fail a
// later batch with a longer deadline: it is moved when it fires.
func TestStaleDeadline(t *testing.T) {
	f := startFake(t, "late")
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	local := register(t, e, 4096, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 4096}}
	first, err := e.Submit(req, core.TransferOptions{Timeout: 2 * time.Second}) // answered at once
	require.NoError(t, err)
	code, err := first.Wait(10 * time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	stale := first.Deadline()
	e.ReleaseBatch(first)
	// The next answer comes only after the first batch's deadline, which
	// the socket still carries, has fired.
	f.answerAt.Store(stale.Add(100 * time.Millisecond).UnixNano())
	code, _, err = run(t, e, req, 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.True(t, time.Now().After(stale), "answered after the first deadline")
	require.EqualValues(t, 1, tr.Stats()["dials"], "the connection was kept")
	require.Zero(t, tr.Stats()["timeouts"])
}

// A submitter writing on an idle stream whose socket still carries the
// deadline of a batch that completed, and that has passed since, moves the
// deadline and writes: the write does not fail with Timeout. (The caller
// reads its own reply, and the reader goroutine, which would have moved
// the deadline when its read timed out, does not take the read side back
// meanwhile.)
func TestStaleDeadlineInlineWrite(t *testing.T) {
	f := startFake(t, "late") // answers at once
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	tr.SetWatchDelay(time.Hour)
	local := register(t, e, 4096, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 4096}}
	// Until a batch's reply was read by its caller: the read side is then
	// free, and the reader goroutine waits for its watch (an hour).
	var stale time.Time
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "no caller read its own reply")
		byCaller := tr.Stats()["replies_by_caller"]
		b, err := e.Submit(req, core.TransferOptions{Timeout: 100 * time.Millisecond, Waiting: true})
		require.NoError(t, err)
		code, err := b.Wait(-1)
		require.Equal(t, status.OK, code, "%v", err)
		stale = b.Deadline()
		e.ReleaseBatch(b)
		if tr.Stats()["replies_by_caller"] > byCaller {
			break
		}
	}
	<-time.After(time.Until(stale) + time.Millisecond) // the socket's deadline has passed
	inline := tr.Stats()["writes_inline"]
	b, err := e.Submit(req, core.TransferOptions{Timeout: time.Minute, Waiting: true})
	require.NoError(t, err)
	code, err := b.Wait(-1)
	e.ReleaseBatch(b)
	require.Equal(t, status.OK, code, "%v", err)
	require.Greater(t, tr.Stats()["writes_inline"], inline, "the submitter wrote the request itself")
	require.EqualValues(t, 1, tr.Stats()["dials"], "the connection was kept")
	require.Zero(t, tr.Stats()["timeouts"])
}

// Replies that carry nothing after their header (no payload, no message)
// complete their requests with the status and flags the header gives, and
// leave the stream in step: a refusal without a message fails its request
// with the code sent, the staged flag marks the request, and the stream
// goes on serving the next batch (waited for with and without Waiting).
func TestRepliesWithoutMessage(t *testing.T) {
	f := startFake(t, "coded")
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	local := register(t, e, 8*4096, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 8)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(local) + uint64(i*4096), Segment: seg,
			Remote: fakeBase + uint64(i*4096), Len: 4096}
	}
	for round, waiting := range []bool{true, false, true} {
		b, err := e.Submit(reqs, core.TransferOptions{Timeout: 10 * time.Second, Waiting: waiting})
		require.NoError(t, err)
		code, _ := b.Wait(-1)
		require.Equal(t, status.OutOfRange, code, "round %d", round)
		sts := make([]core.RequestStatus, len(reqs))
		b.Status(sts)
		for i, st := range sts {
			id := uint64(round*len(reqs) + i + 1) // ids run on over the connection
			if id%2 == 1 {
				require.Equal(t, status.OutOfRange, st.Code, "round %d request %d", round, i)
				require.Zero(t, st.Flags&core.FlagStaged, "round %d request %d", round, i)
			} else {
				require.Equal(t, status.OK, st.Code, "round %d request %d", round, i)
				require.Equal(t, core.FlagStaged, st.Flags&core.FlagStaged, "round %d request %d", round, i)
			}
		}
		e.ReleaseBatch(b)
	}
	require.EqualValues(t, 1, tr.Stats()["dials"], "the connection was kept")
	require.Zero(t, tr.Stats()["protocol_errors"])
	require.Zero(t, tr.Stats()["requests_in_flight"])
}
