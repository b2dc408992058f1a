//go:build linux

package shm

import (
	"errors"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// testHooks are points where a test of this package steps into one
// transport's work; all nil (or false) outside tests. processVM runs
// before every process_vm call, and an error it returns is taken as the
// call's (the kernel's refusal); beforeCopy runs when a job holds its lease
// and is about to copy; grant when the target is about to check a lease
// (tests block in them to cancel or uninstall at those points);
// ignoreRevoke makes the initiator ignore REVOKE frames, so a test can
// watch the descriptor check drop mappings on its own.
//
// inCachedCopy runs inside a copy under standing grants, once the copy
// step has passed its checks (the step then runs, whatever happens
// meanwhile); swallowRevokeGrant makes the initiator drop REVOKE_GRANT
// frames unanswered (a stuck initiator); noInline sends every batch
// through a job goroutine (tests that park a copy while Submit returns).
//
// jobStart runs on a job goroutine before it claims its job (a test holds
// it there to let the waiter claim first); helpBudget replaces the bytes
// a waiter may still start copying before its wait ends (helpBudget);
// deferWindow replaces how long a deferred job waits for its waiter
// before a goroutine runs it (deferWindow).
type testHooks struct {
	noInline           atomic.Bool
	jobStart           atomic.Pointer[func()]
	deferWindow        atomic.Pointer[time.Duration]
	helpBudget         atomic.Pointer[func(until time.Time) uint64]
	processVM          atomic.Pointer[func(op core.Op) error]
	beforeCopy, grant  atomic.Pointer[func()]
	inCachedCopy       atomic.Pointer[func()]
	ignoreRevoke       atomic.Bool
	swallowRevokeGrant atomic.Bool
}

// job carries the requests of one Submit call through their leases. Jobs
// and their buffers are reused, so the hot path allocates per batch, not
// per request.
type job struct {
	t     *Transport
	gen   uint64        // uses of this job value so far; on t.mu
	claim atomic.Uint64 // gen<<1, | 1 once the job goroutine or a waiter has claimed this use
	// deferred: queued for its waiter with no goroutine started (on t.mu);
	// fallback starts one if no waiter claims it within deferWindow.
	deferred bool
	fallback *time.Timer
	reqs     []*core.Request
	cancel   []atomic.Bool
	errs     []error
	grant    []grantEntry

	enc      []byte        // the lease frame
	reply    []byte        // the grant's entries, copied by the reader
	grantTTL time.Duration // set by the reader with reply
	granted  chan struct{} // the reader delivered the grant (cap 1)
	wake     chan struct{} // Cancel marked some requests (cap 1)
	timer    *time.Timer

	// State of the lease being copied.
	c        *conn
	stop     time.Time   // no copy step starts after this
	unTimed  uint64      // bytes copied since the clock was last read
	cur      int         // first request of the step being copied (for the fault handler)
	curEnd   int         // end of that step (more than cur+1: a merged step)
	unmerged int         // no step before this request is merged (a merged step faulted)
	curMap   *mapping    // mapping the copy holds a reference on, across requests of one allocation
	mapped   int64       // bytes copied through mappings, not yet counted in t.bytesMapped
	lo       int         // first request of the run being copied
	grants   []*standing // the standing grant of each request of the run; nil under a lease
	under    []*standing // grants' backing store
	pv       [2]pvmBatch
	half     pvmBatch // the second half of a split process_vm call
}

// pvmBatch collects the iovecs of one direction for one process_vm call.
// Consecutive requests that are contiguous on both sides share one iovec
// (the kernel pins and copies per iovec, so 128 adjacent 4 KiB requests
// cost one pin of 128 pages rather than 128 pins of one): iovec k carries
// requests owner[k] through last[k].
type pvmBatch struct {
	local  []unix.Iovec
	remote []unix.RemoteIovec
	owner  []int32 // first request of each iovec
	last   []int32 // last request of each iovec
	bytes  uint64
}

func (b *pvmBatch) reset() {
	b.local, b.remote, b.owner, b.last, b.bytes = b.local[:0], b.remote[:0], b.owner[:0], b.last[:0], 0
}

// getJobLocked returns a reset job holding reqs; t.mu is held.
func (t *Transport) getJobLocked(reqs []*core.Request) *job {
	var j *job
	if n := len(t.free); n > 0 {
		j = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		j = &job{t: t, granted: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
	}
	j.gen++
	j.claim.Store(j.gen << 1)
	n := len(reqs)
	j.reqs = append(j.reqs[:0], reqs...)
	if cap(j.cancel) < n {
		j.cancel = make([]atomic.Bool, n)
	} else {
		// No one else reads or writes them now (Cancel marks under t.mu,
		// a job's copy reads its own use's marks): one clear, not a store
		// each.
		j.cancel = j.cancel[:n]
		clear(j.cancel)
	}
	if cap(j.errs) < n {
		j.errs = make([]error, n)
	} else {
		j.errs = j.errs[:n]
	}
	select {
	case <-j.wake:
	default:
	}
	return j
}

func (t *Transport) putJob(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.jobs, j)
	if t.queued[j.reqs[0]] == j {
		delete(t.queued, j.reqs[0])
	}
	clear(j.reqs)
	clear(j.errs)
	j.reqs, j.errs = j.reqs[:0], j.errs[:0]
	j.c, j.curMap = nil, nil
	if !t.closed && len(t.free) < 64 && cap(j.reqs) <= 1<<16 {
		t.free = append(t.free, j)
	}
}

// queueLocked starts the job goroutine of j; t.mu is held. A helpable
// job is also left for the caller that waits for its batch to claim
// (Help): whichever of the two claims it first runs it, the other does
// nothing. When the callers of recent batches came to claim them
// (shouldDefer), no goroutine is started at first: the job waits for its
// waiter, and only if none claims it within deferWindow does a goroutine
// run it (deferExpired).
func (t *Transport) queueLocked(j *job, helpable bool) {
	if helpable {
		t.queued[j.reqs[0]] = j
		if t.shouldDefer(j) {
			j.deferred = true
			t.jobsDeferred.Add(1)
			if j.fallback == nil {
				j.fallback = time.AfterFunc(t.deferWindow(), func() { t.deferExpired(j) })
			} else {
				j.fallback.Reset(t.deferWindow())
			}
			return
		}
	}
	t.startLocked(j)
}

// startLocked starts the goroutine that claims and runs the current use
// of j; t.mu is held, and t is open or this call holds t.wg.
func (t *Transport) startLocked(j *job) {
	gen := j.gen
	t.spawnLocked(func() {
		if h := t.hooks.jobStart.Load(); h != nil {
			(*h)()
		}
		if j.claimed(gen) {
			t.run(j, 0)
		}
	})
}

// claimed claims use gen of j, and reports whether this call did: at most
// one call per use does. The generation keeps a claim that comes late
// (after the job ended and was reused) from taking a later use.
func (j *job) claimed(gen uint64) bool {
	return j.claim.CompareAndSwap(gen<<1, gen<<1|1)
}

// run moves the job's requests from lo on, one lease per run of requests
// to the same peer (at most MaxLeaseEntries), and completes each run.
func (t *Transport) run(j *job, lo int) {
	defer t.putJob(j)
	for lo < len(j.reqs) {
		hi := j.runEnd(lo)
		j.lease(lo, hi)
		j.complete(lo, hi)
		lo = hi
	}
}

// runEnd returns the end of the lease run starting at lo: the requests
// to the same peer, through the same descriptor, at most MaxLeaseEntries.
func (j *job) runEnd(lo int) int {
	hi := lo + 1
	for hi < len(j.reqs) && hi-lo < MaxLeaseEntries &&
		j.reqs[hi].Peer == j.reqs[lo].Peer && j.reqs[hi].Desc == j.reqs[lo].Desc {
		hi++
	}
	return hi
}

// complete reports the outcomes of reqs[lo:hi] left in j.errs, each run
// of successes in one call (core.DoneAll: the batch's and the region's
// counters once a run, not once a request).
func (j *job) complete(lo, hi int) {
	ok := lo // first success not yet reported
	for i := lo; i < hi; i++ {
		if err := j.errs[i]; err != nil {
			core.DoneAll(j.reqs[ok:i])
			j.reqs[i].Done(0, err)
			ok = i + 1
		}
	}
	core.DoneAll(j.reqs[ok:hi])
}

// copyInline copies the job on the goroutine calling Submit, which either
// waits for the batch right after (Request.CallerWaits) or submitted a
// small one (mayInline): a job goroutine would have to wake that waiter
// when it ends, and a C thread parked in tent_batch_wait or
// tent_transfer_sync is woken by the kernel — two thread switches per
// batch. Only a batch that needs no round trip qualifies: one lease run
// on a live connection whose standing grants cover every request, before
// Uninstall and the deadline (copyCached). It then completes the requests
// and reports true. Otherwise it does nothing, and the job path takes the
// batch.
func (t *Transport) copyInline(j *job) bool {
	if j.runEnd(0) != len(j.reqs) || !j.copyCached(0, len(j.reqs), false) {
		return false
	}
	t.copiesInline.Add(1)
	j.complete(0, len(j.reqs))
	t.putJob(j)
	return true
}

// copyCached copies reqs[lo:hi], one lease run, on the calling goroutine
// when it needs no round trip: before Uninstall and the run's deadline,
// on a live connection whose standing grants cover every request. It then
// copies exactly as a job does (cachedCopy: the grants' references,
// enterCopy, the fault guard set on this goroutine by copyAll, the same
// checks and counters), leaves the outcomes in j.errs and reports true.
// Otherwise it does nothing and reports false; with leaveLongPVM it also
// leaves the run to a job goroutine if it is longPVM.
func (j *job) copyCached(lo, hi int, leaveLongPVM bool) bool {
	t := j.t
	if t.closing.Load() {
		return false
	}
	reqs := j.reqs[lo:hi]
	r0 := reqs[0]
	deadline := r0.Deadline
	for _, r := range reqs[1:] {
		if r.Deadline.Before(deadline) {
			deadline = r.Deadline
		}
	}
	if !time.Now().Before(deadline) {
		return false
	}
	cl, err := t.clientFor(r0)
	if err != nil {
		return false
	}
	c := cl.live()
	if c == nil {
		return false
	}
	c.checkEpoch(r0.Peer, r0.Desc)
	done, err := j.cachedCopy(c, lo, hi, deadline, leaveLongPVM)
	if !done {
		return false
	}
	if err != nil {
		for i := lo; i < hi; i++ {
			if j.errs[i] == nil {
				j.errs[i] = err
			}
		}
	}
	return true
}

// lease obtains a lease for reqs[lo:hi], copies what was granted and gives
// the lease back. Outcomes are left in j.errs.
func (j *job) lease(lo, hi int) {
	t := j.t
	reqs := j.reqs[lo:hi]
	fail := func(err error) {
		for i := lo; i < hi; i++ {
			if j.errs[i] == nil {
				j.errs[i] = err
			}
		}
	}
	deadline := reqs[0].Deadline
	for _, r := range reqs[1:] {
		if r.Deadline.Before(deadline) {
			deadline = r.Deadline
		}
	}
	switch {
	case t.closing.Load():
		fail(core.ErrUninstalled)
		return
	case !time.Now().Before(deadline):
		fail(status.Errorf(status.Timeout, "shm: deadline passed before the transfer started"))
		return
	case j.allCanceled(lo, hi):
		fail(errCanceled)
		return
	}
	cl, err := t.clientFor(reqs[0])
	if err != nil {
		fail(err)
		return
	}
	c, err := cl.connect(deadline)
	if err != nil {
		fail(err)
		return
	}
	c.checkEpoch(reqs[0].Peer, reqs[0].Desc)
	if done, err := j.cachedCopy(c, lo, hi, deadline, false); done {
		if err != nil {
			fail(err)
		}
		return
	}
	t.grantMisses.Add(1)
	id, err := c.use(j)
	if err != nil {
		fail(err)
		return
	}
	defer c.unuse()
	sent := time.Now()
	j.enc = appendLeaseFrame(j.enc[:0], frameLeaseCached, id, deadline.Sub(sent), reqs)
	if err := c.write(j.enc, deadline); err != nil {
		fail(err)
		return
	}
	if err := j.await(c, id, lo, hi, deadline); err != nil {
		fail(err)
		return
	}
	if cap(j.grant) < len(reqs) {
		j.grant = make([]grantEntry, len(reqs))
	}
	j.grant = j.grant[:len(reqs)]
	if err := decodeGrantEntries(j.reply, j.grant); err != nil {
		c.fail(err) // closing the connection releases the lease
		fail(status.Errorf(status.Protocol, "shm: bad grant from %s: %w", cl.name, err))
		return
	}
	if !t.enterCopy() {
		c.release(id)
		fail(core.ErrUninstalled)
		return
	}
	j.c = c
	j.stop = sent.Add(j.grantTTL)
	if deadline.Before(j.stop) {
		j.stop = deadline
	}
	j.copyAll(lo, hi)
	j.c = nil
	c.release(id)
	t.exitCopy()
	clear(j.grant) // drop refusal messages
}

// enterCopy counts a job that holds a lease and copies; Uninstall waits
// for them before closing connections (which releases the leases).
func (t *Transport) enterCopy() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.copying++
	return true
}

func (t *Transport) exitCopy() {
	t.mu.Lock()
	if t.copying--; t.copying == 0 {
		t.copyIdle.Broadcast()
	}
	t.mu.Unlock()
}

var errCanceled = status.Errorf(status.Canceled, "shm: request canceled before its copy")

func (j *job) allCanceled(lo, hi int) bool {
	for i := lo; i < hi; i++ {
		if !j.cancel[i].Load() {
			return false
		}
	}
	return true
}

// await waits for the grant of lease id. Whatever ends the wait early
// (deadline, dead connection, uninstall, cancel of every request), a grant
// that was delivered meanwhile is given back.
func (j *job) await(c *conn, id uint64, lo, hi int, deadline time.Time) error {
	t := j.t
	if j.timer == nil {
		j.timer = time.NewTimer(time.Until(deadline))
	} else {
		j.timer.Reset(time.Until(deadline))
	}
	defer j.timer.Stop()
	var reason error
wait:
	for {
		select {
		case <-j.granted:
			return nil
		case <-c.dead:
			reason = status.Errorf(status.TransportError, "shm: connection to %s lost while waiting for a lease: %v",
				c.cl.name, c.deadErr())
			break wait
		case <-j.timer.C:
			reason = status.Errorf(status.Timeout, "shm: %s did not grant the lease by the deadline", c.cl.name)
			break wait
		case <-t.done:
			reason = core.ErrUninstalled
			break wait
		case <-j.wake:
			if j.allCanceled(lo, hi) {
				reason = errCanceled
				break wait
			}
		}
	}
	if t.closing.Load() {
		reason = core.ErrUninstalled
	}
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
	// The reader delivers under c.mu: past that lock, a grant is either
	// in the channel or will never come (the reader releases it itself).
	select {
	case <-j.granted:
		c.release(id)
	default:
	}
	return reason
}

func (j *job) lostErr() error {
	return status.Errorf(status.TransportError, "shm: connection to %s lost during the copy", j.c.cl.name)
}

// stopErr says why request i must not be copied (further): uninstall,
// a dead connection (the target has released the lease), cancel, or the
// lease's deadline. The clock is read only every MiB.
func (j *job) stopErr(i int, n uint64) error {
	if j.t.closing.Load() {
		return core.ErrUninstalled
	}
	if j.c.isDead() {
		return j.lostErr()
	}
	if j.cancel[i].Load() {
		return errCanceled
	}
	if j.grants != nil && j.grants[i-j.lo].dead.Load() {
		// A failing connection marks its grants dead too, after it is
		// dead: look again, so that a lost peer is not reported as an
		// unregistration.
		if j.c.isDead() {
			return j.lostErr()
		}
		return status.Errorf(status.NotRegistered, "shm: %s unregistered the memory during the copy", j.c.cl.name)
	}
	j.unTimed += n
	if j.unTimed >= 1<<20 {
		j.unTimed = 0
		if !time.Now().Before(j.stop) {
			return status.Errorf(status.Timeout, "shm: lease deadline passed before the copy ended")
		}
	}
	return nil
}

// copyAll copies the granted requests of the lease: through the target's
// mapped memfd when the grant names an allocation this connection has
// mapped, otherwise with process_vm. A memory fault (a target that shrank
// its memfd, a caller that unmapped its buffer) fails the request instead
// of the process.
func (j *job) copyAll(lo, hi int) {
	if h := j.t.hooks.beforeCopy.Load(); h != nil {
		(*h)()
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	j.unTimed = 1 << 20 // read the clock before the first copy
	j.unmerged = 0
	for i := lo; i < hi; {
		i = j.copyFrom(i, lo, hi)
	}
	j.putMap()
	j.flushPVM(core.OpRead)
	j.flushPVM(core.OpWrite)
	for op := range j.pv {
		j.pv[op].reset()
	}
	// Counted once per run: an atomic add after each request's copy
	// waited for that copy's stores to drain.
	j.t.bytesMapped.Add(j.mapped)
	j.mapped = 0
}

// mapFor returns the live mapping of allocation id with a reference held
// by j (j.curMap), or nil. The reference taken for one request serves the
// next ones of the same allocation: a reference keeps the mapping mapped,
// and a mapping dropped meanwhile (revoke, descriptor check, dead
// connection) is given back and looked up again, so it is never used
// after its drop, exactly as with a lookup per request.
func (j *job) mapFor(id uint64) *mapping {
	if m := j.curMap; m != nil {
		if m.alloc == id && !m.dropped.Load() {
			return m
		}
		j.putMap()
	}
	j.curMap = j.c.getMapping(id)
	return j.curMap
}

// putMap gives back the reference mapFor took.
func (j *job) putMap() {
	if m := j.curMap; m != nil {
		j.curMap = nil
		j.c.putMapping(m)
	}
}

// mergeMax bounds the bytes one copy step through a mapping moves for
// requests that continue each other on both sides: under memmove's 1 MiB
// threshold for non-temporal stores, so a merged step copies as its
// requests alone would, and a revoke or cancel waits for at most that.
const mergeMax = 512 << 10

func (j *job) copyFrom(i, lo, hi int) (next int) {
	defer func() {
		if p := recover(); p != nil {
			j.putMap()
			if j.curEnd > j.cur+1 {
				// A merged step faulted: its requests go again one by
				// one, so that the fault fails only its own.
				j.unmerged = j.curEnd
				next = j.cur
				return
			}
			j.errs[j.cur] = status.Errorf(status.TransportError, "shm: memory fault while copying: %v", p)
			next = j.cur + 1
		}
	}()
	for ; i < hi; i++ {
		if j.errs[i] != nil {
			continue // failed its checks while a step before it was merged
		}
		j.cur, j.curEnd = i, i+1
		r := j.reqs[i]
		alloc, ok := j.allocOf(i, lo)
		if !ok {
			continue
		}
		if err := j.stopErr(i, r.Len); err != nil {
			j.errs[i] = err
			continue
		}
		if alloc != 0 {
			if m := j.mapFor(alloc); m != nil {
				end := j.mergeEnd(i, lo, hi, m)
				j.curEnd = end
				j.cachedCopyHook()
				if j.copyMapped(i, end, m) {
					i = end - 1
					continue
				}
			}
		}
		j.addPVM(i)
	}
	return hi
}

// allocOf returns the allocation request i of the run from lo copies
// through (0: process_vm only), or records the target's refusal of it
// and reports false.
func (j *job) allocOf(i, lo int) (uint64, bool) {
	if j.grants != nil {
		return j.grants[i-lo].alloc, true // a standing grant: checked for the request when it was held
	}
	g := &j.grant[i-lo]
	if g.code != status.OK {
		r := j.reqs[i]
		j.errs[i] = status.Errorf(g.code, "shm: %s refused remote %s of [%#x, %#x): %s",
			j.c.cl.name, opName(r.Op), r.Remote, r.Remote+r.Len, g.msg)
		return 0, false
	}
	return g.alloc, true
}

// mergeEnd returns the end of the copy step through m that starts with
// request i, checked: past the requests after it that continue it on
// both sides with its op, through m's allocation, inside m and mergeMax
// bytes in all, and that pass every check they would pass before a step
// of their own (the target's grant, stopErr, m not dropped); i+1 when
// none does. A request that fails its checks ends the step, its error
// recorded, and is not copied. The step then copies its requests at once:
// a revoke, cancel or drop that comes after its checks stops the requests
// of later steps, as one that comes during a single request's copy does.
func (j *job) mergeEnd(i, lo, hi int, m *mapping) int {
	r := j.reqs[i]
	if i < j.unmerged || r.Len >= mergeMax || !m.holds(r.Op, r.Remote, r.Len) {
		return i + 1
	}
	local, remote, n := r.Local+r.Len, r.Remote+r.Len, r.Len
	k := i + 1
	for ; k < hi; k++ {
		q := j.reqs[k]
		if q.Op != r.Op || q.Local != local || q.Remote != remote || q.Len > mergeMax-n ||
			!m.holds(r.Op, r.Remote, n+q.Len) || m.dropped.Load() {
			break
		}
		alloc, ok := j.allocOf(k, lo)
		if !ok || alloc != m.alloc {
			break
		}
		if err := j.stopErr(k, q.Len); err != nil {
			j.errs[k] = err
			break
		}
		local, remote, n = local+q.Len, remote+q.Len, n+q.Len
	}
	return k
}

// holds reports whether m can serve op on the target's [addr, addr+n).
func (m *mapping) holds(op core.Op, addr, n uint64) bool {
	if addr < m.base || (op == core.OpWrite && !m.writable) {
		return false
	}
	off := addr - m.base
	return off <= m.size && n <= m.size-off
}

// cachedCopyHook runs the inCachedCopy test hook in a copy under
// standing grants, past its last check before the copy step.
func (j *job) cachedCopyHook() {
	if h := j.t.hooks.inCachedCopy.Load(); h != nil && j.grants != nil {
		(*h)()
	}
}

func opName(op core.Op) string {
	if op == core.OpRead {
		return "read"
	}
	return "write"
}

// copyMapped copies requests i to end (a step mergeEnd formed: end is
// i+1, or they continue each other on both sides) through m, a single
// request in steps of at most chunk bytes. It reports false, having
// copied nothing, when m cannot serve them.
func (j *job) copyMapped(i, end int, m *mapping) bool {
	r, last := j.reqs[i], j.reqs[end-1]
	size := last.Local + last.Len - r.Local
	if !m.holds(r.Op, r.Remote, size) {
		return false
	}
	off := r.Remote - m.base
	remote := m.mem[off : off+size]
	local := host.Bytes(r.Local, size)
	for done := uint64(0); done < size; {
		n := min(chunk, size-done)
		if done > 0 {
			if err := j.stopErr(i, n); err != nil {
				j.errs[i] = err
				return true
			}
		}
		if r.Op == core.OpRead {
			copy(local[done:done+n], remote[done:done+n])
		} else {
			copy(remote[done:done+n], local[done:done+n])
		}
		done += n
	}
	j.mapped += int64(size)
	return true
}

// addPVM queues request i for process_vm, in pieces of at most chunk
// bytes, flushing whenever a call's worth (IOV_MAX iovecs or chunk bytes)
// has gathered.
func (j *job) addPVM(i int) {
	r := j.reqs[i]
	b := &j.pv[r.Op]
	if k := len(b.local) - 1; k >= 0 && b.last[k] == int32(i-1) && r.Len <= chunk-uint64(b.local[k].Len) &&
		uintptr(unsafe.Pointer(b.local[k].Base))+uintptr(b.local[k].Len) == uintptr(r.Local) &&
		b.remote[k].Base+uintptr(b.remote[k].Len) == uintptr(r.Remote) {
		// Request i continues the previous one on both sides.
		b.local[k].SetLen(int(b.local[k].Len) + int(r.Len))
		b.remote[k].Len += int(r.Len)
		b.last[k] = int32(i)
		b.bytes += r.Len
		if b.bytes >= chunk {
			j.flushPVM(r.Op)
		}
		return
	}
	for off := uint64(0); off < r.Len; {
		n := min(chunk, r.Len-off)
		var lv unix.Iovec
		lv.Base = &host.Bytes(r.Local+off, n)[0]
		lv.SetLen(int(n))
		b.local = append(b.local, lv)
		b.remote = append(b.remote, unix.RemoteIovec{Base: uintptr(r.Remote + off), Len: int(n)})
		b.owner = append(b.owner, int32(i))
		b.last = append(b.last, int32(i))
		b.bytes += n
		off += n
		if len(b.local) == iovMax || b.bytes >= chunk {
			j.flushPVM(r.Op)
		}
	}
}

// flushPVM runs the queued process_vm calls of one direction, resuming
// after partial transfers, and fails the requests from the point where
// the kernel refused. A call of pvmSplitMin bytes or more is split in two
// halves that run on two threads: one process_vm call copies on one CPU,
// at about half of what the memory bus takes.
func (j *job) flushPVM(op core.Op) {
	b := &j.pv[op]
	defer b.reset()
	if len(b.local) == 0 {
		return
	}
	j.unTimed = 1 << 20 // a call moves up to chunk bytes: read the clock before each
	if err := j.stopErr(int(b.owner[0]), 0); err != nil {
		j.failFrom(b, 0, err)
		return
	}
	j.cachedCopyHook()
	pid := j.c.pid
	if pid <= 0 {
		j.t.denyPVM(j.c.cl.inc)
		j.t.fallbacks.Add(1)
		j.failFrom(b, 0, status.Errorf(status.TransportError,
			"shm: %s's pid is not visible from here (another pid namespace): no process_vm", j.c.cl.name))
		return
	}
	if b.bytes < pvmSplitMin || runtime.GOMAXPROCS(0) < 2 {
		if k, err := j.t.processVMAll(op, pid, b); err != nil {
			j.failFrom(b, k, j.pvmError(op, err))
		}
		return
	}
	h := &j.half
	defer h.reset()
	b.splitInto(h)
	var (
		wg   sync.WaitGroup
		hk   int
		herr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		hk, herr = j.t.processVMAll(op, pid, h)
	}()
	k, err := j.t.processVMAll(op, pid, b)
	wg.Wait()
	var first error
	if err != nil {
		first = j.pvmError(op, err)
		j.failFrom(b, k, first)
	}
	if herr != nil {
		// The same refusal twice is one event (one fallback, one denial).
		if first == nil || !errors.Is(herr, err) {
			first = j.pvmError(op, herr)
		}
		j.failFrom(h, hk, first)
	}
}

// splitInto moves the second half of b's bytes into h (reset), cutting
// the iovec that straddles the middle in two; both pieces keep its owner.
func (b *pvmBatch) splitInto(h *pvmBatch) {
	h.reset()
	half := b.bytes / 2
	var acc uint64
	k := 0
	for ; k < len(b.local); k++ {
		l := uint64(b.local[k].Len)
		if acc+l > half {
			break
		}
		acc += l
	}
	if k == len(b.local) {
		return
	}
	if cut := half - acc; cut > 0 {
		lv := b.local[k]
		rv := b.remote[k]
		var tail unix.Iovec
		tail.Base = (*byte)(unsafe.Add(unsafe.Pointer(lv.Base), cut))
		tail.SetLen(int(uint64(lv.Len) - cut))
		h.local = append(h.local, tail)
		h.remote = append(h.remote, unix.RemoteIovec{Base: rv.Base + uintptr(cut), Len: rv.Len - int(cut)})
		h.owner = append(h.owner, b.owner[k])
		h.last = append(h.last, b.last[k])
		b.local[k].SetLen(int(cut))
		b.remote[k].Len = int(cut)
		acc += cut
		k++
	}
	h.local = append(h.local, b.local[k:]...)
	h.remote = append(h.remote, b.remote[k:]...)
	h.owner = append(h.owner, b.owner[k:]...)
	h.last = append(h.last, b.last[k:]...)
	b.local, b.remote, b.owner, b.last = b.local[:k], b.remote[:k], b.owner[:k], b.last[:k]
	h.bytes = b.bytes - acc
	b.bytes = acc
}

// errNoProgress: a process_vm call returned 0 bytes without an error.
var errNoProgress = errors.New("no progress")

// processVMAll copies every iovec of b, resuming after partial transfers.
// On failure it returns the index of the first iovec not fully copied.
// It touches nothing of the job, so two halves may run at once.
func (t *Transport) processVMAll(op core.Op, pid int, b *pvmBatch) (int, error) {
	for k := 0; k < len(b.local); {
		n, err := t.processVM(op, pid, b.local[k:], b.remote[k:])
		if err == nil && n <= 0 {
			err = errNoProgress
		}
		if err != nil {
			return k, err
		}
		t.bytesPVM.Add(int64(n))
		for left := uint64(n); left > 0 && k < len(b.local); {
			if l := uint64(b.local[k].Len); left >= l {
				left -= l
				k++
				continue
			}
			b.local[k].Base = (*byte)(unsafe.Add(unsafe.Pointer(b.local[k].Base), left))
			b.local[k].SetLen(int(uint64(b.local[k].Len) - left))
			b.remote[k].Base += uintptr(left)
			b.remote[k].Len -= int(left)
			left = 0
		}
	}
	return len(b.local), nil
}

// failFrom fails the requests of iovecs k and after: of an iovec shared
// by several requests, those whose local bytes it still holds (the kernel
// copied the rest, and a split call cut the others off into its other
// half).
func (j *job) failFrom(b *pvmBatch, k int, err error) {
	for ; k < len(b.owner); k++ {
		lo := uint64(uintptr(unsafe.Pointer(b.local[k].Base)))
		hi := lo + uint64(b.local[k].Len)
		for i := b.owner[k]; i <= b.last[k]; i++ {
			if r := j.reqs[i]; j.errs[i] == nil && r.Local < hi && r.Local+r.Len > lo {
				j.errs[i] = err
			}
		}
	}
}

func (t *Transport) processVM(op core.Op, pid int, local []unix.Iovec, remote []unix.RemoteIovec) (int, error) {
	if h := t.hooks.processVM.Load(); h != nil {
		if err := (*h)(op); err != nil {
			return 0, err
		}
	}
	if op == core.OpRead {
		return unix.ProcessVMReadv(pid, local, remote, 0)
	}
	return unix.ProcessVMWritev(pid, local, remote, 0)
}

// pvmError turns a process_vm failure into the request's error. Refusals
// are TransportError, so the engine retries the request on the next
// transport; a peer whose kernel refused is not offered process_vm work
// again.
func (j *job) pvmError(op core.Op, err error) error {
	c := j.c
	call := "process_vm_writev"
	if op == core.OpRead {
		call = "process_vm_readv"
	}
	switch {
	case errors.Is(err, errNoProgress):
		return status.Errorf(status.TransportError, "shm: %s on %s (pid %d) made no progress", call, c.cl.name, c.pid)
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOSYS):
		j.t.denyPVM(c.cl.inc)
		j.t.fallbacks.Add(1)
		return status.Errorf(status.TransportError,
			"shm: the kernel refused %s on %s (pid %d): %w (it needs ptrace permission over the peer)", call, c.cl.name, c.pid, err)
	case errors.Is(err, unix.ESRCH):
		j.t.fallbacks.Add(1)
		j.t.e.InvalidatePeer(c.cl.peer.Name())
		return status.Errorf(status.TransportError, "shm: %s: peer %s (pid %d) is gone: %w", call, c.cl.name, c.pid, err)
	default:
		return status.Errorf(status.TransportError, "shm: %s on %s (pid %d): %w", call, c.cl.name, c.pid, err)
	}
}
