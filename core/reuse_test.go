package core_test

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/local"
)

// reuseSetup is an engine with only the given mover installed and four
// requests of 8 bytes to a peer.
func reuseSetup(t *testing.T, m core.Mover) (*core.Engine, []core.TransferRequest) {
	t.Helper()
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(m))
	return a, requestsFrom(t, a)
}

func requestsFrom(t *testing.T, a *core.Engine) []core.TransferRequest {
	t.Helper()
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite|core.PermRemoteRead)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 4)
	for i := range reqs {
		o := uint64(i) * 8
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + o, Segment: seg, Remote: host.Addr(dst) + o, Len: 8}
	}
	return reqs
}

func submitOK(t *testing.T, a *core.Engine, reqs []core.TransferRequest, o core.TransferOptions) *core.Batch {
	t.Helper()
	b, err := a.Submit(reqs, o)
	require.NoError(t, err)
	return b
}

func requireAllOK(t *testing.T, b *core.Batch) {
	t.Helper()
	code, err := b.Wait(10 * time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	st := make([]core.RequestStatus, b.Len())
	code, n, err := b.Status(st)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, b.Len(), n)
	for i, s := range st {
		require.Equal(t, core.RequestStatus{Code: status.OK, Bytes: 8}, core.RequestStatus{Code: s.Code, Bytes: s.Bytes}, "request %d", i)
	}
}

// A released batch whose requests went to a Forgetter gives its Request
// values to the next batch of its size, cleared of everything the first
// batch left, and reports itself released from then on.
func TestReleasedRequestsServeTheNextBatch(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	requireAllOK(t, first)
	old := first.RequestAt(0)
	a.ReleaseBatch(first)
	code, _, err := first.Status(nil)
	require.Equal(t, status.InvalidHandle, code)
	require.ErrorIs(t, err, status.ErrInvalidHandle)

	m.Hold()
	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	require.Same(t, old, next.RequestAt(0), "the released batch's requests were not reused")
	st := make([]core.RequestStatus, next.Len())
	code, n, _ := next.Status(st)
	require.Equal(t, status.Pending, code)
	require.Zero(t, n)
	for i, s := range st {
		require.Equal(t, core.RequestStatus{Code: status.Pending, Transport: s.Transport}, s, "request %d kept a value of the first batch", i)
		require.Equal(t, i, next.RequestAt(i).Index())
	}
	m.ReleaseAll()
	requireAllOK(t, next)
	a.ReleaseBatch(next)
	require.Zero(t, a.Stats().DuplicateCompletions)
}

// lateMover is a mover that is not a Forgetter: it completes what it is
// given, and keeps the requests so that the test can complete them again
// later, as a buggy transport might. With hold set it keeps new requests
// pending until release.
type lateMover struct {
	*coretest.Fake
	mu      sync.Mutex
	hold    bool
	seen    []*core.Request
	held    []*core.Request
	entered chan struct{}
}

func (m *lateMover) Eligible(*core.Request) bool { return true }

func (m *lateMover) Submit(reqs []*core.Request) {
	m.mu.Lock()
	m.seen = append(m.seen, reqs...)
	hold := m.hold
	if hold {
		m.held = append(m.held, reqs...)
	}
	m.mu.Unlock()
	if !hold {
		for _, r := range reqs {
			r.Done(r.Len, nil)
		}
	}
	m.entered <- struct{}{}
}

func (m *lateMover) completeAgain(rs []*core.Request, err error) {
	for _, r := range rs {
		r.Done(0, err)
	}
}

// A mover that is not a Forgetter may complete a request after its batch
// was released: that Done must land on the released batch's own request
// (counted as a duplicate), never on a request of a batch submitted since,
// which would then look finished while its mover still held its memory.
func TestLateCompletionCannotReachAReusedRequest(t *testing.T) {
	m := &lateMover{Fake: coretest.NewFake("late"), entered: make(chan struct{}, 16)}
	a, reqs := reuseSetup(t, m)
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.entered
	requireAllOK(t, first)
	a.ReleaseBatch(first)
	m.mu.Lock()
	late := append([]*core.Request(nil), m.seen...)
	m.hold = true
	m.mu.Unlock()

	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.entered
	for i := range reqs {
		require.NotSame(t, late[i], next.RequestAt(i), "a batch got the requests of a released batch a non-Forgetter served")
	}
	// The late completions, with a failure so that one landing on the
	// new batch would show in its statuses.
	m.completeAgain(late, status.Errorf(status.TransportError, "late"))
	require.EqualValues(t, len(late), a.Stats().DuplicateCompletions)
	st := make([]core.RequestStatus, next.Len())
	code, n, _ := next.Status(st)
	require.Equal(t, status.Pending, code, "a late completion of the released batch finished the new one")
	require.Zero(t, n)
	for i, s := range st {
		require.Equal(t, status.Pending, s.Code, "request %d", i)
	}
	m.mu.Lock()
	held := m.held
	m.mu.Unlock()
	for _, r := range held {
		r.Done(r.Len, nil)
	}
	requireAllOK(t, next)
	a.ReleaseBatch(next)
	// The released batch still reads as it ended: its requests were not
	// given to anyone.
	code, _, _ = first.Status(nil)
	require.Equal(t, status.OK, code)
}

// A batch that a Forgetter and then (on retry) another mover served is
// not reused either: one attempt outside a Forgetter is enough.
func TestRetryOnANonForgetterKeepsTheRequests(t *testing.T) {
	f := coretest.NewMover("forgets")
	f.FailWith(status.Errorf(status.TransportError, "first transport fails"))
	late := &lateMover{Fake: coretest.NewFake("late"), entered: make(chan struct{}, 16)}
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(f))
	require.NoError(t, a.Install(late))
	reqs := requestsFrom(t, a)
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-late.entered
	code, err := first.Wait(10 * time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	old := first.RequestAt(0)
	a.ReleaseBatch(first)
	f.FailWith(nil)
	next := submitOK(t, a, reqs, core.TransferOptions{})
	requireAllOK(t, next)
	require.NotSame(t, old, next.RequestAt(0))
}

// A batch released while a call of the caller's is inside it (a Wait on
// another thread) is reused only once that call is out, and the call sees
// its own batch's outcome.
func TestReleaseDuringAWaitRecyclesWhenTheWaitEnds(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	m.Hold()
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	waited := make(chan status.Code, 1)
	go func() {
		code, _ := first.Wait(-1)
		waited <- code
	}()
	for first.CallsInProgress() == 0 {
		runtime.Gosched()
	}
	a.ReleaseBatch(first) // not settled, and a wait is inside: nothing is reused yet
	old := first.RequestAt(0)
	m.ReleaseAll()
	require.Equal(t, status.OK, <-waited)
	m.Hold()
	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	require.Same(t, old, next.RequestAt(0), "the last call out of the released batch did not give its requests back")
	m.ReleaseAll()
	requireAllOK(t, next)
}

// A batch whose deadline timer fired is never reused: the timer's expire
// may still be walking its requests.
func TestExpiredBatchIsNotReused(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	m.Hold()
	first := submitOK(t, a, reqs, core.TransferOptions{Timeout: time.Millisecond})
	<-m.Entered()
	code, _ := first.Wait(-1)
	require.Equal(t, status.Timeout, code)
	m.ReleaseAll()
	<-first.Settled()
	old := first.RequestAt(0)
	a.ReleaseBatch(first)
	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	require.NotSame(t, old, next.RequestAt(0))
	m.ReleaseAll()
	requireAllOK(t, next)
}

// runMover completes each Submit call's requests in one DoneAll, twice
// (the second must count as duplicates and change nothing).
type runMover struct{ *coretest.Mover }

func (m runMover) Submit(reqs []*core.Request) {
	core.DoneAll(reqs)
	core.DoneAll(reqs)
}

// DoneAll completes a run as a Done per request would: every request OK
// with its bytes, the batch final and settled, each local region let go
// of as often as it was taken (requests in two regions, more than one
// chunk of 64), a second report counted as a duplicate.
func TestDoneAllCompletesARun(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(runMover{coretest.NewMover("runs")}))
	b := newLocalEngine(t, core.Options{})
	src1, r1 := buf(t, a, 4096, 0)
	src2, r2 := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	reqs := make([]core.TransferRequest, 100)
	for i := range reqs {
		src := src1
		if i >= 30 && i < 70 {
			src = src2
		}
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i), Segment: seg,
			Remote: host.Addr(dst) + uint64(i), Len: uint64(i%7 + 1)}
	}
	batch := submitOK(t, a, reqs, core.TransferOptions{})
	code, err := batch.Wait(10 * time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	<-batch.Settled()
	st := make([]core.RequestStatus, len(reqs))
	code, n, _ := batch.Status(st)
	require.Equal(t, status.OK, code)
	require.Equal(t, len(reqs), n)
	for i, s := range st {
		require.Equal(t, status.OK, s.Code, "request %d", i)
		require.Equal(t, reqs[i].Len, s.Bytes, "request %d", i)
	}
	require.Zero(t, r1.Users())
	require.Zero(t, r2.Users())
	require.EqualValues(t, len(reqs), a.Stats().DuplicateCompletions)
	require.Zero(t, a.Stats().RequestsInFlight)
	a.ReleaseBatch(batch)
}

// Routing gathers the routed requests at the front of the batch's pointer
// slice, which is reused with its requests: a batch after one whose
// first request failed routing (the pointers then out of order) still
// hands each of its requests to the mover exactly once.
func TestReusedPointersAfterAFailedRoute(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	bad := append([]core.TransferRequest(nil), reqs...)
	bad[0].Remote = 8 // not registered by the peer
	first := submitOK(t, a, bad, core.TransferOptions{})
	<-m.Entered()
	code, _ := first.Wait(10 * time.Second)
	require.Equal(t, status.NotRegistered, code)
	old := first.RequestAt(0)
	a.ReleaseBatch(first)
	m.Hold()
	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	require.Same(t, old, next.RequestAt(0))
	require.Equal(t, len(reqs), m.Held(), "each request handed over once")
	m.ReleaseAll()
	requireAllOK(t, next)
	require.Zero(t, a.Stats().DuplicateCompletions)
}

// A mover's Done racing Cancel: Cancel returns once the last request is
// settled, and the caller releases the batch at once, while that Done has
// still to finish the request (here it is stopped in the engine's lock,
// between the two). The batch must not be recycled then: the finish would
// give the first batch's outcome to a request of a later batch.
func TestCancelRacingADoneIsNotReused(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	m.Hold()
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	canceled := make(chan bool, 1)
	go func() { canceled <- first.Cancel() }()
	require.Eventually(t, func() bool { return m.Canceled() == len(reqs) }, time.Minute, time.Millisecond)
	unlock := a.LockEngine()
	completed := make(chan struct{})
	go func() { m.ReleaseAll(); close(completed) }()
	require.True(t, <-canceled, "Cancel returns when the movers let go")
	first.ReleaseOnly()
	recycled := first.Recycled()
	unlock()
	<-completed
	require.False(t, recycled, "a batch was recycled while a Done was still finishing one of its requests")
	a.ReleaseBatch(first)
	next := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	require.NotSame(t, first.RequestAt(0), next.RequestAt(0))
	m.ReleaseAll()
	requireAllOK(t, next)
}

// failsSecond completes every request at once, except the one at index 1
// of its batch, which fails as a transport failure (retried elsewhere).
type failsSecond struct{ *coretest.Mover }

func (m failsSecond) Submit(reqs []*core.Request) {
	for _, r := range reqs {
		if r.Index() == 1 {
			r.Done(0, status.Errorf(status.TransportError, "wire cut"))
			continue
		}
		r.Done(r.Len, nil)
	}
}

// A status names the transport of its request's last attempt, whether
// the whole batch went to one mover at once (one record for all), a
// request was retried on another, or it never reached one (routing
// failed): TransportNone.
func TestStatusNamesEachRequestsMover(t *testing.T) {
	const firstID = 71
	a, err := core.New(core.Options{
		LocalPeers: thisProcess,
		Available: []core.TransportSpec{
			{Name: "first", ID: firstID, Rank: 1, New: func() core.Transport { return failsSecond{coretest.NewMover("first")} }},
			local.Spec(),
		},
		Transports: []string{"first", "local"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	reqs := requestsFrom(t, a)

	check := func(reqs []core.TransferRequest, want []core.RequestStatus) {
		t.Helper()
		batch := submitOK(t, a, reqs, core.TransferOptions{})
		_, _ = batch.Wait(10 * time.Second)
		st := make([]core.RequestStatus, batch.Len())
		batch.Status(st)
		for i := range st {
			require.Equal(t, want[i], core.RequestStatus{Code: st[i].Code, Transport: st[i].Transport, Bytes: st[i].Bytes,
				Flags: st[i].Flags & core.FlagRetried}, "request %d", i)
		}
		a.ReleaseBatch(batch)
	}
	ok := core.RequestStatus{Code: status.OK, Transport: firstID, Bytes: 8}
	retried := core.RequestStatus{Code: status.OK, Transport: local.ID, Bytes: 8, Flags: core.FlagRetried}
	for range 2 { // the second time on reused requests
		check(reqs, []core.RequestStatus{ok, retried, ok, ok})
	}
	check(reqs[:1], []core.RequestStatus{ok})
	unrouted := append([]core.TransferRequest(nil), reqs...)
	unrouted[2].Remote = 8 // not registered by the peer
	check(unrouted, []core.RequestStatus{ok, retried, {Code: status.NotRegistered}, ok})
	check(reqs, []core.RequestStatus{ok, retried, ok, ok})
}

// failThenRun fails every request, then reports them all moved (a buggy
// second report).
type failThenRun struct{ *coretest.Mover }

func (m failThenRun) Submit(reqs []*core.Request) {
	for _, r := range reqs {
		r.Done(0, status.Errorf(status.PermissionDenied, "no"))
	}
	core.DoneAll(reqs)
}

// A DoneAll after a request's Done is a duplicate: it moves no bytes into
// the status and changes nothing else.
func TestDoneAllAfterDoneChangesNothing(t *testing.T) {
	a, reqs := reuseSetup(t, failThenRun{coretest.NewMover("fails")})
	batch := submitOK(t, a, reqs, core.TransferOptions{})
	code, _ := batch.Wait(10 * time.Second)
	require.Equal(t, status.PermissionDenied, code)
	st := make([]core.RequestStatus, batch.Len())
	batch.Status(st)
	for i, s := range st {
		require.Equal(t, status.PermissionDenied, s.Code, "request %d", i)
		require.Zero(t, s.Bytes, "request %d", i)
	}
	require.EqualValues(t, len(reqs), a.Stats().DuplicateCompletions)
	a.ReleaseBatch(batch)
}

// A recycled batch's deadline timer, stopped before it fired, serves the
// next batch of its slab: armed again, it fails that batch (and only it)
// at its deadline.
func TestReusedDeadlineTimerFailsTheNextBatch(t *testing.T) {
	m := coretest.NewMover("forgets")
	a, reqs := reuseSetup(t, m)
	first := submitOK(t, a, reqs, core.TransferOptions{})
	<-m.Entered()
	requireAllOK(t, first)
	timer := first.DeadlineTimer()
	a.ReleaseBatch(first)
	require.True(t, first.Recycled())

	m.Hold()
	next := submitOK(t, a, reqs, core.TransferOptions{Timeout: 20 * time.Millisecond})
	<-m.Entered()
	require.Same(t, timer, next.DeadlineTimer(), "the timer went on with the requests")
	code, _ := next.Wait(-1) // until the deadline fails it
	require.Equal(t, status.Timeout, code)
	code, _, _ = first.Status(nil)
	require.Equal(t, status.InvalidHandle, code, "the first batch is not touched")
	m.ReleaseAll()
	<-next.Settled()
	a.ReleaseBatch(next)
	require.False(t, next.Recycled(), "a batch its deadline expired is not reused")

	// Its timer fired, so it did not go on: the next batch has its own.
	m.FailWith(nil)
	third := submitOK(t, a, reqs, core.TransferOptions{})
	require.NotSame(t, timer, third.DeadlineTimer())
	m.ReleaseAll()
	requireAllOK(t, third)
	a.ReleaseBatch(third)
}
