//go:build linux

package shm

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/status"
)

// deferJobs makes the transport defer the next queued job, as it does
// once waiters have claimed deferAfter batches in a row, with window as
// the time the job waits for its waiter.
func deferJobs(t *testing.T, tr *Transport, window time.Duration) {
	tr.waitersCame.Store(deferAfter)
	tr.hooks.deferWindow.Store(&window)
	t.Cleanup(func() { tr.hooks.deferWindow.Store(nil) })
}

// deferredPair is a pair with a standing grant on a heap region of the
// target, the initiator ready to defer queued jobs.
func deferredPair(t *testing.T, window time.Duration) (p *grantPair, mem []byte, r *core.Region, base map[string]int64) {
	const n = 1 << 20
	p = newGrantPair(t, core.Options{}, n)
	mem, r = p.heapRegion(t, n, rw, 0)
	base = map[string]int64{}
	primeGrant(t, p, r, 4096, base)
	deferJobs(t, p.tr, window)
	return p, mem, r, base
}

// Once waiters have claimed their batches, a batch too large to copy in
// Submit starts no goroutine: its waiter claims and copies it, and no job
// goroutine ever runs for it.
func TestDeferredJobClaimedByWaiter(t *testing.T) {
	p, mem, r, base := deferredPair(t, time.Hour)
	_, entered := holdJobs(t, p.tr)

	copy(p.local, peertest.Pattern(41, 128*4096))
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{}) // 512 KiB: a job
	require.NoError(t, err)
	st := p.tr.Stats()
	require.EqualValues(t, 1, st["jobs_deferred"])
	require.EqualValues(t, 1+st["connections"], st["goroutines"], "no goroutine started for the deferred job")
	require.NotNil(t, queuedRequest(p.tr))

	code, werr := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.True(t, slices.Equal(peertest.Pattern(41, 128*4096), mem[:128*4096]))
	requireJobsGone(t, p.tr)
	st = p.tr.Stats()
	require.Zero(t, entered.Load(), "no job goroutine ran")
	require.EqualValues(t, 1, st["copies_helped"])
	require.Zero(t, st["defer_expired"])
	require.EqualValues(t, 1, st["grant_hits"]-base["grant_hits"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// A deferred job nobody waits for is run by a goroutine once its window
// passes; the next batches start their goroutines at once, until waiters
// have claimed deferAfter batches again.
func TestDeferredJobRunsWithoutWaiter(t *testing.T) {
	p, mem, r, _ := deferredPair(t, 0)

	copy(p.local, peertest.Pattern(42, 128*4096))
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	<-b.Done() // no Help: only the fallback can run it
	code, _, werr := b.Status(nil)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.True(t, slices.Equal(peertest.Pattern(42, 128*4096), mem[:128*4096]))
	st := p.tr.Stats()
	require.EqualValues(t, 1, st["jobs_deferred"])
	require.EqualValues(t, 1, st["defer_expired"])
	require.Zero(t, st["copies_helped"])
	require.Zero(t, p.tr.waitersCame.Load())

	// Waiters claim deferAfter batches, each raced by its goroutine (held,
	// so the waiter wins); then the next one is deferred again.
	release, _ := holdJobs(t, p.tr)
	for i := 0; i < deferAfter; i++ {
		b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
		require.NoError(t, err)
		code, werr := b.Wait(-1)
		require.Equal(t, status.OK, code, "%v", werr)
		p.e.ReleaseBatch(b)
	}
	require.EqualValues(t, 1, p.tr.Stats()["jobs_deferred"], "not deferred while waiters had not come")
	release()
	requireJobsGone(t, p.tr)
	window := time.Hour
	p.tr.hooks.deferWindow.Store(&window)
	b, err = p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 2, p.tr.Stats()["jobs_deferred"])
	code, werr = b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	requireJobsGone(t, p.tr)
	st = p.tr.Stats()
	require.EqualValues(t, deferAfter+1, st["copies_helped"])
	require.EqualValues(t, 1, st["defer_expired"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// Canceling a deferred job's batch completes its requests at once, with
// no waiter and before its window ends; nothing is copied.
func TestDeferredJobCancel(t *testing.T) {
	p, mem, r, _ := deferredPair(t, time.Hour)

	copy(p.local, peertest.Pattern(43, 128*4096))
	bytes := p.tr.Stats()["bytes"]
	before := slices.Clone(mem[:128*4096])
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, p.tr.Stats()["jobs_deferred"])
	require.True(t, b.Cancel(), "the transport gave the requests back")
	sts := make([]core.RequestStatus, 128)
	_, done, _ := b.Status(sts)
	require.Equal(t, 128, done)
	for i := range sts {
		require.Equal(t, status.Canceled, sts[i].Code, "request %d", i)
	}
	p.e.ReleaseBatch(b)
	requireJobsGone(t, p.tr)
	require.Equal(t, bytes, p.tr.Stats()["bytes"], "nothing copied")
	require.True(t, slices.Equal(before, mem[:128*4096]), "nothing of the canceled batch landed")
	require.Zero(t, p.tr.Stats()["defer_expired"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// Uninstall completes a deferred job (ErrUninstalled) without its waiter
// and waits for it; nothing is left.
func TestDeferredJobUninstall(t *testing.T) {
	p, mem, r, _ := deferredPair(t, time.Hour)

	copy(p.local, peertest.Pattern(44, 128*4096))
	before := slices.Clone(mem[:128*4096])
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, p.tr.Stats()["jobs_deferred"])
	require.NoError(t, p.tr.Uninstall())
	<-b.Done()
	code, _, _ := b.Status(nil)
	require.NotEqual(t, status.OK, code)
	p.e.ReleaseBatch(b)
	require.True(t, slices.Equal(before, mem[:128*4096]), "nothing landed")
	requireIdle(t, p.tr, false)
	require.Zero(t, p.tr.Stats()["jobs"])
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// The target unregisters the region while a job is deferred: the revoke
// does not wait for it (it holds no grant yet), and when its waiter comes
// the batch fails NotRegistered without touching the memory.
func TestDeferredJobAfterRevoke(t *testing.T) {
	p, mem, r, _ := deferredPair(t, time.Hour)

	copy(p.local, peertest.Pattern(45, 128*4096))
	before := slices.Clone(mem[:128*4096])
	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, p.tr.Stats()["jobs_deferred"])
	require.NoError(t, p.target.Unregister(r))
	require.EqualValues(t, 1, p.ttr.Stats()["revokes_acked"])
	code, werr := b.Wait(-1)
	require.Equal(t, status.NotRegistered, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.True(t, slices.Equal(before, mem[:128*4096]), "nothing landed after Unregister returned")
	requireJobsGone(t, p.tr)
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// The target's engine closes while a job is deferred: the waiter's claim
// finds the connection gone and the batch fails; nothing is left held.
func TestDeferredJobPeerGone(t *testing.T) {
	p, _, r, _ := deferredPair(t, time.Hour)

	b, err := p.e.Submit(writes(p, r, 128, 4096), core.TransferOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, p.tr.Stats()["jobs_deferred"])
	require.NoError(t, p.target.Close())
	code, werr := b.Wait(-1)
	require.NotEqual(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	requireJobsGone(t, p.tr)
	require.Zero(t, p.e.Stats().DuplicateCompletions)
}

// The fallback (a window of zero) and three waiters race for each
// deferred job: exactly one of them copies it, every request completes
// once, and nothing is left. Run with -race -count=20.
func TestDeferredClaimExactlyOnce(t *testing.T) {
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
		deferJobs(t, p.tr, 0)
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
		require.True(t, slices.Equal(peertest.Pattern(int64(i), reqs*size), mem[:reqs*size]))
	}
	requireJobsGone(t, p.tr)
	st := p.tr.Stats()
	require.EqualValues(t, batches, st["jobs_deferred"])
	require.EqualValues(t, batches, st["grant_hits"]-base["grant_hits"], "each batch copied once")
	require.EqualValues(t, batches*reqs*size, st["bytes"]-bytes)
	require.EqualValues(t, batches*reqs, st["requests"]-base["requests"])
	require.LessOrEqual(t, st["copies_helped"], int64(batches))
	require.Zero(t, p.e.Stats().DuplicateCompletions)
	t.Logf("%d of %d batches copied by a waiter", st["copies_helped"], batches)
}
