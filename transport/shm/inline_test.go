//go:build linux

package shm

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// primeGrant writes n bytes into r once through a lease, which brings the
// standing grant later batches copy under, and waits for that lease to go.
func primeGrant(t *testing.T, p *grantPair, r *core.Region, n int, base map[string]int64) {
	t.Helper()
	code, err := p.one(t, core.OpWrite, 0, r.Addr, n)
	require.Equal(t, status.OK, code, "%v", err)
	require.EqualValues(t, 1, p.tr.Stats()["grant_misses"])
	require.Eventually(t, func() bool { return p.ttr.Stats()["leases"] == 0 }, 10*time.Second, time.Millisecond)
	// The initiator routes on the caller's goroutine only with a fresh
	// descriptor of the target (registering r made the cached one stale,
	// and the target's notice of that may come late): wait until a batch
	// is routed, and copied, within Submit.
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(p.local), Segment: p.seg, Remote: r.Addr, Len: 1}}
	require.Eventually(t, func() bool {
		b, err := p.e.Submit(req, core.TransferOptions{})
		require.NoError(t, err)
		defer p.e.ReleaseBatch(b)
		code, _ := b.Wait(0)
		_, _ = b.Wait(-1)
		return code == status.OK
	}, 10*time.Second, time.Millisecond)
	requireJobsGone(t, p.tr) // the jobs of the batches above have ended, not only their requests
	for _, k := range []string{"copies_inline", "grant_hits", "requests"} {
		base[k] = p.tr.Stats()[k]
	}
}

// parkOnce makes the first copy step under standing grants block until
// the returned let is called; entered receives when it blocks.
func parkOnce(t *testing.T, tr *Transport) (entered chan struct{}, let func()) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	let = func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // a failing check must not leave the copy parked
	var calls atomic.Int32
	hook := func() {
		if calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
	}
	tr.hooks.inCachedCopy.Store(&hook)
	t.Cleanup(func() { tr.hooks.inCachedCopy.Store(nil) })
	return entered, let
}

func writes(p *grantPair, r *core.Region, n, size int) []core.TransferRequest {
	reqs := make([]core.TransferRequest, n)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(p.local) + uint64(i*size), Segment: p.seg,
			Remote: r.Addr + uint64(i*size), Len: uint64(size)}
	}
	return reqs
}

// apart is writes with the local side in reverse order: no request
// continues the one before it, so each is a copy step of its own through
// a mapping (mergeEnd). Request i reads local block n-1-i.
func apart(p *grantPair, r *core.Region, n, size int) []core.TransferRequest {
	reqs := writes(p, r, n, size)
	for i := range reqs {
		reqs[i].Local = host.Addr(p.local) + uint64((n-1-i)*size)
	}
	return reqs
}

// A batch under standing grants is copied in Submit, on the caller's
// goroutine, when it is small or the caller promised to wait (Waiting);
// a large batch without the promise goes to a job goroutine.
func TestInlineCopyTaken(t *testing.T) {
	const n = 1 << 20
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, 4096, base)

	done := func(b *core.Batch) status.Code { // Wait(0) never blocks
		code, _ := b.Wait(0)
		return code
	}
	copy(p.local, peertest.Pattern(1, n))
	b, err := p.e.Submit(writes(p, r, 1, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.Equal(t, status.OK, done(b), "a small batch is complete when Submit returns")
	p.e.ReleaseBatch(b)
	st := p.tr.Stats()
	require.EqualValues(t, 1, st["copies_inline"]-base["copies_inline"])
	require.EqualValues(t, 1, st["grant_hits"]-base["grant_hits"])
	require.Equal(t, peertest.Pattern(1, n)[:4096], mem[:4096])

	// 128 × 4 KiB = 512 KiB, above inlineMax: a job copies it.
	copy(p.local, peertest.Pattern(2, n))
	code, _, err := run(t, p.e, writes(p, r, 128, 4096), core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	st = p.tr.Stats()
	require.EqualValues(t, 1, st["copies_inline"]-base["copies_inline"])
	require.EqualValues(t, 2, st["grant_hits"]-base["grant_hits"])
	require.Equal(t, peertest.Pattern(2, n)[:128*4096], mem[:128*4096])

	// The same batch with the promise to wait is copied in Submit.
	copy(p.local, peertest.Pattern(3, n))
	b, err = p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{Waiting: true})
	require.NoError(t, err)
	require.Equal(t, status.OK, done(b))
	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	st = p.tr.Stats()
	require.EqualValues(t, 2, st["copies_inline"]-base["copies_inline"])
	require.EqualValues(t, 3, st["grant_hits"]-base["grant_hits"])
	require.EqualValues(t, 1, st["grant_misses"])
	require.EqualValues(t, 1+128+128, st["requests"]-base["requests"])
	require.Equal(t, peertest.Pattern(3, n)[:128*4096], mem[:128*4096])
}

// A revoke that races an inline copy waits for it: the copy holds the
// grant's reference exactly as a job does, and Unregister returns only
// after the bytes landed; later batches on the range fail NotRegistered.
func TestInlineRevokeWaitsForCopy(t *testing.T) {
	const n = 64 << 10
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)

	entered, let := parkOnce(t, p.tr)
	copy(p.local, peertest.Pattern(4, n))
	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := p.e.Submit(writes(p, r, 1, n), core.TransferOptions{Waiting: true})
		if err != nil {
			panic(err)
		}
		submitted <- b
	}()
	<-entered
	unregistered := make(chan error, 1)
	go func() { unregistered <- p.target.Unregister(r) }()
	require.Eventually(t, func() bool { return p.ttr.Stats()["revokes_sent"] == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return p.tr.Stats()["grants_cached"] == 0 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-unregistered:
		t.Fatalf("Unregister returned (%v) while an inline copy under the grant was parked", err)
	case <-submitted:
		t.Fatal("Submit returned while its inline copy was parked")
	default:
	}
	require.Zero(t, p.ttr.Stats()["revokes_acked"])

	let()
	b := <-submitted
	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.NoError(t, <-unregistered)
	require.Equal(t, peertest.Pattern(4, n), mem, "the parked copy landed before Unregister returned")
	require.EqualValues(t, 1, p.ttr.Stats()["revokes_acked"])
	require.EqualValues(t, 1, p.tr.Stats()["copies_inline"]-base["copies_inline"])

	code, err := p.one(t, core.OpWrite, 0, r.Addr, n)
	require.Equal(t, status.NotRegistered, code, "%v", err)
	require.EqualValues(t, 1, p.tr.Stats()["grant_hits"]-base["grant_hits"], "no copy under a revoked grant")
}

// Uninstall of the initiator's transport waits for an inline copy in
// progress, which ends as it would on a job (the step had passed its
// checks); a batch submitted afterwards fails, and nothing is left held.
func TestInlineUninstallWaitsForCopy(t *testing.T) {
	const n = 4096
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)

	entered, let := parkOnce(t, p.tr)
	copy(p.local, peertest.Pattern(5, n))
	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := p.e.Submit(writes(p, r, 1, n), core.TransferOptions{Waiting: true})
		if err != nil {
			panic(err)
		}
		submitted <- b
	}()
	<-entered
	uninstalled := make(chan error, 1)
	go func() { uninstalled <- p.tr.Uninstall() }()
	require.Eventually(t, p.tr.closing.Load, 10*time.Second, time.Millisecond)
	select {
	case err := <-uninstalled:
		t.Fatalf("Uninstall returned (%v) while an inline copy was parked", err)
	default:
	}
	let()
	b := <-submitted
	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.NoError(t, <-uninstalled)
	require.Equal(t, peertest.Pattern(5, n), mem)
	require.EqualValues(t, 1, p.tr.Stats()["copies_inline"]-base["copies_inline"])
	requireIdle(t, p.tr, false)
}

// A memory fault in an inline copy (the caller's buffer unmapped under
// it) fails that request with TransportError instead of the process, on
// the submitting goroutine, whose fault setting is restored; the next
// batch copies inline again.
func TestInlineCopyFault(t *testing.T) {
	const n = 4096
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw) // the mapped path: a Go copy that can fault
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)

	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	lr, err := p.e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: n}, rw)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.e.Unregister(lr))
		require.NoError(t, unix.Munmap(buf))
	})
	hook := func() { require.NoError(t, unix.Mprotect(buf, unix.PROT_NONE)) }
	p.tr.hooks.inCachedCopy.Store(&hook)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(buf), Segment: p.seg, Remote: r.Addr, Len: n}}
	b, err := p.e.Submit(req, core.TransferOptions{})
	require.NoError(t, err)
	p.tr.hooks.inCachedCopy.Store(nil)
	require.False(t, debug.SetPanicOnFault(false), "the inline copy restored this goroutine's fault setting")
	code, werr := b.Wait(0)
	require.Equal(t, status.TransportError, code, "%v", werr)
	require.ErrorContains(t, werr, "memory fault")
	p.e.ReleaseBatch(b)
	require.EqualValues(t, 1, p.tr.Stats()["copies_inline"]-base["copies_inline"])

	require.NoError(t, unix.Mprotect(buf, unix.PROT_READ|unix.PROT_WRITE))
	copy(buf, peertest.Pattern(6, n))
	b, err = p.e.Submit(req, core.TransferOptions{})
	require.NoError(t, err)
	code, werr = b.Wait(0)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(6, n), host.Bytes(r.Addr, n))
	require.EqualValues(t, 2, p.tr.Stats()["copies_inline"]-base["copies_inline"])
}

// Cancel reaches an inline copy as it reaches a job: requests not copied
// yet complete with Canceled, and nothing of them lands.
func TestInlineCancel(t *testing.T) {
	const n = 8192
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw) // mapped: the copy steps request by request (apart)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	clear(mem)
	// The priming batch's job may still be on its way back to the pool
	// (its requests complete before it is put back): wait until it is,
	// so the jobs below are this batch's alone.
	require.Eventually(t, func() bool {
		p.tr.mu.Lock()
		defer p.tr.mu.Unlock()
		return len(p.tr.jobs) == 0
	}, 10*time.Second, time.Millisecond)

	entered, let := parkOnce(t, p.tr)
	copy(p.local, peertest.Pattern(7, n))
	submitted := make(chan *core.Batch, 1)
	go func() {
		b, err := p.e.Submit(apart(p, r, 2, n/2), core.TransferOptions{Waiting: true})
		if err != nil {
			panic(err)
		}
		submitted <- b
	}()
	<-entered // request 0 has passed its checks; request 1 has not
	var reqs []*core.Request
	p.tr.mu.Lock()
	for j := range p.tr.jobs {
		reqs = append(reqs, j.reqs...)
	}
	p.tr.mu.Unlock()
	require.Len(t, reqs, 2)
	p.tr.Cancel(reqs[1:])
	let()
	b := <-submitted
	_, _ = b.Wait(-1)
	st := make([]core.RequestStatus, 2)
	_, done, _ := b.Status(st)
	require.Equal(t, 2, done)
	p.e.ReleaseBatch(b)
	require.Equal(t, status.OK, st[0].Code)
	require.Equal(t, status.Canceled, st[1].Code)
	require.Equal(t, peertest.Pattern(7, n)[n/2:], mem[:n/2])
	require.Equal(t, make([]byte, n/2), mem[n/2:], "nothing of the canceled request landed")
	require.EqualValues(t, 1, p.tr.Stats()["copies_inline"]-base["copies_inline"])
}
