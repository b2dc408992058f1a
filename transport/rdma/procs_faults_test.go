package rdma

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
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
)

// requireNothingRegistered checks the engine kept no region or
// reservation and the fake holds no MR.
func requireNothingRegistered(t *testing.T, e *core.Engine, f *fake) {
	t.Helper()
	st := e.Stats()
	require.Zero(t, st.Regions)
	require.Zero(t, st.Reservations)
	require.Zero(t, f.counts(t).MRs, "every MR of the failed batch was deregistered")
}

// A registration that fails on the second NIC deregisters the first
// NIC's MRs (and those of the batch's earlier regions), and the engine
// releases the reservation.
func TestProcessesRegMRFailureOnSecondNICRollsBack(t *testing.T) {
	f := useFake(t, "fake0,fake1")
	t.Setenv("FAKEVERBS_FAIL", "ibv_reg_mr:dev=fake1")
	e, _ := newProcEngine(t, false)
	bufs := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	_, err := e.RegisterBatch([]core.RegionDesc{
		{Addr: host.Addr(bufs[0]), Len: 4096}, {Addr: host.Addr(bufs[1]), Len: 4096}}, rw)
	require.ErrorIs(t, err, status.ErrTransport)
	require.ErrorContains(t, err, "fake1")
	requireNothingRegistered(t, e, f)
	require.NoError(t, e.Uninstall(Name))
	f.requireNoObjects(t)
}

// A panic in the middle of a registration batch (NIC 1 of the second
// region) leaves no MR behind either.
func TestProcessesRegMRPanicRollsBack(t *testing.T) {
	f := useFake(t, "fake0,fake1")
	e, tr := newProcEngine(t, false)
	calls := 0
	tr.opts.beforeRegMR = func(nic int) {
		if calls++; calls == 4 {
			panic("injected in the middle of a batch")
		}
	}
	bufs := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	_, err := e.RegisterBatch([]core.RegionDesc{
		{Addr: host.Addr(bufs[0]), Len: 4096}, {Addr: host.Addr(bufs[1]), Len: 4096}}, rw)
	require.ErrorIs(t, err, status.ErrInternal)
	requireNothingRegistered(t, e, f)
	require.Zero(t, tr.Stats()["mrs"])
}

// A queue pair that cannot reach RTS fails its requests with a transport
// error: pinned to rdma they fail, otherwise core retries them on tcp. No
// queue pair is left behind.
func TestProcessesModifyQPToRTSFailure(t *testing.T) {
	f := useFake(t, "fake0")
	const n = 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: n, Perm: rw})
	// The peer started with a clean fake; only this process fails RTS.
	t.Setenv("FAKEVERBS_FAIL", "ibv_modify_qp:state=RTS")
	e, tr := newProcEngine(t, true)
	src, _ := localBuf(t, e, n)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: p.Buffers[0].Addr, Len: n}}

	code, _, err := run(t, e, req, core.TransferOptions{Transport: Name})
	require.Equal(t, status.TransportError, code)
	require.ErrorContains(t, err, "ibv_modify_qp")

	code, st, _ := run(t, e, req, core.TransferOptions{})
	require.Equal(t, status.OK, code)
	require.EqualValues(t, tcp.ID, st[0].Transport, "retried on tcp")
	require.NotZero(t, st[0].Flags&core.FlagRetried)
	require.Equal(t, peertest.Sum(src), sum(t, p, 0))
	require.Eventually(t, func() bool { return tr.Stats()["qps"] == 0 }, 10*time.Second, time.Millisecond)
	require.Zero(t, f.counts(t).QPs)
}

// writes builds k writes of size each from src to the peer's buffer 0.
func writes(src []byte, seg *core.Segment, remote uint64, k, size int) []core.TransferRequest {
	var reqs []core.TransferRequest
	for i := range k {
		reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i*size), Segment: seg,
			Remote: remote + uint64(i*size), Len: uint64(size)})
	}
	return reqs
}

// A completion error in the middle of a batch fails the requests of that
// queue pair, core retries them on tcp, every byte still arrives, and the
// next batch runs on a rebuilt queue pair.
func TestProcessesCQErrorMidBatch(t *testing.T) {
	f := useFake(t, "fake0")
	const k, size = 32, 16 << 10
	p := startPeer(t, f, peertest.Buffer{Size: k * size, Perm: rw})
	t.Setenv("FAKEVERBS_FAIL", "cq:error_after=5")
	e, tr := newProcEngine(t, true)
	src, _ := localBuf(t, e, k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)

	code, st, _ := run(t, e, writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	retried := 0
	for _, s := range st {
		if s.Flags&core.FlagRetried != 0 {
			retried++
			require.EqualValues(t, tcp.ID, s.Transport)
		}
	}
	require.Positive(t, retried, "the failed completions were retried")
	require.Less(t, retried, k, "the completions before the error succeeded on rdma")
	require.Equal(t, peertest.Sum(src), sum(t, p, 0))

	t.Setenv("FAKEVERBS_FAIL", "")
	code, st, _ = run(t, e, writes(src, seg, p.Buffers[0].Addr, 4, size), core.TransferOptions{Transport: Name})
	require.Equal(t, status.OK, code, "a rebuilt queue pair serves again: %+v", st)
	_ = tr
}

// A queue pair forced into the error state while requests are on the NIC
// fails them (they are retried on tcp), is torn down and rebuilt with a
// new queue pair number, and the next batch pinned to rdma runs on it; no
// data is lost and nothing leaks.
func TestProcessesQPToErrorUnderLoad(t *testing.T) {
	f := useFake(t, "fake0")
	const k, size = 64, 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: k * size, Perm: rw})
	e, tr := newProcEngine(t, true)
	src, _ := localBuf(t, e, k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	code, _, _ := run(t, e, writes(src, seg, p.Buffers[0].Addr, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	victim := onlyQP(t, tr)
	oldQPN := qpNum(victim)

	// The work stays on the (fake) NIC until its queue pair goes to error.
	t.Setenv("FAKEVERBS_FAIL", "qp:hold_after=0")
	b, err := e.Submit(writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{})
	require.NoError(t, err)
	defer e.ReleaseBatch(b)
	require.Eventually(t, func() bool { return tr.Stats()["inflight"] == k }, 20*time.Second, time.Millisecond)
	t.Setenv("FAKEVERBS_FAIL", "")
	victim.nic.mu.Lock()
	vqp := victim.qp
	victim.nic.mu.Unlock()
	require.NoError(t, vqp.ToError(), "the NIC moves the queue pair to error under load")
	code, _ = b.Wait(30 * time.Second)
	require.Equal(t, status.OK, code, "the flushed work was retried on tcp")
	st := make([]core.RequestStatus, k)
	b.Status(st)
	for i, s := range st {
		require.EqualValues(t, tcp.ID, s.Transport, "request %d", i)
		require.NotZero(t, s.Flags&core.FlagRetried, "request %d", i)
	}
	require.Equal(t, peertest.Sum(src), sum(t, p, 0))

	_, _ = rand.Read(src) // new bytes, so the sum below shows rdma wrote them
	code, st, err = run(t, e, writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{Transport: Name})
	require.Equal(t, status.OK, code, "the next batch runs on a rebuilt queue pair: %v", err)
	for i, s := range st {
		require.EqualValues(t, ID, s.Transport, "request %d served by rdma", i)
		require.Zero(t, s.Flags&core.FlagRetried, "request %d", i)
	}
	require.Equal(t, peertest.Sum(src), sum(t, p, 0), "rdma wrote every byte")
	fresh := onlyQP(t, tr)
	require.NotSame(t, victim, fresh, "a new queue pair replaced the broken one")
	require.NotEqual(t, oldQPN, qpNum(fresh), "with a new queue pair number")
	require.EqualValues(t, 1, f.counts(t).QPs, "the broken queue pair was destroyed")
	require.NoError(t, e.Uninstall(Name))
	f.requireNoObjects(t)
}

// onlyQP is the transport's one initiator queue pair.
func onlyQP(t *testing.T, tr *Transport) *queuePair {
	t.Helper()
	qps := tr.queuePairs()
	require.Len(t, qps, 1)
	return qps[0]
}

// qpNum is a ready queue pair's number.
func qpNum(qp *queuePair) uint32 {
	qp.nic.mu.Lock()
	defer qp.nic.mu.Unlock()
	if qp.qp == nil {
		return 0
	}
	return qp.qp.Num()
}

// breakByCQError breaks the transport's queue pair with a completion error
// on an unpinned batch (retried on tcp) and returns the broken one.
func breakByCQError(t *testing.T, e *core.Engine, tr *Transport, reqs []core.TransferRequest) *queuePair {
	t.Helper()
	t.Setenv("FAKEVERBS_FAIL", "cq:error_after=0")
	code, st, _ := run(t, e, reqs, core.TransferOptions{})
	require.Equal(t, status.OK, code)
	require.EqualValues(t, tcp.ID, st[0].Transport, "the failed request was retried on tcp")
	t.Setenv("FAKEVERBS_FAIL", "")
	broken := onlyQP(t, tr)
	broken.nic.mu.Lock()
	defer broken.nic.mu.Unlock()
	require.Equal(t, qpBroken, broken.state)
	return broken
}

// Batches submitted while a broken queue pair is being rebuilt wait for
// the new one (they neither fail nor start a second rebuild) and all run
// on it once it connects. The rebuild is held inside ibv_create_qp by the
// fake, so the submissions land in the middle of it.
func TestProcessesRebuildRacesSubmissions(t *testing.T) {
	f := useFake(t, "fake0")
	const k, size = 8, 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: 3 * k * size, Perm: rw})
	e, tr := newProcEngine(t, true)
	src, _ := localBuf(t, e, 3*k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	remote := p.Buffers[0].Addr
	code, _, _ := run(t, e, writes(src, seg, remote, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	broken := breakByCQError(t, e, tr, writes(src, seg, remote, 1, size))
	require.Eventually(t, func() bool { return f.counts(t).QPs == 0 }, 10*time.Second, time.Millisecond)

	gate := filepath.Join(t.TempDir(), "create_qp")
	require.NoError(t, syscall.Mkfifo(gate, 0o600))
	t.Setenv("FAKEVERBS_FAIL", "ibv_create_qp:block="+gate)
	var batches []*core.Batch
	submit := func(i int) {
		reqs := writes(src[i*k*size:], seg, remote+uint64(i*k*size), k, size)
		b, err := e.Submit(reqs, core.TransferOptions{Transport: Name})
		require.NoError(t, err)
		t.Cleanup(func() { e.ReleaseBatch(b) })
		batches = append(batches, b)
	}
	submit(0)
	// Opening the gate returns once the rebuild waits inside ibv_create_qp.
	w, err := os.OpenFile(gate, os.O_WRONLY, 0)
	require.NoError(t, err)
	// Closing the gate lets the rebuild go on if the test stops early.
	t.Cleanup(func() { _ = w.Close() })
	t.Setenv("FAKEVERBS_FAIL", "")
	submit(1)
	submit(2)
	rebuilding := onlyQP(t, tr)
	require.NotSame(t, broken, rebuilding)
	rebuilding.nic.mu.Lock()
	require.Equal(t, qpConnecting, rebuilding.state)
	require.Len(t, rebuilding.queue, 3*k, "the three batches wait on the queue pair being built")
	rebuilding.nic.mu.Unlock()
	for _, b := range batches {
		code, done, _ := b.Status(nil)
		require.Equal(t, status.Pending, code)
		require.Zero(t, done, "no request finished while the queue pair is being built")
	}

	_, err = w.Write([]byte{1})
	require.NoError(t, err)
	for i, b := range batches {
		code, _ := b.Wait(30 * time.Second)
		require.Equal(t, status.OK, code, "batch %d", i)
		st := make([]core.RequestStatus, k)
		b.Status(st)
		for j, s := range st {
			require.EqualValues(t, ID, s.Transport, "batch %d request %d", i, j)
		}
	}
	require.Equal(t, peertest.Sum(src), sum(t, p, 0))
	require.Same(t, rebuilding, onlyQP(t, tr), "one rebuild served them all")
	require.EqualValues(t, 1, f.counts(t).QPs)
	require.NoError(t, e.Uninstall(Name))
	f.requireNoObjects(t)
}

// A queue pair that breaks between a submission's lookup and its enqueue
// (the poller saw its error meanwhile) never had that work: the work goes
// to the queue pair rebuilt in its place, and a batch pinned to rdma
// succeeds.
func TestProcessesBreakBetweenLookupAndEnqueue(t *testing.T) {
	f := useFake(t, "fake0")
	const k, size = 4, 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: k * size, Perm: rw})
	e, tr := newProcEngine(t, true)
	src, _ := localBuf(t, e, k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	code, _, _ := run(t, e, writes(src, seg, p.Buffers[0].Addr, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	victim := onlyQP(t, tr)
	var hooked atomic.Int32
	tr.opts.beforeEnqueue = func(qp *queuePair) {
		if qp == victim && hooked.Add(1) == 1 {
			tr.breakQP(qp, status.Errorf(status.TransportError, "broken between lookup and enqueue"))
		}
	}
	code, st, err := run(t, e, writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{Transport: Name})
	require.Equal(t, status.OK, code, "%v", err)
	require.EqualValues(t, 1, hooked.Load(), "the break landed between lookup and enqueue")
	for i, s := range st {
		require.EqualValues(t, ID, s.Transport, "request %d", i)
	}
	require.Equal(t, peertest.Sum(src), sum(t, p, 0))
	require.NotSame(t, victim, onlyQP(t, tr))
	require.NoError(t, e.Uninstall(Name))
	f.requireNoObjects(t)
}

// Uninstalling rdma while batches stream over it fails or finishes every
// request (none hangs), and every verbs object is destroyed.
func TestProcessesUninstallUnderLoad(t *testing.T) {
	f := useFake(t, "fake0,fake1")
	const k, size = 16, 256 << 10
	p := startPeer(t, f, peertest.Buffer{Size: k * size, Perm: rw})
	e, tr := newProcEngine(t, false)
	src, _ := localBuf(t, e, k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	var stop atomic.Bool
	var served atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				b, err := e.Submit(writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{Timeout: 10 * time.Second})
				if err != nil {
					return // rdma is gone: nothing left to move data
				}
				code, _ := b.Wait(20 * time.Second)
				e.ReleaseBatch(b)
				switch code {
				case status.OK:
					served.Add(1)
				case status.Closed, status.TransportError, status.NotFound, status.Unsupported:
				default:
					t.Errorf("batch ended with %v", code)
				}
				if code == status.Pending {
					t.Error("a batch hung past its deadline")
					return
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return served.Load() >= 3 }, 20*time.Second, time.Millisecond)
	require.NoError(t, e.Uninstall(Name))
	stop.Store(true)
	wg.Wait()
	st := tr.Stats()
	for _, key := range []string{"qps", "target_qps", "mrs", "inflight", "nics", "regions"} {
		require.Zero(t, st[key], key)
	}
	f.requireNoObjects(t)
}

// After the peer unregisters a region, its old rkey is dead at the NIC:
// a work request with it, sent past every check of core, is refused.
func TestProcessesRevokedKeyRefusedAtNIC(t *testing.T) {
	f := useFake(t, "fake0")
	const n = 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: n, Perm: rw})
	e, tr := newProcEngine(t, false)
	src, local := localBuf(t, e, n)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	remote := p.Buffers[0].Addr
	code, _, _ := run(t, e, writes(src, seg, remote, 1, n), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	keys, err := remoteKeys(ptr(peerRegion(t, seg, remote)))
	require.NoError(t, err)
	rkey := keys[0].RKey

	require.NoError(t, postRawProc(t, tr, seg, opWrite, local, remote, rkey, 4096), "the key works while registered")
	_, err = p.Cmd("fill 0 3")
	require.NoError(t, err)
	_, err = p.Cmd("unregister 0")
	require.NoError(t, err)
	err = postRawProc(t, tr, seg, opWrite, local, remote, rkey, 4096)
	require.ErrorIs(t, err, status.ErrPermissionDenied, "the NIC refuses the revoked key")
	err = postRawProc(t, tr, seg, opRead, local, remote, rkey, 4096)
	require.ErrorIs(t, err, status.ErrPermissionDenied)
	require.Equal(t, peertest.Sum(peertest.Pattern(3, n)), sum(t, p, 0), "the peer's memory is untouched")
}

// A read-only region's key carries no remote write: core refuses the
// write before any transport sees it, and sent anyway, the NIC refuses
// it; reads work.
func TestProcessesReadOnlyRegionRefusesWriteAtNIC(t *testing.T) {
	f := useFake(t, "fake0")
	const n = 64 << 10
	p := startPeer(t, f, peertest.Buffer{Size: n, Perm: core.PermRemoteRead})
	e, tr := newProcEngine(t, false)
	src, local := localBuf(t, e, n)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	remote := p.Buffers[0].Addr
	before := sum(t, p, 0)

	code, st, _ := run(t, e, writes(src, seg, remote, 1, n), core.TransferOptions{})
	require.Equal(t, status.PermissionDenied, code)
	require.Equal(t, core.TransportNone, st[0].Transport, "refused before any transport")

	keys, err := remoteKeys(ptr(peerRegion(t, seg, remote)))
	require.NoError(t, err)
	err = postRawProc(t, tr, seg, opWrite, local, remote, keys[0].RKey, n)
	require.ErrorIs(t, err, status.ErrPermissionDenied)
	require.Equal(t, before, sum(t, p, 0), "not one byte written")
	require.NoError(t, postRawProc(t, tr, seg, opRead, local, remote, keys[0].RKey, n))
	require.True(t, bytes.Equal(peertest.Pattern(0, n), src), "read what the peer holds")
}

// A peer killed in the middle of a batch fails the batch within its
// deadline; nothing hangs, and the queue pairs to it are torn down.
func TestPeerKilledMidBatch(t *testing.T) {
	f := useFake(t, "fake0")
	const k, size = 64, 1 << 20
	p := startPeer(t, f, peertest.Buffer{Size: k * size, Perm: rw})
	e, tr := newProcEngine(t, false)
	src, _ := localBuf(t, e, k*size)
	seg, err := e.OpenSegment(p.Name)
	require.NoError(t, err)
	code, _, _ := run(t, e, writes(src, seg, p.Buffers[0].Addr, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)

	const timeout = 5 * time.Second
	start := time.Now()
	var codes []status.Code
	for range 4 {
		b, err := e.Submit(writes(src, seg, p.Buffers[0].Addr, k, size), core.TransferOptions{Timeout: timeout})
		require.NoError(t, err)
		if len(codes) == 1 {
			p.Kill()
		}
		code, _ := b.Wait(timeout + 5*time.Second)
		e.ReleaseBatch(b)
		codes = append(codes, code)
	}
	require.NotEqual(t, status.OK, codes[len(codes)-1], "a batch to a dead peer fails: %v", codes)
	require.NotContains(t, codes, status.Pending, "no batch hangs")
	require.Less(t, time.Since(start), 4*timeout, "each batch ended within its deadline")
	require.Eventually(t, func() bool { return tr.Stats()["qps"] == 0 && tr.Stats()["inflight"] == 0 },
		10*time.Second, time.Millisecond)
}
