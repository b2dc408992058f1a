package core_test

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/local"
	"github.com/tent-dev/tent/wire"
)

// Engine.Close waits for transfers that a same-process peer runs on its
// regions: once Close returns, the owner may free or reuse the memory, so
// nothing may still write into it.
func TestCloseWaitsForPeerCopies(t *testing.T) {
	const n = 64 << 20
	a := newLocalEngine(t, core.Options{})
	// Close waits for the copy however slow the machine (the timeout only
	// bounds a copy that never ends).
	b, err := core.New(core.Options{Available: available(), Transports: []string{"local"}, UnregisterTimeout: time.Minute, LocalPeers: thisProcess})
	require.NoError(t, err)
	src, _ := buf(t, a, n, 0)
	dst := make([]byte, n)
	region, err := b.Register(core.RegionDesc{Addr: host.Addr(dst), Len: n}, core.PermRemoteWrite)
	require.NoError(t, err)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	copies := func() int64 { return a.Stats().Transports["local"]["copies"] }

	// Close must run while the copy holds b's region. The copy runs on a
	// goroutine of its own; catch it inside the region (a copy that ends
	// before it is seen there proves nothing, so submit again).
	var batch *core.Batch
	var before int64 // copies counted before the batch
	for attempt := 1; ; attempt++ {
		before = copies()
		batch, err = a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
			Remote: host.Addr(dst), Len: n}}, core.TransferOptions{})
		require.NoError(t, err)
		for region.Users() == 0 && !settled(batch) {
			runtime.Gosched()
		}
		if region.Users() > 0 {
			t.Logf("copy caught inside b's region on attempt %d", attempt)
			break
		}
		code, err := batch.Wait(10 * time.Second)
		require.Equal(t, status.OK, code, "%v", err)
		a.ReleaseBatch(batch)
		require.Less(t, attempt, 1000, "the copy was never seen holding b's region")
	}
	require.NoError(t, b.Close())

	// The copy counts itself before it lets go of the region, so once Close
	// returns it must be counted. b is closed: its owner believes nothing
	// touches dst any more and reuses it.
	finished := copies() > before
	clear(dst)
	code, _ := batch.Wait(10 * time.Second)
	nonZero := 0
	for _, c := range dst {
		if c != 0 {
			nonZero++
		}
	}
	t.Logf("copy finished when b.Close returned: %v; outcome %v; %d bytes of dst written after Close", finished, code, nonZero)
	require.True(t, finished, "b.Close returned while a peer was still writing into b's registered memory")
	require.Zero(t, nonZero, "dst written after b.Close returned")
}

// settled reports, without waiting, whether the batch has ended.
func settled(b *core.Batch) bool {
	select {
	case <-b.Settled():
		return true
	default:
		return false
	}
}

// A peer holds the region exactly as the local transport's copy (and the
// tcp server) do, via Acquire; Close waits for it like Unregister does.
func TestCloseWaitsForAcquiredRegion(t *testing.T) {
	e, err := core.New(core.Options{Transports: []string{}, UnregisterTimeout: 5 * time.Second})
	require.NoError(t, err)
	mem := make([]byte, 4096)
	_, err = e.Register(core.RegionDesc{Addr: host.Addr(mem), Len: 4096}, rw)
	require.NoError(t, err)
	held, err := e.Acquire(host.Addr(mem), 4096, core.AccessRemoteWrite)
	require.NoError(t, err)
	// The peer holds the region a while (any length does): Close must not
	// return before it lets go.
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		released <- time.Now()
		e.Release(held)
	}()
	require.NoError(t, e.Close())
	closed := time.Now()
	releasedAt := <-released
	t.Logf("Close returned %v after the peer released the region", closed.Sub(releasedAt))
	require.False(t, closed.Before(releasedAt), "Close returned while the region was still in use")
}

// An Unregister waiting on a busy region while Close runs: both finish, and
// the span is removed once (the counters stay right).
func TestUnregisterRacingCloseKeepsCounters(t *testing.T) {
	e, err := core.New(core.Options{Transports: []string{}, UnregisterTimeout: 5 * time.Second})
	require.NoError(t, err)
	r, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x100}, rw)
	require.NoError(t, err)
	held, err := e.Acquire(0x1000, 0x10, core.AccessLocal)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- e.Unregister(r) }()
	require.Eventually(t, func() bool {
		x, err := e.Acquire(0x1000, 0x10, core.AccessLocal)
		if err == nil {
			e.Release(x)
		}
		return err != nil // closing: unregister is waiting
	}, 10*time.Second, time.Millisecond)
	go func() { time.Sleep(50 * time.Millisecond); e.Release(held) }() // Close starts waiting first, or not: both must work
	require.NoError(t, e.Close(), "Close waits for the user, then both finish")
	require.NoError(t, <-done)
	st := e.Stats()
	require.NoError(t, e.CheckIndex())
	require.Zero(t, st.Regions)
	require.Zero(t, st.RegisteredBytes)
}

// Two concurrent Installs of one name: the name is reserved before the
// transport is called, so exactly one wins.
func TestConcurrentInstallSameName(t *testing.T) {
	e := newEngine(t)
	f1, f2 := coretest.NewFake("dup"), coretest.NewFake("dup")
	b1 := f1.BlockAt(coretest.MethodInstall, 1)
	errs := make(chan error, 1)
	go func() { errs <- e.Install(f1) }()
	<-b1.Entered()
	// f1 is inside Install with the name reserved: f2 is refused at once
	// and never called.
	require.ErrorIs(t, e.Install(f2), status.ErrInvalidArgument)
	require.Zero(t, f2.Calls(coretest.MethodInstall))
	b1.Release()
	require.NoError(t, <-errs)
	names := []string{}
	for _, tr := range e.Transports() {
		names = append(names, tr.Name())
	}
	require.Equal(t, []string{"dup"}, names)
}

// Install and Uninstall change the descriptor: an uninstalled transport is
// no longer advertised to peers.
func TestDescriptorFollowsUninstall(t *testing.T) {
	e, err := core.New(core.Options{Available: available(), Transports: []string{"tcp"}})
	require.NoError(t, err)
	defer e.Close()
	d, err := e.Descriptor()
	require.NoError(t, err)
	t.Logf("before: %v", d.Endpoints)
	require.NoError(t, e.Uninstall("tcp"))
	d, err = e.Descriptor()
	require.NoError(t, err)
	t.Logf("after Uninstall(tcp): %v", d.Endpoints)
	for _, ep := range d.Endpoints {
		require.NotEqual(t, "tcp", ep.Transport, "uninstalled transport still advertised")
	}
}

// Only the transports that registered a region are told to unregister it,
// not one installed later.
func TestUnregisterOnlyWhereRegistered(t *testing.T) {
	a, b := coretest.NewFake("a"), coretest.NewFake("b")
	e, err := core.New(core.Options{Transports: []string{}})
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, e.Install(a))
	r, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x100}, rw)
	require.NoError(t, err)
	require.NoError(t, e.Install(b))
	require.NoError(t, e.Unregister(r))
	t.Logf("b misuse: %v", b.Misuse())
	require.Empty(t, b.Misuse())
}

// A timeout near the largest the C API accepts: adding the grace period
// must not overflow into "give up now". Wait(-1) waits for the batch, and
// Cancel waits for the mover.
func TestHugeTimeoutStillWaits(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.Hold()
	const maxMs = 9223372036854 // capi: largest timeout_ms accepted
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}},
		core.TransferOptions{Timeout: maxMs * time.Millisecond})
	require.NoError(t, err)
	<-m.Entered()
	waited := make(chan status.Code, 1)
	go func() { c, _ := batch.Wait(-1); waited <- c }()
	select {
	case c := <-waited:
		t.Fatalf("Wait(-1) returned %v while the mover still holds the request", c)
	case <-time.After(100 * time.Millisecond):
	}
	m.ReleaseAll()
	require.Equal(t, status.OK, <-waited)
}

// Close makes batches final only after the transports let go of their
// requests: a thread waiting on the batch must never see it finished while
// a mover still holds (and may still write) its local memory.
type slowUninstallMover struct {
	*coretest.Mover
	gate chan struct{}
}

func (s *slowUninstallMover) Uninstall() error { <-s.gate; return s.Mover.Uninstall() }

func TestCloseCompletesOnlyWhenMoversLetGo(t *testing.T) {
	a, err := core.New(core.Options{Transports: []string{}})
	require.NoError(t, err)
	m := &slowUninstallMover{Mover: coretest.NewMover("slow"), gate: make(chan struct{})}
	require.NoError(t, a.Install(m))
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, rw)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpRead, Local: host.Addr(src), Segment: seg,
		Remote: host.Addr(dst), Len: 64}}, core.TransferOptions{})
	require.NoError(t, err)
	<-m.Entered()
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	// While the mover holds the request, the batch is not final.
	code, _ := batch.Wait(200 * time.Millisecond)
	require.Equal(t, status.Timeout, code, "the batch looked finished while the mover held its memory")
	require.Equal(t, 1, m.Held())
	close(m.gate)
	require.NoError(t, <-closed)
	code, _ = batch.Wait(5 * time.Second)
	require.Equal(t, status.Closed, code)
	select {
	case <-batch.Settled():
	default:
		t.Fatal("final but not settled")
	}
}

// A remote peer that repeats the descriptor (incarnation included) of an
// engine in this process is not taken for it: transfers meant for the
// remote never land in the other engine's memory.
func TestRemoteCannotPoseAsInProcessEngine(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	victim := newLocalEngine(t, core.Options{})
	vbuf, _ := buf(t, victim, 4096, rw)
	for i := range vbuf {
		vbuf[i] = 0
	}
	vdesc, err := victim.EncodedDescriptor() // what any peer of victim has seen

	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() { // a "remote" engine that replays victim's descriptor
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := wire.ServerHandshake(c, wire.HandshakeConfig{LocalName: "evil", Deadline: time.Now().Add(5 * time.Second)}); err != nil {
			return
		}
		for {
			_, p, err := wire.ReadFrame(c, 1<<20, nil)
			if err != nil {
				return
			}
			enc := wire.NewEncoder(nil)
			enc.Raw(p[:8]) // id
			enc.U32(0)
			enc.String("")
			enc.Bytes(vdesc)
			if wire.WriteFrame(c, 2 /* ctlDesc */, enc.Out()) != nil {
				return
			}
		}
	}()
	src, _ := buf(t, a, 4096, 0)
	for i := range src {
		src[i] = 0xAB
	}
	seg, err := a.OpenSegment(ln.Addr().String())
	require.NoError(t, err)
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: host.Addr(vbuf), Len: 64}}, core.TransferOptions{})
	require.NoError(t, err)
	code, st := wait(t, batch)
	t.Logf("write to segment %s: %v via transport %d; victim's first byte now %#x", ln.Addr(), code, st[0].Transport, vbuf[0])
	require.Zero(t, vbuf[0], "data addressed to a remote peer landed in another in-process engine")
}

// Peers that failed to open, or whose last segment closed, are forgotten.
func TestPeersDoNotPileUp(t *testing.T) {
	a := newLocalEngine(t, core.Options{DefaultTimeout: 200 * time.Millisecond})
	for i := 0; i < 50; i++ {
		_, err := a.OpenSegment("not-an-address-" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
		require.Error(t, err)
	}
	t.Logf("peers after 50 failed opens: %d", a.Stats().Peers)
	require.Zero(t, a.Stats().Peers)
}

// An old transport's Uninstall removes only its own connection handler,
// not one a new instance registered meanwhile.
type connTransport struct {
	kind    uint8
	e       *core.Engine
	remove  func()
	got     chan struct{}
	entered chan struct{}
	block   chan struct{}
}

func (c *connTransport) Name() string                          { return "conn" }
func (c *connTransport) RegisterMemory([]*core.Region) error   { return nil }
func (c *connTransport) UnregisterMemory([]*core.Region) error { return nil }
func (c *connTransport) Stats() map[string]int64               { return nil }
func (c *connTransport) Install(e *core.Engine) error {
	c.e = e
	remove, err := e.HandleConn(c.kind, func(net.Conn, string) { c.got <- struct{}{} })
	c.remove = remove
	return err
}
func (c *connTransport) Uninstall() error {
	if c.block != nil {
		close(c.entered)
		<-c.block
	}
	c.remove()
	return nil
}

func TestUninstallKeepsNewInstancesHandler(t *testing.T) {
	conn := core.TransportSpec{Name: "conn", ID: 77, Kinds: []uint8{77}, New: func() core.Transport { return &connTransport{} }}
	e, err := core.New(core.Options{Available: []core.TransportSpec{conn}, Transports: []string{}})
	require.NoError(t, err)
	defer e.Close()
	old := &connTransport{kind: 77, got: make(chan struct{}, 1), entered: make(chan struct{}), block: make(chan struct{})}
	require.NoError(t, e.Install(old))
	un := make(chan error, 1)
	go func() { un <- e.Uninstall("conn") }()
	<-old.entered
	fresh := &connTransport{kind: 77, got: make(chan struct{}, 1)}
	require.NoError(t, e.Install(fresh), "the name is free again while the old one tears down")
	close(old.block)
	require.NoError(t, <-un)

	c, err := e.Dial(e.ListenAddr(), 77, time.Now().Add(2*time.Second))
	require.NoError(t, err)
	defer c.Close()
	select {
	case <-fresh.got:
	case <-time.After(10 * time.Second): // a bound for a lost connection, not the wait
		t.Fatal("the installed transport never receives its connections: the old Uninstall cleared its handler")
	}
}

// A request pinned to a transport (TransferOptions.Transport) is not
// retried on another one.
func TestPinnedTransportDoesNotFallBack(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.FailWith(status.Errorf(status.TransportError, "wire cut"))
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}},
		core.TransferOptions{Transport: "fake"})
	require.NoError(t, err)
	code, st := wait(t, batch)
	t.Logf("pinned to \"fake\": outcome %v, moved by transport id %d, flags %d", code, st[0].Transport, st[0].Flags)
	require.NotEqual(t, local.ID, st[0].Transport, "request pinned to one transport was moved by another")
	require.Equal(t, status.TransportError, code)
	require.Zero(t, st[0].Flags&core.FlagRetried)
}

// A transport reporting a failure with a non-error code (Pending, OK) does
// not leave the request pending forever: it is an internal error.
func TestDoneWithNonErrorCode(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.FailWith(status.Errorf(status.Pending, "buggy transport"))
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	<-batch.Settled()
	code, err := batch.Wait(200 * time.Millisecond)
	c2, done, _ := batch.Status(nil)
	t.Logf("settled; Wait: %v (%v); Status: %v, completed %d of 1", code, err, c2, done)
	require.NotEqual(t, status.Pending, c2, "request the mover completed stays PENDING forever")
	require.Equal(t, status.Internal, c2)
}

// Wait(-1) ends at the batch's deadline even while the mover still holds
// the request: the batch's deadline finishes it, not a timer of the wait.
func TestWaitForeverEndsAtTheDeadline(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}},
		core.TransferOptions{Timeout: 20 * time.Millisecond})
	require.NoError(t, err)
	<-m.Entered()
	waited := make(chan status.Code, 1)
	go func() { c, _ := batch.Wait(-1); waited <- c }()
	select {
	case c := <-waited:
		require.Equal(t, status.Timeout, c)
	case <-time.After(30 * time.Second):
		t.Fatal("Wait(-1) still waiting long after the batch's deadline")
	}
	m.ReleaseAll()
	<-batch.Settled()
}
