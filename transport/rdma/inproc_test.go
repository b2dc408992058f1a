package rdma

import (
	"bytes"
	"crypto/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

const rw = core.PermRemoteRead | core.PermRemoteWrite

// pair is two engines on one in-process fabric: a initiates, b is the
// target.
type pair struct {
	f      *fabric
	a, b   *core.Engine
	ta, tb *Transport
	seg    *core.Segment // b, opened by a
}

func newPair(t *testing.T, withTCP bool, devices ...string) *pair {
	t.Helper()
	return newPairWith(t, core.Options{}, withTCP, devices...)
}

// newPairWith is newPair with both engines made from opts (their limits).
func newPairWith(t *testing.T, opts core.Options, withTCP bool, devices ...string) *pair {
	t.Helper()
	p := &pair{f: newFabric(devices...)}
	names := []string{Name}
	if withTCP {
		names = append(names, tcp.Name)
	}
	mk := func() (*core.Engine, *Transport) {
		o := opts
		o.Available = []core.TransportSpec{Spec(Options{open: p.f.open}), tcp.Spec(tcp.Options{})}
		o.Transports = names
		e, err := core.New(o)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		for _, tr := range e.Transports() {
			if r, ok := tr.(*Transport); ok {
				return e, r
			}
		}
		t.Fatalf("rdma not installed: %v", e.Stats().Unavailable)
		return nil, nil
	}
	p.a, p.ta = mk()
	p.b, p.tb = mk()
	seg, err := p.a.OpenSegment(p.b.Name())
	require.NoError(t, err)
	p.seg = seg
	return p
}

// buf registers n random bytes of the Go heap with e.
func buf(t *testing.T, e *core.Engine, n int, perm core.Perm) ([]byte, *core.Region) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, perm)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(b) })
	return b, r
}

// run submits reqs and waits for every request's final status.
func run(t *testing.T, e *core.Engine, reqs []core.TransferRequest, o core.TransferOptions) (status.Code, []core.RequestStatus, error) {
	t.Helper()
	b, err := e.Submit(reqs, o)
	require.NoError(t, err)
	defer e.ReleaseBatch(b)
	code, _ := b.Wait(time.Until(b.Deadline()) + 5*time.Second)
	st := make([]core.RequestStatus, b.Len())
	_, done, err := b.Status(st)
	require.Equal(t, b.Len(), done, "requests still pending long after the deadline")
	return code, st, err
}

// ops builds k requests of size each between src and dst at equal offsets.
func ops(op core.Op, src []byte, seg *core.Segment, dst []byte, k, size int) []core.TransferRequest {
	var reqs []core.TransferRequest
	for i := range k {
		reqs = append(reqs, core.TransferRequest{Op: op, Local: host.Addr(src) + uint64(i*size), Segment: seg,
			Remote: host.Addr(dst) + uint64(i*size), Len: uint64(size)})
	}
	return reqs
}

func (p *pair) uninstall(t *testing.T) {
	t.Helper()
	require.NoError(t, p.a.Uninstall(Name))
	require.NoError(t, p.b.Uninstall(Name))
	require.Equal(t, fabricCounts{}, p.f.counts(), "verbs objects left behind")
}

// peerKeys are the rkeys b publishes for the region at addr.
func (p *pair) peerKeys(t *testing.T, addr uint64) []remoteKey {
	t.Helper()
	d, err := p.b.Descriptor()
	require.NoError(t, err)
	for _, r := range d.Regions {
		if r.Addr == addr {
			keys, err := remoteKeys(&r)
			require.NoError(t, err)
			return keys
		}
	}
	t.Fatalf("no region at %#x", addr)
	return nil
}

// postRaw posts one work request from a's NIC 0 straight to b's NIC 0,
// past every check core makes: how a test asks the NIC itself what a key
// allows.
func (p *pair) postRaw(t *testing.T, op opcode, local *core.Region, remote uint64, rkey uint32, n uint32) error {
	t.Helper()
	d, err := p.b.Descriptor()
	require.NoError(t, err)
	key, addr := connKey{peer: d.Name, incarnation: d.Incarnation}, endpointOf(d)
	got := make(chan error, 1)
	pend := &pending{done: func(_ uint64, err error) { got <- err }}
	pend.left.Store(1)
	p.ta.post(key, addr, time.Now().Add(10*time.Second), []*workRequest{{req: pend, deadline: time.Now().Add(10 * time.Second), wr: sendWR{
		ID: p.ta.ids.Add(1), Op: op, LocalAddr: local.Addr, Length: n, LKey: p.ta.lkeys(local)[0],
		RemoteAddr: remote, RKey: rkey, Signaled: true}}})
	select {
	case err := <-got:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("raw work request never completed")
		return nil
	}
}

func TestTransfersOverOneAndTwoNICs(t *testing.T) {
	for _, devs := range [][]string{{"fake0"}, {"fake0", "fake1"}} {
		t.Run(devs[len(devs)-1], func(t *testing.T) {
			p := newPair(t, false, devs...)
			const n = 8 << 20
			src, _ := buf(t, p.a, n, 0)
			dst, _ := buf(t, p.b, n, rw)
			code, st, err := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, n), core.TransferOptions{})
			require.NoError(t, err)
			require.Equal(t, status.OK, code)
			require.Equal(t, core.RequestStatus{Code: status.OK, Transport: ID, Bytes: n, Flags: core.FlagNIC,
				NIC: st[0].NIC, NICs: uint16(len(devs))}, st[0])
			require.True(t, bytes.Equal(src, dst))

			_, _ = rand.Read(dst)
			code, _, _ = run(t, p.a, ops(core.OpRead, src, p.seg, dst, 1, n), core.TransferOptions{})
			require.Equal(t, status.OK, code)
			require.True(t, bytes.Equal(src, dst))
			for _, d := range devs {
				require.Positive(t, p.ta.Stats()["nic."+d+".bytes"], "8 MiB striped over %s too", d)
			}

			const small = 4 << 10
			_, _ = rand.Read(src[:32*small])
			posts := p.ta.Stats()["posts"]
			code, st, _ = run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 32, small), core.TransferOptions{})
			require.Equal(t, status.OK, code)
			for _, s := range st {
				require.EqualValues(t, ID, s.Transport)
			}
			require.LessOrEqual(t, p.ta.Stats()["posts"]-posts, int64(len(devs)), "one chained post per queue pair")
			require.True(t, bytes.Equal(src, dst))
			p.uninstall(t)
		})
	}
}

func TestRegMRFailureOnSecondNICRollsBack(t *testing.T) {
	p := newPair(t, false, "fake0", "fake1")
	p.f.set(func(f *fabric) { f.failRegMR = "fake1" })
	before := p.f.counts().MRs
	b1, b2 := make([]byte, 4096), make([]byte, 4096)
	_, err := p.a.RegisterBatch([]core.RegionDesc{{Addr: host.Addr(b1), Len: 4096}, {Addr: host.Addr(b2), Len: 4096}}, rw)
	require.ErrorIs(t, err, status.ErrTransport)
	require.ErrorContains(t, err, "fake1")
	require.Equal(t, before, p.f.counts().MRs, "the MRs made on fake0 were deregistered")
	st := p.a.Stats()
	require.Zero(t, st.Regions)
	require.Zero(t, st.Reservations)
	require.Zero(t, p.ta.Stats()["mrs"])
	p.uninstall(t)
}

func TestRegMRPanicRollsBack(t *testing.T) {
	p := newPair(t, false, "fake0", "fake1")
	calls := 0
	p.ta.opts.beforeRegMR = func(int) {
		if calls++; calls == 4 {
			panic("injected on NIC 1 of the second region")
		}
	}
	b1, b2 := make([]byte, 4096), make([]byte, 4096)
	_, err := p.a.RegisterBatch([]core.RegionDesc{{Addr: host.Addr(b1), Len: 4096}, {Addr: host.Addr(b2), Len: 4096}}, rw)
	require.ErrorIs(t, err, status.ErrInternal)
	require.Zero(t, p.f.counts().MRs)
	require.Zero(t, p.a.Stats().Regions)
	require.Zero(t, p.a.Stats().Reservations)
	p.uninstall(t)
}

func TestModifyQPToRTSFailure(t *testing.T) {
	p := newPair(t, true, "fake0")
	const n = 64 << 10
	src, _ := buf(t, p.a, n, 0)
	dst, _ := buf(t, p.b, n, rw)
	p.f.set(func(f *fabric) { f.failRTS = true })
	code, _, err := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, n), core.TransferOptions{Transport: Name})
	require.Equal(t, status.TransportError, code)
	require.ErrorContains(t, err, "ibv_modify_qp(RTS)")
	code, st, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, n), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	require.EqualValues(t, tcp.ID, st[0].Transport, "retried on tcp")
	require.NotZero(t, st[0].Flags&core.FlagRetried)
	// (The bytes tcp moved are not compared here: its target writes them
	// on a goroutine the race detector cannot order with this one. The
	// two-process tests check them.)
	require.Eventually(t, func() bool { return p.f.counts().QPs == 0 }, 10*time.Second, time.Millisecond,
		"no queue pair left on either side")
	p.uninstall(t)
}

func TestCQErrorMidBatch(t *testing.T) {
	p := newPair(t, true, "fake0")
	const k, size = 32, 16 << 10
	src, _ := buf(t, p.a, k*size, 0)
	dst, _ := buf(t, p.b, k*size, rw)
	code, _, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code) // the queue pair exists: the batch below is posted as one chain
	_, _ = rand.Read(src)
	p.f.set(func(f *fabric) { f.errorAfter, f.completions = 5, 0 })
	code, st, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, k, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	retried := 0
	for _, s := range st {
		if s.Flags&core.FlagRetried != 0 {
			retried++
			require.EqualValues(t, tcp.ID, s.Transport)
		}
	}
	require.Equal(t, k-5, retried, "the 6th completion failed; it and the rest of the queue pair's work went to tcp")
	require.True(t, bytes.Equal(src[:5*size], dst[:5*size]), "what rdma completed arrived")
	// Into fresh memory: tcp's target wrote dst on a goroutine the race
	// detector cannot order with the fabric's copies.
	fresh, _ := buf(t, p.b, k*size, rw)
	code, _, _ = run(t, p.a, ops(core.OpWrite, src, p.seg, fresh, 4, size), core.TransferOptions{Transport: Name})
	require.Equal(t, status.OK, code, "a rebuilt queue pair serves again")
	p.uninstall(t)
}

// initiatorQP is a's only queue pair.
func (p *pair) initiatorQP(t *testing.T) *queuePair {
	t.Helper()
	qps := p.ta.queuePairs()
	require.Len(t, qps, 1)
	return qps[0]
}

func TestQPToErrorUnderLoad(t *testing.T) {
	p := newPair(t, true, "fake0")
	const k, size = 64, 64 << 10
	src, _ := buf(t, p.a, k*size, 0)
	dst, _ := buf(t, p.b, k*size, rw)
	code, _, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	victim := p.initiatorQP(t)
	// Work stays on the NIC until the queue pair goes to error.
	p.f.set(func(f *fabric) { f.hang = true })
	b, err := p.a.Submit(ops(core.OpWrite, src, p.seg, dst, k, size), core.TransferOptions{})
	require.NoError(t, err)
	defer p.a.ReleaseBatch(b)
	require.Eventually(t, func() bool { return p.ta.Stats()["inflight"] == k }, 10*time.Second, time.Millisecond)
	p.f.set(func(f *fabric) { f.hang = false })
	victim.nic.mu.Lock()
	vqp := victim.qp
	victim.nic.mu.Unlock()
	require.NoError(t, vqp.ToError())
	code, _ = b.Wait(30 * time.Second)
	require.Equal(t, status.OK, code, "the flushed work was retried on tcp")
	st := make([]core.RequestStatus, k)
	b.Status(st)
	for _, s := range st {
		require.EqualValues(t, tcp.ID, s.Transport)
	}
	fresh, _ := buf(t, p.b, k*size, rw) // tcp wrote dst (see TestCQErrorMidBatch)
	code, _, _ = run(t, p.a, ops(core.OpWrite, src, p.seg, fresh, 2, size), core.TransferOptions{Transport: Name})
	require.Equal(t, status.OK, code)
	require.NotSame(t, victim, p.initiatorQP(t), "a new queue pair replaced the broken one")
	p.uninstall(t)
}

// Work the NIC never completes fails at its deadline.
func TestDeadlineOnStuckWork(t *testing.T) {
	p := newPair(t, false, "fake0")
	src, _ := buf(t, p.a, 1<<20, 0)
	dst, _ := buf(t, p.b, 1<<20, rw)
	code, _, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, 4096), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	p.f.set(func(f *fabric) { f.hang = true })
	start := time.Now()
	code, _, err := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 8, 4096), core.TransferOptions{Timeout: 300 * time.Millisecond})
	require.Equal(t, status.Timeout, code, "%v", err)
	require.Less(t, time.Since(start), 5*time.Second)
	p.f.set(func(f *fabric) { f.hang = false })
	require.Eventually(t, func() bool { return p.ta.Stats()["qps"] == 0 }, 10*time.Second, time.Millisecond)
	p.uninstall(t)
}

func TestUninstallUnderLoad(t *testing.T) {
	p := newPair(t, false, "fake0", "fake1")
	const k, size = 16, 256 << 10
	src, _ := buf(t, p.a, k*size, 0)
	dst, _ := buf(t, p.b, k*size, rw)
	var stop atomic.Bool
	var served atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				b, err := p.a.Submit(ops(core.OpWrite, src, p.seg, dst, k, size), core.TransferOptions{Timeout: 10 * time.Second})
				if err != nil {
					return // rdma is gone
				}
				code, _ := b.Wait(20 * time.Second)
				p.a.ReleaseBatch(b)
				switch code {
				case status.OK:
					served.Add(1)
				case status.Closed, status.TransportError, status.Unsupported: // failed by the uninstall, or nothing left to serve
				default:
					t.Errorf("batch ended with %v", code)
					return
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return served.Load() >= 3 }, 20*time.Second, time.Millisecond)
	require.NoError(t, p.a.Uninstall(Name))
	stop.Store(true)
	wg.Wait()
	st := p.ta.Stats()
	for _, key := range []string{"qps", "target_qps", "mrs", "inflight", "nics", "regions"} {
		require.Zero(t, st[key], key)
	}
	require.Eventually(t, func() bool { return p.tb.Stats()["target_qps"] == 0 }, 10*time.Second, time.Millisecond,
		"the target destroyed its queue pairs when the connections closed")
	require.NoError(t, p.b.Uninstall(Name))
	require.Equal(t, fabricCounts{}, p.f.counts())
}

func TestRevokedKeyRefusedAtNIC(t *testing.T) {
	p := newPair(t, false, "fake0")
	const n = 64 << 10
	_, local := buf(t, p.a, n, 0)
	dst, remote := buf(t, p.b, n, rw)
	rkey := p.peerKeys(t, remote.Addr)[0].RKey
	require.NoError(t, p.postRaw(t, opWrite, local, remote.Addr, rkey, 4096), "the key works while registered")
	_, _ = rand.Read(dst)
	before := bytes.Clone(dst)
	require.NoError(t, p.b.Unregister(remote))
	err := p.postRaw(t, opWrite, local, remote.Addr, rkey, 4096)
	require.ErrorIs(t, err, status.ErrPermissionDenied, "the NIC refuses the revoked key")
	require.ErrorIs(t, p.postRaw(t, opRead, local, remote.Addr, rkey, 4096), status.ErrPermissionDenied)
	require.Equal(t, before, dst, "the memory is untouched")
	p.uninstall(t)
}

func TestReadOnlyRegionRefusesWriteAtNIC(t *testing.T) {
	p := newPair(t, false, "fake0")
	const n = 64 << 10
	src, local := buf(t, p.a, n, 0)
	dst, remote := buf(t, p.b, n, core.PermRemoteRead)
	before := bytes.Clone(dst)
	code, st, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, n), core.TransferOptions{})
	require.Equal(t, status.PermissionDenied, code)
	require.Equal(t, core.TransportNone, st[0].Transport, "refused before any transport")
	rkey := p.peerKeys(t, remote.Addr)[0].RKey
	require.ErrorIs(t, p.postRaw(t, opWrite, local, remote.Addr, rkey, n), status.ErrPermissionDenied)
	require.Equal(t, before, dst, "not one byte written")
	require.NoError(t, p.postRaw(t, opRead, local, remote.Addr, rkey, n))
	require.Equal(t, dst, src, "read what the target holds")
	p.uninstall(t)
}

// A peer that goes away with work in flight fails it at once, not at the
// deadline.
func TestPeerGoneMidBatch(t *testing.T) {
	p := newPair(t, false, "fake0")
	const k, size = 16, 64 << 10
	src, _ := buf(t, p.a, k*size, 0)
	dst, _ := buf(t, p.b, k*size, rw)
	code, _, _ := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, size), core.TransferOptions{})
	require.Equal(t, status.OK, code)
	p.f.set(func(f *fabric) { f.hang = true })
	b, err := p.a.Submit(ops(core.OpWrite, src, p.seg, dst, k, size), core.TransferOptions{Timeout: time.Minute})
	require.NoError(t, err)
	defer p.a.ReleaseBatch(b)
	require.Eventually(t, func() bool { return p.ta.Stats()["inflight"] == k }, 10*time.Second, time.Millisecond)
	start := time.Now()
	require.NoError(t, p.b.Uninstall(Name)) // the peer's rdma goes away: its connections close
	code, _ = b.Wait(10 * time.Second)
	require.Equal(t, status.TransportError, code)
	require.Less(t, time.Since(start), 10*time.Second, "failed long before the minute's deadline")
	require.Eventually(t, func() bool { return p.ta.Stats()["qps"] == 0 }, 10*time.Second, time.Millisecond)
	require.NoError(t, p.a.Uninstall(Name))
	p.f.set(func(f *fabric) { f.hang = false })
	require.Equal(t, fabricCounts{}, p.f.counts())
}

func TestAccessFollowsPermission(t *testing.T) {
	require.Equal(t, accessLocalWrite, accessFor(0))
	require.Equal(t, accessLocalWrite|accessRemoteRead, accessFor(core.PermRemoteRead), "read-only memory gets no remote write")
	require.Equal(t, accessLocalWrite|accessRemoteWrite, accessFor(core.PermRemoteWrite))
	require.Equal(t, accessLocalWrite|accessRemoteRead|accessRemoteWrite, accessFor(rw))
}

// Only regions peers may access publish keys, one per NIC.
func TestKeysPublishedOnlyForRemoteAccess(t *testing.T) {
	p := newPair(t, false, "fake0", "fake1")
	_, private := buf(t, p.b, 4096, 0)
	_, shared := buf(t, p.b, 4096, core.PermRemoteRead)
	d, err := p.b.Descriptor()
	require.NoError(t, err)
	for _, r := range d.Regions {
		_, err := remoteKeys(&r)
		if r.Addr == private.Addr {
			require.Error(t, err, "a local-only region publishes no rkey")
		}
	}
	keys := p.peerKeys(t, shared.Addr)
	require.Len(t, keys, 2)
	require.NotEqual(t, keys[0].RKey, keys[1].RKey)
	_, err = decodeKeys(append(encodeKeys(keys), 0))
	require.Error(t, err, "trailing bytes")
	_, err = decodeKeys([]byte{200})
	require.Error(t, err, "too many NICs")
	p.uninstall(t)
}
