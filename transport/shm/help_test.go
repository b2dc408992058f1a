//go:build linux

package shm

import (
	"runtime"
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

// holdJobs makes every job goroutine wait, before it claims its job,
// until release is called; entered counts those that reached the hold.
func holdJobs(t *testing.T, tr *Transport) (release func(), entered *atomic.Int32) {
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	entered = new(atomic.Int32)
	hook := func() {
		entered.Add(1)
		<-gate
	}
	tr.hooks.jobStart.Store(&hook)
	t.Cleanup(func() {
		tr.hooks.jobStart.Store(nil)
		release()
	})
	return release, entered
}

// requireJobsGone waits until no job is left, none is queued for a
// waiter, and the transport runs only its listener and one goroutine per
// connection (no job goroutine). A count taken at the start of a test
// would do as well only once the goroutines of its earlier batches have
// ended, which completing their requests does not wait for.
func requireJobsGone(t *testing.T, tr *Transport) {
	t.Helper()
	require.Eventually(t, func() bool {
		tr.mu.Lock()
		queued := len(tr.queued)
		tr.mu.Unlock()
		st := tr.Stats()
		return queued == 0 && st["jobs"] == 0 && st["goroutines"] == 1+st["connections"]
	}, 10*time.Second, time.Millisecond, "jobs left: %v", tr.Stats())
}

// queuedRequest returns the first request of the job queued for a
// waiter, or nil when there is none (any more).
func queuedRequest(tr *Transport) *core.Request {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for r := range tr.queued {
		return r
	}
	return nil
}

// A batch too large to copy in Submit, which its caller then waits for,
// is copied by the waiting goroutine (Help) while its job goroutine has
// not claimed it; the job goroutine then does nothing: the bytes are
// copied once, every request completes once, and nothing is left held.
func TestHelpClaimsQueuedJob(t *testing.T) {
	const n = 1 << 20
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, 4096, base)
	bytes := p.tr.Stats()["bytes"]

	release, entered := holdJobs(t, p.tr)
	copy(p.local, peertest.Pattern(11, n))
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{}) // 512 KiB: a job
	require.NoError(t, err)
	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(11, n)[:128*4096], mem[:128*4096])
	st := p.tr.Stats()
	require.EqualValues(t, 1, st["copies_helped"])
	require.EqualValues(t, 0, st["copies_inline"]-base["copies_inline"])
	require.EqualValues(t, 1, st["grant_hits"]-base["grant_hits"])

	require.Eventually(t, func() bool { return entered.Load() == 1 }, 10*time.Second, time.Millisecond)
	release() // the job goroutine finds its job claimed
	requireJobsGone(t, p.tr)
	st = p.tr.Stats()
	require.EqualValues(t, 1, st["grant_hits"]-base["grant_hits"], "the job goroutine copied nothing")
	require.EqualValues(t, 128*4096, st["bytes"]-bytes)
	require.EqualValues(t, 128, st["requests"]-base["requests"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// A job its goroutine has claimed is not taken by a waiter: Help returns
// at once, and the waiter then simply waits for the job.
func TestHelpLeavesClaimedJob(t *testing.T) {
	const n = 1 << 20
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, 4096, base)

	entered, let := parkOnce(t, p.tr)
	copy(p.local, peertest.Pattern(12, n))
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	<-entered // the job goroutine claimed the job and copies
	var first *core.Request
	p.tr.mu.Lock()
	for j := range p.tr.jobs {
		first = j.reqs[0]
	}
	p.tr.mu.Unlock()
	require.NotNil(t, first)
	p.tr.Help(first, b.Done(), time.Time{}) // returns: nothing to claim
	require.Zero(t, p.tr.Stats()["copies_helped"])
	let()
	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(12, n)[:128*4096], mem[:128*4096])
	requireJobsGone(t, p.tr)
	st := p.tr.Stats()
	require.Zero(t, st["copies_helped"])
	require.EqualValues(t, 1, st["grant_hits"]-base["grant_hits"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// The job goroutine and two waiters race for each job: exactly one of
// them copies it (bytes and grant hits count each batch once), every
// request completes once, and nothing is left. Run with -race -count=20.
func TestHelpClaimExactlyOnce(t *testing.T) {
	const (
		n       = 64 << 10
		batches = 200
		reqs    = 4
		size    = 4096
	)
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, size, base)
	bytes := p.tr.Stats()["bytes"]
	p.tr.hooks.noInline.Store(true) // every batch is queued as a job

	for i := 0; i < batches; i++ {
		copy(p.local, peertest.Pattern(int64(i), reqs*size))
		b, err := p.e.Submit(writes(p, r, reqs, size), core.TransferOptions{})
		require.NoError(t, err)
		var wg sync.WaitGroup
		if first := queuedRequest(p.tr); first != nil {
			for k := 0; k < 2; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.tr.Help(first, b.Done(), time.Time{})
				}()
			}
		}
		code, werr := b.Wait(-1)
		require.Equal(t, status.OK, code, "%v", werr)
		wg.Wait()
		p.e.ReleaseBatch(b)
		require.Equal(t, peertest.Pattern(int64(i), reqs*size), mem[:reqs*size])
	}
	requireJobsGone(t, p.tr)
	st := p.tr.Stats()
	require.EqualValues(t, batches, st["grant_hits"]-base["grant_hits"], "each batch copied once")
	require.EqualValues(t, batches*reqs*size, st["bytes"]-bytes)
	require.EqualValues(t, batches*reqs, st["requests"]-base["requests"])
	require.LessOrEqual(t, st["copies_helped"], int64(batches))
	require.Zero(t, p.e.Stats().DuplicateCompletions)
	t.Logf("%d of %d batches copied by a waiter", st["copies_helped"], batches)
}

// A waiter copies only what it can finish before its wait ends: past
// until it copies nothing; with room for part of the batch it copies
// that part and a job goroutine copies the rest; a batch that needs a
// lease (no standing grant yet) it leaves to a job goroutine too.
func TestHelpRespectsUntil(t *testing.T) {
	const n = 64 << 10
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	_, other := p.heapRegion(t, n, rw, 0)
	primed := map[string]int64{}
	primeGrant(t, p, other, 4096, primed) // a fresh descriptor: batches route in Submit

	// No grant on r yet: the waiter cannot copy without a round trip.
	bytes := p.tr.Stats()["bytes"]
	release, _ := holdJobs(t, p.tr)
	p.tr.hooks.noInline.Store(true)
	copy(p.local, peertest.Pattern(21, n))
	b, err := p.e.Submit(writes(p, r, 8, 4096), core.TransferOptions{})
	require.NoError(t, err)
	code, werr := b.Wait(-1) // the job handed back takes the lease
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(21, n)[:8*4096], mem[:8*4096])
	st := p.tr.Stats()
	require.Zero(t, st["copies_helped"])
	require.EqualValues(t, 2, st["grant_misses"])
	release()
	require.Eventually(t, func() bool { return p.ttr.Stats()["leases"] == 0 }, 10*time.Second, time.Millisecond)
	base := map[string]int64{"grant_hits": st["grant_hits"]}

	// Until passed: nothing copied by the waiter.
	release, _ = holdJobs(t, p.tr)
	copy(p.local, peertest.Pattern(22, n))
	b, err = p.e.Submit(writes(p, r, 8, 4096), core.TransferOptions{})
	require.NoError(t, err)
	first := queuedRequest(p.tr)
	require.NotNil(t, first)
	p.tr.Help(first, b.Done(), time.Now().Add(-time.Millisecond))
	code, werr = b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(22, n)[:8*4096], mem[:8*4096])
	require.Zero(t, p.tr.Stats()["copies_helped"])
	require.EqualValues(t, 1, p.tr.Stats()["grant_hits"]-base["grant_hits"])
	release()

	// Room for two requests: the waiter copies them, a job the other six.
	var budgets atomic.Int32
	budget := func(time.Time) uint64 {
		if budgets.Add(1) == 1 {
			return 2 * 4096
		}
		return 0
	}
	p.tr.hooks.helpBudget.Store(&budget)
	release, _ = holdJobs(t, p.tr)
	copy(p.local, peertest.Pattern(23, n))
	b, err = p.e.Submit(writes(p, r, 8, 4096), core.TransferOptions{})
	require.NoError(t, err)
	code, werr = b.Wait(time.Minute)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(23, n)[:8*4096], mem[:8*4096])
	st = p.tr.Stats()
	require.EqualValues(t, 1, st["copies_helped"])
	require.EqualValues(t, 3, st["grant_hits"]-base["grant_hits"], "two parts of one batch")
	release()
	requireJobsGone(t, p.tr)
	require.EqualValues(t, 3*8*4096, st["bytes"]-bytes, "each batch copied once")
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// helpedCopy submits a queued batch whose job goroutine is held, and
// waits for it in a goroutine whose first cached copy step parks
// (parkOnce): the waiter has claimed the job and copies it.
func helpedCopy(t *testing.T, p *grantPair, reqs []core.TransferRequest) (b *core.Batch, waited chan status.Code, let func(), release func()) {
	t.Helper()
	release, _ = holdJobs(t, p.tr)
	p.tr.hooks.noInline.Store(true)
	entered, let := parkOnce(t, p.tr)
	b, err := p.e.Submit(reqs, core.TransferOptions{})
	require.NoError(t, err)
	waited = make(chan status.Code, 1)
	go func() {
		code, _ := b.Wait(-1)
		waited <- code
	}()
	<-entered // only the waiter can be there: the job goroutine is held
	return b, waited, let, release
}

// A revoke that races a waiter's copy waits for it, exactly as for a job.
func TestHelpRevokeWaitsForCopy(t *testing.T) {
	const n = 64 << 10
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)

	copy(p.local, peertest.Pattern(31, n))
	b, waited, let, release := helpedCopy(t, p, writes(p, r, 16, 4096))
	unregistered := make(chan error, 1)
	go func() { unregistered <- p.target.Unregister(r) }()
	require.Eventually(t, func() bool { return p.ttr.Stats()["revokes_sent"] == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return p.tr.Stats()["grants_cached"] == 0 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-unregistered:
		t.Fatalf("Unregister returned (%v) while a waiter's copy under the grant was parked", err)
	case <-waited:
		t.Fatal("the wait returned while its copy was parked")
	default:
	}
	let()
	require.Equal(t, status.OK, <-waited)
	p.e.ReleaseBatch(b)
	require.NoError(t, <-unregistered)
	require.Equal(t, peertest.Pattern(31, n)[:16*4096], mem[:16*4096], "the parked copy landed before Unregister returned")
	require.EqualValues(t, 1, p.tr.Stats()["copies_helped"])
	release()
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// Uninstall waits for a waiter's copy in progress (its step had passed
// its checks), and for the job goroutine it beat; nothing is left.
func TestHelpUninstallWaitsForCopy(t *testing.T) {
	const n = 64 << 10
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)

	copy(p.local, peertest.Pattern(32, n))
	b, waited, let, release := helpedCopy(t, p, writes(p, r, 1, 4096))
	uninstalled := make(chan error, 1)
	go func() { uninstalled <- p.tr.Uninstall() }()
	require.Eventually(t, p.tr.closing.Load, 10*time.Second, time.Millisecond)
	select {
	case err := <-uninstalled:
		t.Fatalf("Uninstall returned (%v) while a waiter's copy was parked", err)
	default:
	}
	let()
	require.Equal(t, status.OK, <-waited)
	p.e.ReleaseBatch(b)
	require.Equal(t, peertest.Pattern(32, n)[:4096], mem[:4096])
	release()
	require.NoError(t, <-uninstalled)
	require.EqualValues(t, 1, p.tr.Stats()["copies_helped"])
	requireIdle(t, p.tr, false)
}

// Cancel reaches a waiter's copy as it reaches a job's.
func TestHelpCancel(t *testing.T) {
	const n = 8192
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw) // mapped: the copy steps request by request (apart)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	clear(mem)

	copy(p.local, peertest.Pattern(33, n))
	b, waited, let, release := helpedCopy(t, p, apart(p, r, 2, n/2))
	// Request 0 has passed its checks; request 1 has not.
	var reqs []*core.Request
	p.tr.mu.Lock()
	for j := range p.tr.jobs {
		reqs = append(reqs, j.reqs...)
	}
	p.tr.mu.Unlock()
	require.Len(t, reqs, 2)
	p.tr.Cancel(reqs[1:])
	let()
	<-waited
	st := make([]core.RequestStatus, 2)
	_, done, _ := b.Status(st)
	require.Equal(t, 2, done)
	p.e.ReleaseBatch(b)
	require.Equal(t, status.OK, st[0].Code)
	require.Equal(t, status.Canceled, st[1].Code)
	require.Equal(t, peertest.Pattern(33, n)[n/2:], mem[:n/2])
	require.Equal(t, make([]byte, n/2), mem[n/2:], "nothing of the canceled request landed")
	require.EqualValues(t, 1, p.tr.Stats()["copies_helped"])
	release()
}

// A memory fault in a waiter's copy fails that request with
// TransportError, not the process, and the waiter's fault setting is
// restored.
func TestHelpCopyFault(t *testing.T) {
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
	release, _ := holdJobs(t, p.tr)
	p.tr.hooks.noInline.Store(true)
	hook := func() { require.NoError(t, unix.Mprotect(buf, unix.PROT_NONE)) }
	p.tr.hooks.inCachedCopy.Store(&hook)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(buf), Segment: p.seg, Remote: r.Addr, Len: n}}
	b, err := p.e.Submit(req, core.TransferOptions{})
	require.NoError(t, err)
	code, werr := b.Wait(-1) // this goroutine copies
	p.tr.hooks.inCachedCopy.Store(nil)
	require.False(t, debug.SetPanicOnFault(false), "the waiter's copy restored its fault setting")
	require.Equal(t, status.TransportError, code, "%v", werr)
	require.ErrorContains(t, werr, "memory fault")
	p.e.ReleaseBatch(b)
	require.EqualValues(t, 1, p.tr.Stats()["copies_helped"])
	release()
	requireJobsGone(t, p.tr)
}

// A waiter leaves to a job goroutine a batch it would copy in many split
// process_vm calls (longPVM: on a locked C thread each join of a split
// call is a thread wake-up), and still copies a batch as large through a
// mapping itself: the bytes land once, every request completes once.
func TestHelpHandsLongProcessVMToAJob(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // a split call needs two threads
	const size = 4 << 20
	n := pvmHandOffCalls * int(chunk) / size // just enough process_vm bytes
	for _, kind := range []string{"process_vm", "mapped"} {
		t.Run(kind, func(t *testing.T) {
			total := n * size
			p := newGrantPair(t, core.Options{}, total)
			mem, r := p.region(t, kind, total)
			base := map[string]int64{}
			primeGrant(t, p, r, 4096, base)

			release, entered := holdJobs(t, p.tr)
			copy(p.local, peertest.Pattern(5, uint64(total)))
			b, err := p.e.Submit(writes(p, r, n, size), core.TransferOptions{})
			require.NoError(t, err)
			code, werr := b.Wait(-1)
			require.Equal(t, status.OK, code, "%v", werr)
			p.e.ReleaseBatch(b)
			require.Equal(t, peertest.Pattern(5, uint64(total)), mem)
			st := p.tr.Stats()
			if kind == "mapped" {
				require.EqualValues(t, 1, st["copies_helped"], "a mapped copy is the waiter's: %v", st)
				require.Zero(t, st["pvm_handed_off"])
			} else {
				require.Zero(t, st["copies_helped"], "%v", st)
				require.EqualValues(t, 1, st["pvm_handed_off"], "%v", st)
			}
			require.Eventually(t, func() bool { return entered.Load() == 1 }, 10*time.Second, time.Millisecond)
			release() // the first job goroutine finds its job claimed by the waiter
			requireJobsGone(t, p.tr)
			st = p.tr.Stats()
			require.EqualValues(t, n, st["requests"]-base["requests"])
			require.Zero(t, p.e.Stats().DuplicateCompletions)

			// One byte fewer through process_vm than the hand-off takes: the
			// waiter copies it.
			if kind == "process_vm" {
				reqs := writes(p, r, n, size)
				reqs[n-1].Len--
				release, _ := holdJobs(t, p.tr)
				b, err := p.e.Submit(reqs, core.TransferOptions{})
				require.NoError(t, err)
				code, werr := b.Wait(-1)
				require.Equal(t, status.OK, code, "%v", werr)
				p.e.ReleaseBatch(b)
				release()
				requireJobsGone(t, p.tr)
				st := p.tr.Stats()
				require.EqualValues(t, 1, st["copies_helped"], "%v", st)
				require.EqualValues(t, 1, st["pvm_handed_off"], "%v", st)
			}
		})
	}
}
