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

// Help lets the goroutine waiting for r's batch run the batch's job
// itself, if the job goroutine has not claimed it yet: the copy then runs
// on the waiting thread, which finds the batch complete instead of
// sleeping until a job goroutine wakes it (for a C thread in
// tent_batch_wait, two thread switches a batch). The claim is exactly
// once: whichever of the waiter and the job goroutine claims the job runs
// it, the other does nothing. The waiter copies only what needs no round
// trip, exactly as the job would (copyCached), in parts it can finish
// before until (helpBudget); whatever is left, it hands to a new job
// goroutine.
func (t *Transport) Help(r *core.Request, done <-chan struct{}, until time.Time) {
	t.mu.Lock()
	j := t.queued[r]
	if j == nil {
		t.mu.Unlock()
		return
	}
	delete(t.queued, r)
	gen := j.gen
	// The job is not back in the pool, so its goroutine (counted in t.wg)
	// has not ended: adding here cannot race Uninstall's Wait.
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	if !j.claimed(gen) {
		return // the job goroutine has it
	}
	t.help(j, until)
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
		if end == lo || !j.copyCached(lo, end) {
			t.mu.Lock()
			t.spawnLocked(func() { t.run(j, lo) }) // legal after close: this call still holds t.wg
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
