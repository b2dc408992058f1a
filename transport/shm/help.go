//go:build linux

package shm

import (
	"math"
	"time"

	"github.com/tent-dev/tent/core"
)

// helpRate is the copy rate, in bytes per nanosecond (1 GB/s), a waiter
// counts on when it decides how much it may still start before its wait
// ends: well below what a memcpy or a process_vm call moves on a loaded
// host, so a timed wait overruns by at most the part in progress.
const helpRate = 1

// deferAfter is how many batches in a row their waiters must have claimed
// (Help) before Submit defers the next one's goroutine (shouldDefer); one
// deferred job that no waiter claimed in time starts the count again, so
// callers that poll instead of waiting pay deferWindow once, not per
// batch.
const deferAfter = 8

// defaultDeferWindow is how long a deferred job waits for its waiter
// before a goroutine runs it. The Go runtime fires timers this short
// within about a millisecond when every thread is idle (its poller sleeps
// in whole milliseconds), so that is what a caller that never waits pays.
const defaultDeferWindow = 100 * time.Microsecond

// Help lets the goroutine waiting for r's batch run the batch's job
// itself, if the job goroutine has not claimed it yet: the copy then runs
// on the waiting thread, which finds the batch complete instead of
// sleeping until a job goroutine wakes it (for a C thread in
// tent_batch_wait, two thread switches a batch). The claim is exactly
// once: whichever of the waiter and the job goroutine claims the job runs
// it, the other does nothing. The waiter copies only what needs no round
// trip, exactly as the job would (copyCached), in parts it can finish
// before until (helpBudget); whatever is left, it hands to a new job
// goroutine. A deferred job (no goroutine started for it, see
// queueLocked) is this call's alone.
func (t *Transport) Help(r *core.Request, done <-chan struct{}, until time.Time) {
	t.mu.Lock()
	j := t.queued[r]
	if j == nil {
		t.mu.Unlock()
		return
	}
	delete(t.queued, r)
	gen := j.gen
	if j.deferred {
		j.deferred = false
		j.fallback.Stop() // a late firing finds it no longer deferred
	}
	// The job is not back in the pool, so its goroutine (counted in t.wg)
	// has not ended, or it was deferred and t is open (Uninstall starts
	// every deferred job when it closes t, under t.mu): adding here cannot
	// race Uninstall's Wait.
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	if !j.claimed(gen) {
		return // the job goroutine has it
	}
	if t.waitersCame.Load() < deferAfter {
		t.waitersCame.Add(1)
	}
	t.help(j, until)
}

// shouldDefer says whether Submit may leave j to its waiter without
// starting its goroutine: the waiters of the last deferAfter batches came
// and claimed them, and j holds its batch's first request, the one the
// waiter's Help names (core lends the waiter to the mover of the first
// request not yet settled). t.mu is held.
func (t *Transport) shouldDefer(j *job) bool {
	return j.reqs[0].Index() == 0 && t.waitersCame.Load() >= deferAfter
}

// deferWindow is how long a deferred job waits for its waiter.
func (t *Transport) deferWindow() time.Duration {
	if h := t.hooks.deferWindow.Load(); h != nil {
		return *h
	}
	return defaultDeferWindow
}

// deferExpired runs on j's fallback timer: if j is still deferred, no
// waiter claimed it in time, so a goroutine runs it, and later batches
// start theirs at once until waiters have claimed deferAfter again. (A
// firing that comes late, for an earlier use of j, starts the current
// use early: a claim like any other.)
func (t *Transport) deferExpired(j *job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !j.deferred {
		return // claimed, or started by Cancel or Uninstall
	}
	t.undeferLocked(j)
	t.waitersCame.Store(0)
	t.deferExpiredN.Add(1)
}

// undeferLocked starts the goroutine of the deferred job j; t.mu is held.
// A deferred job exists only while t is open, or in Uninstall before its
// Wait.
func (t *Transport) undeferLocked(j *job) {
	j.deferred = false
	j.fallback.Stop()
	t.startLocked(j)
}

// help runs the claimed job j on the waiting goroutine: each lease run
// under standing grants, in parts of at most what helpBudget allows; the
// first part it may not or cannot copy, and everything after it, goes to
// a job goroutine.
func (t *Transport) help(j *job, until time.Time) {
	for lo := 0; lo < len(j.reqs); {
		hi := j.runEnd(lo)
		budget := t.helpBudget(until)
		end, bytes := lo, uint64(0)
		for end < hi && j.reqs[end].Len <= budget-bytes {
			bytes += j.reqs[end].Len
			end++
		}
		// Only a part this large can be longPVM: smaller ones skip its look.
		leaveLongPVM := bytes >= pvmHandOffCalls*chunk
		if end == lo || !j.copyCached(lo, end, leaveLongPVM) {
			from := lo // only this branch's closure captures it: lo stays off the heap
			t.mu.Lock()
			t.spawnLocked(func() { t.run(j, from) }) // legal after close: this call still holds t.wg
			t.mu.Unlock()
			return
		}
		t.copiesHelped.Add(1)
		j.complete(lo, end)
		lo = end
	}
	t.putJob(j)
}

// helpBudget is how many bytes a waiter may still start copying before
// until (zero: no limit), at helpRate.
func (t *Transport) helpBudget(until time.Time) uint64 {
	if h := t.hooks.helpBudget.Load(); h != nil {
		return (*h)(until)
	}
	if until.IsZero() {
		return math.MaxUint64
	}
	left := time.Until(until)
	if left <= 0 {
		return 0
	}
	return uint64(left.Nanoseconds()) * helpRate
}
