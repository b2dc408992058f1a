package core_test

import (
	"bytes"
	"crypto/rand"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/local"
)

// buf returns a registered buffer of n random bytes.
func buf(t *testing.T, e *core.Engine, n int, perm core.Perm) ([]byte, *core.Region) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, perm)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(b) }) // the engine holds only the address
	return b, r
}

// thisProcess is the set of local peers the tests' engines share, as the
// engines of one libtent.so do: they reach each other in-process.
var thisProcess = core.NewLocalPeers()

func newLocalEngine(t *testing.T, opts core.Options) *core.Engine {
	t.Helper()
	if opts.LocalPeers == nil {
		opts.LocalPeers = thisProcess
	}
	if opts.Transports == nil {
		opts.Transports = []string{"local"}
	}
	opts.Available = available()
	e, err := core.New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func wait(t *testing.T, b *core.Batch) (status.Code, []core.RequestStatus) {
	t.Helper()
	code, _ := b.Wait(10 * time.Second)
	st := make([]core.RequestStatus, b.Len())
	b.Status(st)
	return code, st
}

func TestLocalTransfer(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 1<<20, 0)
	dst, _ := buf(t, b, 1<<20, core.PermRemoteRead|core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)

	// WRITE a -> b, unaligned offsets, several requests.
	reqs := []core.TransferRequest{
		{Op: core.OpWrite, Local: host.Addr(src) + 1, Segment: seg, Remote: host.Addr(dst) + 3, Len: 1000},
		{Op: core.OpWrite, Local: host.Addr(src) + 5000, Segment: seg, Remote: host.Addr(dst) + 5000, Len: 1},
	}
	batch, err := a.Submit(reqs, core.TransferOptions{})
	require.NoError(t, err)
	code, st := wait(t, batch)
	require.Equal(t, status.OK, code)
	require.Equal(t, local.ID, st[0].Transport)
	require.EqualValues(t, 1000, st[0].Bytes)
	require.Equal(t, src[1:1001], dst[3:1003])
	require.Equal(t, src[5000], dst[5000])
	a.ReleaseBatch(batch)

	// READ b -> a.
	batch, err = a.Submit([]core.TransferRequest{
		{Op: core.OpRead, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 1 << 20},
	}, core.TransferOptions{})
	require.NoError(t, err)
	code, _ = wait(t, batch)
	require.Equal(t, status.OK, code)
	require.True(t, bytes.Equal(src, dst))
	a.ReleaseBatch(batch)
	require.NoError(t, a.CloseSegment(seg))
	require.ErrorIs(t, a.CloseSegment(seg), status.ErrInvalidHandle)
	st0 := a.Stats()
	require.Zero(t, st0.Batches)
	require.Zero(t, st0.RequestsInFlight)
	require.Zero(t, st0.Segments)
}

func TestTransferChecks(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	ro, _ := buf(t, b, 4096, core.PermRemoteRead)
	wo, _ := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	L := host.Addr(src)

	t.Run("local errors fail the call", func(t *testing.T) {
		closedSeg, err := a.OpenSegment(b.Name())
		require.NoError(t, err)
		require.NoError(t, a.CloseSegment(closedSeg))
		other := newLocalEngine(t, core.Options{})
		foreignSeg, err := other.OpenSegment(b.Name())
		require.NoError(t, err)
		tests := []struct {
			name string
			req  core.TransferRequest
			code status.Code
		}{
			{"bad op", core.TransferRequest{Op: 7, Local: L, Segment: seg, Remote: host.Addr(wo), Len: 1}, status.InvalidArgument},
			{"zero len", core.TransferRequest{Op: core.OpWrite, Local: L, Segment: seg, Remote: host.Addr(wo)}, status.InvalidArgument},
			{"null local", core.TransferRequest{Op: core.OpWrite, Segment: seg, Remote: host.Addr(wo), Len: 1}, status.InvalidArgument},
			{"unregistered local", core.TransferRequest{Op: core.OpWrite, Local: L + 4096, Segment: seg, Remote: host.Addr(wo), Len: 1}, status.NotRegistered},
			{"local overhang", core.TransferRequest{Op: core.OpWrite, Local: L + 4000, Segment: seg, Remote: host.Addr(wo), Len: 100}, status.OutOfRange},
			{"null segment", core.TransferRequest{Op: core.OpWrite, Local: L, Remote: host.Addr(wo), Len: 1}, status.InvalidHandle},
			{"closed segment", core.TransferRequest{Op: core.OpWrite, Local: L, Segment: closedSeg, Remote: host.Addr(wo), Len: 1}, status.InvalidHandle},
			{"foreign segment", core.TransferRequest{Op: core.OpWrite, Local: L, Segment: foreignSeg, Remote: host.Addr(wo), Len: 1}, status.InvalidHandle},
			{"remote overflow", core.TransferRequest{Op: core.OpWrite, Local: L, Segment: seg, Remote: ^uint64(0), Len: 2}, status.InvalidArgument},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				ok := core.TransferRequest{Op: core.OpWrite, Local: L, Segment: seg, Remote: host.Addr(wo), Len: 8}
				_, err := a.Submit([]core.TransferRequest{ok, tc.req}, core.TransferOptions{})
				require.Equal(t, tc.code, status.CodeOf(err), "%v", err)
				require.Contains(t, err.Error(), "request 1")
				st := a.Stats()
				require.Zero(t, st.Batches)
				require.Zero(t, st.RequestsInFlight)
			})
		}
		_, err = a.Submit(nil, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrInvalidArgument)
		_, err = a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: host.Addr(wo), Len: 1}},
			core.TransferOptions{Transport: "carrier-pigeon"})
		require.ErrorIs(t, err, status.ErrNotFound)
		// Nothing stays pinned: the local region unregisters at once.
		r2, err := a.Register(core.RegionDesc{Addr: L + 8192, Len: 1}, 0)
		require.NoError(t, err)
		require.NoError(t, a.Unregister(r2))
	})

	t.Run("remote errors are per request", func(t *testing.T) {
		before := append([]byte(nil), ro...)
		tests := []struct {
			name string
			req  core.TransferRequest
			code status.Code
		}{
			{"write to read-only", core.TransferRequest{Op: core.OpWrite, Local: L, Segment: seg, Remote: host.Addr(ro), Len: 8}, status.PermissionDenied},
			{"read from write-only", core.TransferRequest{Op: core.OpRead, Local: L, Segment: seg, Remote: host.Addr(wo), Len: 8}, status.PermissionDenied},
			{"past the end", core.TransferRequest{Op: core.OpRead, Local: L, Segment: seg, Remote: host.Addr(ro) + 4090, Len: 8}, status.OutOfRange},
			{"unregistered", core.TransferRequest{Op: core.OpRead, Local: L, Segment: seg, Remote: 0x1000, Len: 8}, status.NotRegistered},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				good := core.TransferRequest{Op: core.OpRead, Local: L + 100, Segment: seg, Remote: host.Addr(ro), Len: 8}
				batch, err := a.Submit([]core.TransferRequest{good, tc.req}, core.TransferOptions{})
				require.NoError(t, err)
				code, st := wait(t, batch)
				require.Equal(t, tc.code, code)
				require.Equal(t, status.OK, st[0].Code)
				require.Equal(t, tc.code, st[1].Code)
				_, _, err = batch.Status(nil)
				require.Contains(t, err.Error(), "request 1")
				a.ReleaseBatch(batch)
			})
		}
		require.Equal(t, before, ro, "nothing written to read-only memory")
	})
}

// A descriptor cached before the target unregistered must not lead to a
// write into that memory: the target checks every request itself.
func TestTargetEnforcesAfterUnregister(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, dr := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	require.NoError(t, b.Unregister(dr))
	before := append([]byte(nil), dst...)
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 64}}, core.TransferOptions{})
	require.NoError(t, err)
	code, _ := wait(t, batch)
	require.Equal(t, status.NotRegistered, code)
	require.Equal(t, before, dst)
}

func TestNotifications(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 64, 0)
	dst, _ := buf(t, b, 64, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)

	_, err = b.RecvNotification(0, func(core.Notification) bool { return true })
	require.ErrorIs(t, err, status.ErrTimeout)

	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 64}},
		core.TransferOptions{Notify: []byte("block 7 ready")})
	require.NoError(t, err)
	code, _ := wait(t, batch)
	require.Equal(t, status.OK, code)
	n, err := b.RecvNotification(time.Second, func(n core.Notification) bool { return len(n.Msg) <= 4 })
	require.NoError(t, err)
	require.Equal(t, "block 7 ready", string(n.Msg), "refused, so still queued")
	n, err = b.RecvNotification(time.Second, func(core.Notification) bool { return true })
	require.NoError(t, err)
	require.Equal(t, "block 7 ready", string(n.Msg))
	require.Equal(t, a.Name(), n.From)
	require.Equal(t, src, dst, "data arrived before the notification")

	require.NoError(t, a.SendNotification(seg, []byte("hi")))
	n, err = b.RecvNotification(time.Second, func(core.Notification) bool { return true })
	require.NoError(t, err)
	require.Equal(t, "hi", string(n.Msg))
	require.ErrorIs(t, a.SendNotification(seg, make([]byte, core.MaxNotifyLen+1)), status.ErrInvalidArgument)

	// A waiting receiver wakes up on arrival.
	got := make(chan string, 1)
	go func() {
		n, _ := b.RecvNotification(5*time.Second, func(core.Notification) bool { return true })
		got <- string(n.Msg)
	}()
	require.NoError(t, a.SendNotification(seg, []byte("wake")))
	require.Equal(t, "wake", <-got)
}

// fakeSetup returns an engine with a fake mover (and the local transport
// behind it), a peer segment and registered buffers.
func fakeSetup(t *testing.T, opts core.Options) (*core.Engine, *coretest.Mover, *core.Segment, uint64, uint64) {
	a := newLocalEngine(t, opts)
	m := coretest.NewMover("fake")
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(m))
	require.NoError(t, a.Install(localTransport()))
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite|core.PermRemoteRead)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	return a, m, seg, host.Addr(src), host.Addr(dst)
}

func TestDeadline(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{DefaultTimeout: 50 * time.Millisecond})
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	<-m.Entered()
	code, _ := batch.Wait(5 * time.Second)
	require.Equal(t, status.Timeout, code, "the deadline fails the request even though the mover holds it")
	// The mover still holds it, so the local memory stays pinned.
	require.Equal(t, 1, m.Held())
	require.EqualValues(t, 1, a.Stats().RequestsInFlight)
	select {
	case <-batch.Settled():
		t.Fatal("settled while the mover holds the request")
	default:
	}
	m.ReleaseAll()
	<-batch.Settled()
	code, _ = batch.Wait(0)
	require.Equal(t, status.Timeout, code, "a late completion does not change the outcome")
	require.Zero(t, a.Stats().RequestsInFlight)
}

func TestWaitTimeoutLeavesBatchValid(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	<-m.Entered()
	code, err := batch.Wait(10 * time.Millisecond)
	require.Equal(t, status.Timeout, code)
	require.Error(t, err)
	c, done, _ := batch.Status(nil)
	require.Equal(t, status.Pending, c)
	require.Zero(t, done)
	m.ReleaseAll()
	code, _ = batch.Wait(5 * time.Second)
	require.Equal(t, status.OK, code)
}

func TestRetryOnNextTransport(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.FailWith(status.Errorf(status.TransportError, "wire cut"))
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	code, st := wait(t, batch)
	require.Equal(t, status.OK, code)
	require.Equal(t, local.ID, st[0].Transport)
	require.Equal(t, core.FlagRetried, st[0].Flags&core.FlagRetried)

	// A failure that is not the transport's (permission, range) is final.
	m.FailWith(status.Errorf(status.PermissionDenied, "no"))
	batch, err = a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	code, st = wait(t, batch)
	require.Equal(t, status.PermissionDenied, code)
	require.Zero(t, st[0].Flags)
	require.Zero(t, a.Stats().RequestsInFlight)
}

func TestCancelAndUninstallInFlight(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	<-m.Entered()
	canceled := make(chan bool, 1)
	go func() { canceled <- batch.Cancel() }()
	// Cancel asked the mover to stop but it still holds the request, so
	// Cancel keeps waiting; uninstalling the transport fails it.
	require.Eventually(t, func() bool { return m.Canceled() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.Uninstall("fake"))
	require.True(t, <-canceled)
	code, _ := batch.Wait(0)
	require.Equal(t, status.Canceled, code)
	require.Zero(t, a.Stats().RequestsInFlight)
}

func TestCloseWithTransfersInFlight(t *testing.T) {
	a, m, seg, L, R := fakeSetup(t, core.Options{})
	m.Hold()
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	<-m.Entered()
	require.NoError(t, a.Close())
	code, _ := batch.Wait(time.Second)
	require.Equal(t, status.Closed, code)
	<-batch.Settled()
	_, err = a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: L, Segment: seg, Remote: R, Len: 8}}, core.TransferOptions{})
	require.Error(t, err)
	_, err = a.OpenSegment("x")
	require.ErrorIs(t, err, status.ErrClosed)
}

func TestAllocFree(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	r, err := a.Alloc(10000, "cpu", core.PermRemoteRead)
	require.NoError(t, err)
	require.NotNil(t, r.Alloc)
	require.GreaterOrEqual(t, r.Len, uint64(10000))
	require.GreaterOrEqual(t, r.Alloc.FD, 0)
	mem := host.Bytes(r.Addr, r.Len)
	mem[0], mem[r.Len-1] = 1, 2
	require.Equal(t, 1, a.Stats().Allocations)
	_, err = a.Register(core.RegionDesc{Addr: r.Addr + 16, Len: 16}, 0)
	require.ErrorIs(t, err, status.ErrOverlap)
	require.NoError(t, a.Free(r))
	require.Zero(t, a.Stats().Allocations)
	require.Error(t, a.Free(r))
	for _, bad := range []struct {
		size uint64
		loc  string
	}{{0, "cpu"}, {1 << 50, "cpu"}, {10, "tpu"}} {
		_, err := a.Alloc(bad.size, bad.loc, 0)
		require.ErrorIs(t, err, status.ErrInvalidArgument)
	}
	_, err = a.Alloc(10, "cpu", 0x10)
	require.ErrorIs(t, err, status.ErrInvalidArgument)
	// A region the caller registered is not the engine's to free.
	_, plain := buf(t, a, 64, 0)
	require.ErrorIs(t, a.Free(plain), status.ErrInvalidArgument)
}

// Memory registered and then unmapped behind the engine's back fails the
// request; it does not crash the process.
func TestUnmappedRegisteredMemory(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	page := 4096
	m, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	addr := host.Addr(m)
	_, err = b.Register(core.RegionDesc{Addr: addr, Len: uint64(page)}, core.PermRemoteWrite|core.PermRemoteRead)
	require.NoError(t, err)
	// PROT_NONE faults like an unmapped range, and unlike munmap it keeps
	// the addresses from being reused by the next mmap.
	require.NoError(t, unix.Mprotect(m, unix.PROT_NONE))
	defer unix.Munmap(m)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	for _, op := range []core.Op{core.OpWrite, core.OpRead} {
		batch, err := a.Submit([]core.TransferRequest{{Op: op, Local: host.Addr(src), Segment: seg, Remote: addr, Len: 64}}, core.TransferOptions{})
		require.NoError(t, err)
		code, _ := wait(t, batch)
		require.Equal(t, status.InvalidArgument, code)
		_, _, err = batch.Status(nil)
		require.Contains(t, err.Error(), "not mapped")
	}
}

// doubleDone reports every request done twice, like a buggy transport.
type doubleDone struct{ *coretest.Mover }

func (m doubleDone) Submit(reqs []*core.Request) {
	for _, r := range reqs {
		r.Done(r.Len, nil)
		r.Done(r.Len, nil)
	}
}

// A completion reported twice is ignored and counted, in the engine whose
// request it was only.
func TestDuplicateCompletionsArePerEngine(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(doubleDone{coretest.NewMover("twice")}))
	other := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	batch, err := a.Submit([]core.TransferRequest{
		{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 8},
		{Op: core.OpWrite, Local: host.Addr(src) + 8, Segment: seg, Remote: host.Addr(dst) + 8, Len: 8},
	}, core.TransferOptions{})
	require.NoError(t, err)
	code, err := batch.Wait(5 * time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	a.ReleaseBatch(batch)
	require.EqualValues(t, 2, a.Stats().DuplicateCompletions)
	require.Zero(t, other.Stats().DuplicateCompletions)
	require.Zero(t, b.Stats().DuplicateCompletions)
}
