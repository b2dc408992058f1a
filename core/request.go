package core

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Op is a transfer direction, seen from the initiator.
type Op uint8

const (
	OpRead  Op = 0 // remote -> local
	OpWrite Op = 1 // local -> remote
)

// Status flags of a request (FlagStaged is in staging.go).
const FlagRetried uint32 = 1

// MaxNotifyLen bounds a notification message.
const MaxNotifyLen = 64 << 10

// TransferRequest is one request as the caller states it.
type TransferRequest struct {
	Op      Op
	Local   uint64
	Segment *Segment
	Remote  uint64
	Len     uint64
}

// TransferOptions apply to a whole batch.
type TransferOptions struct {
	Timeout   time.Duration // 0 = the engine's default
	Notify    []byte        // delivered to each target after the data
	Transport string        // "" = choose per request
	// Waiting promises that the submitting goroutine waits for the batch
	// (Wait with a negative timeout) as soon as Submit returns, as a
	// blocking transfer does: movers that can (Helper) then leave the
	// replies of its requests for that goroutine to read.
	Waiting bool
}

// Mover is a transport that moves data. Submit returns at once; the mover
// then calls Done exactly once per request, at the latest shortly after the
// request's Deadline. After Done the mover must not touch the request's
// memory again; a mover that does not touch the request itself either
// says so (Forgetter), and its batches' requests are reused.
type Mover interface {
	Transport
	// Eligible reports whether the mover can serve r; cheap, never blocks.
	Eligible(r *Request) bool
	Submit(reqs []*Request)
}

// RegionEligible is a Mover whose Eligible answer depends only on a
// request's Peer, Desc, LocalRegion and RemoteRegion (and on the mover's
// own state), never on its addresses, length or op. Routing then asks it
// once per run of consecutive requests that share those, not once per
// request; a run's answer is its first request's.
type RegionEligible interface {
	Mover
	// EligibleByRegion is the promise above; it does nothing.
	EligibleByRegion()
}

// Canceler is implemented by movers that can abandon requests early (when
// a batch is destroyed while in flight); they still call Done.
type Canceler interface {
	Cancel(reqs []*Request)
}

// Helper is implemented by movers that can put a waiting caller's
// goroutine to work: a transport that reads replies from a socket can let
// the caller read its own reply, and one that copies on a queue can let
// the caller run the copy, instead of a goroutine that does the work and
// then wakes the caller (two wake-ups where one does).
type Helper interface {
	// Help is called by a goroutine about to wait for done (the batch's
	// Done) to close; r is a request of that batch the mover was given.
	// until is when the wait gives up (zero: no limit but the batch's
	// deadline): Help must not start work it cannot finish by then, so a
	// timed wait overruns its timeout by at most one step already under
	// way. Help may return at any time (the caller then waits as usual),
	// and must return soon after done closes, after until passes, and
	// when the mover is uninstalled. It is called outside the mover's
	// gate, so also after Uninstall.
	Help(r *Request, done <-chan struct{}, until time.Time)
}

// Request is one request in flight. Movers read its exported fields and
// report with Done. (Fields are laid out pointers first, then by size, so
// a batch's slab of them is as small as it can be: 136 bytes each.)
type Request struct {
	Local        uint64 // local address, inside LocalRegion
	Remote       uint64 // address in the peer's memory
	Len          uint64
	Peer         *Peer
	Desc         *wire.SegmentDesc // the peer's descriptor used for routing
	RemoteRegion *wire.RegionDesc  // the peer's region containing the range, inside Desc (read only)
	LocalRegion  *Region           // held until Done
	Deadline     time.Time

	batch *Batch
	mover atomic.Pointer[installed] // nil: the batch's (moverOf)
	bytes atomic.Uint64             // Done's n; DoneAll sets reqMovedAll instead

	index int32
	// status is the request's code less Pending (code, finalize): a
	// cleared Request is pending, so Submit stores nothing to start one.
	status atomic.Int32
	flags  atomic.Uint32
	nic    atomic.Uint32 // MarkNIC: first | count<<16

	state   atomic.Uint32 // reqSettled | reqCallerWaits
	lastTry atomic.Bool   // no attempt may follow the current one (it is a retry, or routing failed)
	Op      Op
	pinned  bool // the caller named the transport: no retry elsewhere
}

// code is the request's status: Pending until finalize.
func (r *Request) code() status.Code { return status.Code(r.status.Load()) + status.Pending }

// finalize gives r its final code c, unless it has one; it reports
// whether this call did.
func (r *Request) finalize(c status.Code) bool {
	return r.status.CompareAndSwap(0, int32(c-status.Pending))
}

// Bits of Request.state.
const (
	// reqSettled: the mover of the request's last attempt called Done.
	reqSettled uint32 = 1 << iota
	// reqCallerWaits: this attempt was handed to its mover on the
	// submitting goroutine of a Waiting batch, which will call Help next.
	reqCallerWaits
	// reqMovedAll: DoneAll settled the request, all its bytes moved
	// (set with reqSettled, so the request's bytes need no store of their
	// own).
	reqMovedAll
)

// moverOf is the mover of r's current attempt (nil before dispatch): its
// own, or else its batch's, which dispatch sets instead of one store per
// request when it hands a mover the whole batch at once.
func (r *Request) moverOf() *installed {
	if m := r.mover.Load(); m != nil {
		return m
	}
	return r.batch.mover.Load()
}

// movedBytes is what the request's status reports as moved.
func (r *Request) movedBytes() uint64 {
	if r.state.Load()&reqMovedAll != 0 {
		return r.Len
	}
	return r.bytes.Load()
}

// settleAll settles r with all its bytes moved (DoneAll), unless it was
// settled already (a duplicate): one atomic operation for both.
func (r *Request) settleAll() bool {
	for {
		s := r.state.Load()
		if s&reqSettled != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s|reqSettled|reqMovedAll) {
			return true
		}
	}
}

func (r *Request) isSettled() bool { return r.state.Load()&reqSettled != 0 }

func (r *Request) setCallerWaits(on bool) {
	if on {
		r.state.Or(reqCallerWaits)
	} else {
		r.state.And(^reqCallerWaits)
	}
}

// CallerWaits reports, to a mover in Submit, that the goroutine
// submitting r waits for its batch right after Submit returns and calls
// the mover's Help (if it is a Helper) with it: the mover may leave the
// work of completing r to that goroutine. A mover that relies on it must
// still complete r, if Help never comes, by some bounded time.
func (r *Request) CallerWaits() bool { return r.state.Load()&reqCallerWaits != 0 }

// Index is the request's position in its batch.
func (r *Request) Index() int { return int(r.index) }

// Done reports the outcome of the request's current attempt: n bytes moved
// and err (nil on success). A transport failure is retried once on the next
// eligible transport, unless the caller named the transport. A second Done
// for one attempt is ignored (and counted): it is a transport bug, and
// panicking here would take the host process down.
func (r *Request) Done(n uint64, err error) {
	err = sanitize(err)
	if err != nil && !r.pinned && !r.lastTry.Load() && status.CodeOf(err) == status.TransportError &&
		r.code() == status.Pending {
		if next := r.batch.e.nextMover(r); next != nil {
			r.batch.e.log.Debug("retrying request on the next transport", "peer", r.Peer.name,
				"from", r.moverOf().t.Name(), "to", next.t.Name(), "reason", err)
			r.lastTry.Store(true)
			r.flags.Or(FlagRetried)
			r.setCallerWaits(false) // retried off the caller's goroutine
			r.batch.e.dispatch(next, []*Request{r})
			return
		}
	}
	if r.state.Or(reqSettled)&reqSettled != 0 {
		r.batch.e.duplicateDone.Add(1)
		return
	}
	r.bytes.Store(n)
	// Let go of the memory before the caller can see the request finished:
	// a caller that frees its buffer on completion must never race a
	// transport still holding it.
	b := r.batch
	r.LocalRegion.release()
	b.settle()
	b.finish(r, status.CodeOf(err), err)
}

// DoneAll reports every request of rs done with all its bytes moved, as
// Done(r.Len, nil) for each would (a duplicate is ignored and counted the
// same way), but takes the counters that a run of requests shares once
// per run: its batch's (consecutive requests of one batch) and its local
// region's (consecutive requests in one region), instead of once per
// request. A mover that completes requests in runs calls it instead of a
// loop of Done.
func DoneAll(rs []*Request) {
	for len(rs) > 0 {
		b := rs[0].batch
		k := 1
		for k < len(rs) && k < 64 && rs[k].batch == b {
			k++
		}
		b.doneRun(rs[:k])
		rs = rs[k:]
	}
}

// doneRun is DoneAll for at most 64 requests of b, in Done's order: every
// local region let go of, then the requests settled, then finished.
func (b *Batch) doneRun(rs []*Request) {
	var first uint64 // bit i: rs[i] settles here (not a duplicate)
	var region *Region
	uses := int64(0)
	for i, r := range rs {
		if !r.settleAll() {
			b.e.duplicateDone.Add(1)
			continue
		}
		first |= 1 << i
		if r.LocalRegion != region {
			region.releaseN(uses)
			region, uses = r.LocalRegion, 0
		}
		uses++
	}
	region.releaseN(uses)
	n := int64(bits.OnesCount64(first))
	if n == 0 {
		return
	}
	if b.unsettled.Add(-n) == 0 {
		b.allSettled()
	}
	won := int64(0)
	for i, r := range rs {
		if first&(1<<i) != 0 && r.finalize(status.OK) {
			won++
		}
	}
	if won > 0 && b.pending.Add(-won) == 0 {
		b.allFinal()
	}
}

// sanitize makes sure a failure reads as a failure: an error without a
// code is the transport's (retryable, as safeCall treats it), and one that
// claims OK or Pending is a bug reported as internal.
func sanitize(err error) error {
	switch {
	case err == nil:
		return nil
	case !status.HasCode(err):
		return status.Errorf(status.TransportError, "%w", err)
	case status.CodeOf(err) >= 0:
		return status.Errorf(status.Internal, "transport completed a request with a non-error code: %w", err)
	}
	return err
}

// Batch is a set of requests submitted together.
type Batch struct {
	e        *Engine
	reqs     []Request
	ptrs     []*Request // pointers to reqs, handed to movers (routing reorders them)
	deadline time.Time
	notify   []byte

	// mover is the mover of every request whose own is nil (moverOf):
	// set once, when dispatch hands one mover the whole batch at once.
	mover     atomic.Pointer[installed]
	pending   atomic.Int64 // requests without a final status
	unsettled atomic.Int64 // requests a mover (or routing) still holds, and movers' Submit calls in progress
	done      chan struct{}
	settledCh chan struct{}
	timer     *deadlineTimer // on mu until allFinal; goes back with the slab when it never fired
	timeout   time.Duration

	// uses counts the caller's calls in progress (Status, Wait, Cancel),
	// in units of useOne, above the bits batchReleased and batchRecycled.
	uses atomic.Int64
	// keep: the requests must not be reused (some attempt went to a mover
	// that is not a Forgetter, or the engine was closing at release).
	keep atomic.Bool

	mu           sync.Mutex
	timerStopped bool // allFinal stopped the deadline timer before it fired
	errs         map[int]error
	notifyErr    error
}

// Bits and unit of Batch.uses.
const (
	batchReleased int64 = 1 << iota // ReleaseBatch was called
	batchRecycled                   // the requests went back to the engine's slabs
	useOne
)

// enter counts a call of the caller's on the batch; false once its
// requests belong to the engine again (released and reused).
func (b *Batch) enter() bool {
	for {
		u := b.uses.Load()
		if u&batchRecycled != 0 {
			return false
		}
		if b.uses.CompareAndSwap(u, u+useOne) {
			return true
		}
	}
}

// exit ends an enter; the last call out of a released batch recycles it.
func (b *Batch) exit() {
	if b.uses.Add(-useOne) == batchReleased {
		b.recycle()
	}
}

// release marks the batch released (ReleaseBatch) and recycles it unless a
// call is still in progress.
func (b *Batch) release() {
	if b.uses.Or(batchReleased) == 0 {
		b.recycle()
	}
}

// recycle gives the batch's requests back to the engine's slabs when
// nothing can reach them any more: the caller released the batch and no
// call of its is in progress (uses), every request is final (done: no
// notification goroutine, no finish) and settled (no mover holds one, no
// mover's Submit is running), every attempt went to a Forgetter (keep),
// and the deadline timer was stopped before it fired (its expire never
// runs). Otherwise the garbage collector takes them, as before reuse.
func (b *Batch) recycle() {
	if b.keep.Load() {
		return
	}
	select {
	case <-b.settledCh:
	default:
		return
	}
	select {
	case <-b.done:
	default:
		return
	}
	b.mu.Lock()
	stopped := b.timerStopped
	b.mu.Unlock()
	if stopped && b.uses.CompareAndSwap(batchReleased, batchReleased|batchRecycled) {
		b.e.slabs.put(slab{b.reqs, b.ptrs, b.timer})
	}
}

var errReleased = status.Errorf(status.InvalidHandle, "batch was released")

// Len returns the number of requests.
func (b *Batch) Len() int { return len(b.reqs) }

// Deadline is the batch's deadline.
func (b *Batch) Deadline() time.Time { return b.deadline }

// RequestStatus is what a caller sees of one request.
type RequestStatus struct {
	Code      status.Code
	Transport uint32
	Bytes     uint64
	Flags     uint32
	// NIC and NICs, valid with FlagNIC: the first local NIC that carried
	// the request and how many did (MarkNIC).
	NIC, NICs uint16
}

// Status copies the request statuses into out and returns the batch
// outcome: OK, Pending, or the first failure. After ReleaseBatch it may
// report InvalidHandle (errReleased), as may Wait and Cancel: the requests
// may belong to a later batch by then.
func (b *Batch) Status(out []RequestStatus) (status.Code, int, error) {
	if !b.enter() {
		return status.InvalidHandle, 0, errReleased
	}
	defer b.exit()
	completed := 0
	firstErr := -1
	for i := range b.reqs {
		r := &b.reqs[i]
		c := r.code()
		if i < len(out) {
			nic := r.nic.Load()
			var transport uint32 // the id of the mover of the request's last attempt
			if m := r.moverOf(); m != nil {
				transport = m.id
			}
			out[i] = RequestStatus{Code: c, Transport: transport, Bytes: r.movedBytes(), Flags: r.flags.Load(),
				NIC: uint16(nic), NICs: uint16(nic >> 16)}
		}
		if c != status.Pending {
			completed++
			if c != status.OK && firstErr < 0 {
				firstErr = i
			}
		}
	}
	switch {
	case completed < len(b.reqs):
		return status.Pending, completed, nil
	case firstErr >= 0:
		return b.reqs[firstErr].code(), completed, b.requestError(firstErr)
	}
	select {
	case <-b.done:
	default:
		return status.Pending, completed, nil // notification still on its way
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.notifyErr != nil {
		return status.CodeOf(b.notifyErr), completed, b.notifyErr
	}
	return status.OK, completed, nil
}

func (b *Batch) requestError(i int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.errs[i]; err != nil {
		return status.Errorf(status.CodeOf(err), "request %d: %w", i, err)
	}
	c := b.reqs[i].code()
	e, _ := status.Lookup(c)
	return status.Errorf(c, "request %d: %s", i, e.Text)
}

func (b *Batch) setError(i int, err error) {
	b.mu.Lock()
	if b.errs == nil {
		b.errs = map[int]error{}
	}
	if b.errs[i] == nil {
		b.errs[i] = err
	}
	b.mu.Unlock()
}

// Wait blocks until every request has a final status or timeout passes
// (negative: the batch deadline plus a grace period). Either way the
// waiting goroutine is lent to the mover first (Helper).
func (b *Batch) Wait(timeout time.Duration) (status.Code, error) {
	if !b.enter() {
		return status.InvalidHandle, errReleased
	}
	defer b.exit()
	select {
	case <-b.done: // finished already: no timer
		c, _, err := b.Status(nil)
		return c, err
	default:
	}
	if timeout < 0 {
		b.help(time.Time{})
	}
	if timeout < 0 && len(b.notify) == 0 {
		// The batch's own deadline timer finishes every request by the
		// deadline, which closes done: no second timer per wait.
		<-b.done
		c, _, err := b.Status(nil)
		return c, err
	}
	helped := timeout < 0
	if timeout < 0 {
		timeout = addGrace(time.Until(b.deadline), time.Second)
	}
	if timeout > 0 {
		until := time.Now().Add(timeout)
		if !helped {
			b.help(until)
		}
		select {
		case <-b.done:
		default:
			if left := time.Until(until); left > 0 {
				t := time.NewTimer(left)
				select {
				case <-b.done:
				case <-t.C:
				}
				t.Stop()
			}
		}
	}
	c, _, err := b.Status(nil)
	if c == status.Pending {
		return status.Timeout, status.Errorf(status.Timeout, "batch still running after %v", timeout)
	}
	return c, err
}

// help lends the waiting goroutine to the mover of the first request
// still held, if that mover can use it (Helper), until until (zero: no
// limit). A panic in Help is the mover's bug: the caller then simply
// waits.
func (b *Batch) help(until time.Time) {
	for i := range b.reqs {
		r := &b.reqs[i]
		if r.isSettled() {
			continue
		}
		if m := r.moverOf(); m != nil {
			if h, ok := m.t.(Helper); ok {
				b.helpWith(m, h, r, until)
			}
		}
		return
	}
}

func (b *Batch) helpWith(m *installed, h Helper, r *Request, until time.Time) {
	defer func() {
		if p := recover(); p != nil {
			b.e.log.Error("transport panicked in Help; waiting without it", "transport", m.t.Name(), "panic", p)
		}
	}()
	h.Help(r, b.done, until)
}

// finish gives r its final visible status and error, once: whoever wins
// the status also records the message, so the two always agree.
func (b *Batch) finish(r *Request, code status.Code, err error) {
	if r.finalize(code) {
		if err != nil {
			b.setError(int(r.index), err)
		}
		if b.pending.Add(-1) == 0 {
			b.allFinal()
		}
	}
}

// settle records that a mover no longer holds a request.
func (b *Batch) settle() {
	if b.unsettled.Add(-1) == 0 {
		b.allSettled()
	}
}

func (b *Batch) allSettled() {
	close(b.settledCh)
	b.e.batchSettled(b)
}

func (b *Batch) allFinal() {
	b.mu.Lock()
	if b.timer != nil {
		b.timerStopped = b.timer.t.Stop()
	}
	b.mu.Unlock()
	if len(b.notify) == 0 {
		close(b.done)
		return
	}
	for i := range b.reqs {
		if b.reqs[i].code() != status.OK {
			close(b.done) // no notification for data that did not arrive
			return
		}
	}
	go func() {
		err := b.e.notifyTargets(b)
		b.mu.Lock()
		b.notifyErr = err
		b.mu.Unlock()
		close(b.done)
	}()
}

// expire fails every request still pending with code (Timeout, Canceled,
// Closed). Movers keep their requests until they call Done.
func (b *Batch) expire(code status.Code, why string) {
	// Never reused afterwards: a mover's Done may be between its settle
	// and its finish, and a Cancel that sees the batch settled returns
	// before that finish has run (it would land on a later batch's request).
	b.keep.Store(true)
	for i := range b.reqs {
		r := &b.reqs[i]
		if r.code() == status.Pending {
			b.finish(r, code, status.Errorf(code, "%s", why))
		}
	}
}

// Cancel fails what is pending with ErrCanceled, asks the movers to stop,
// and waits (until the deadline plus grace) for them to let go of the
// requests, so no transfer touches local memory afterwards. It reports
// whether they all did.
func (b *Batch) Cancel() bool {
	if !b.enter() {
		return true // released and reused: nothing of it was held
	}
	defer b.exit()
	b.expire(status.Canceled, "batch destroyed while in flight")
	b.e.cancelMovers(b)
	t := time.NewTimer(addGrace(time.Until(b.deadline), 2*time.Second))
	defer t.Stop()
	select {
	case <-b.settledCh:
		return true
	case <-t.C:
		return false
	}
}

// addGrace adds a grace period to d without overflowing: a deadline far in
// the future (a huge timeout) must still mean "wait", never "give up now".
func addGrace(d, grace time.Duration) time.Duration {
	if d > math.MaxInt64-grace {
		return math.MaxInt64
	}
	return d + grace
}

// Settled is closed when no mover holds any request of the batch.
func (b *Batch) Settled() <-chan struct{} { return b.settledCh }

// Done is closed when every request has its final status.
func (b *Batch) Done() <-chan struct{} { return b.done }

// ErrUninstalled is what movers report for requests they drop on Uninstall.
var ErrUninstalled = status.Errorf(status.Closed, "transport uninstalled while the request was in flight")
