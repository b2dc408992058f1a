package tcp_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// waitResult is what a Wait(-1) on another goroutine returned.
type waitResult struct {
	code status.Code
	err  error
}

// recv waits for a value on ch, failing the test if none comes (the
// bound only turns a hang into a failure).
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// helpWaits are the Waits a caller is lent with: untimed, and timed (as
// the Python layer waits, in slices) with a timeout the tests never reach.
var helpWaits = []time.Duration{-1, 20 * time.Second}

func waitAsync(b *core.Batch) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		code, err := b.Wait(-1)
		ch <- waitResult{code, err}
	}()
	return ch
}

// helpedFake is an engine on one stream to a "gated" fake peer, whose
// first request (the dial) has been answered, and a channel that gets a
// value each time a waiting caller takes the stream's read side.
func helpedFake(t *testing.T) (*fakePeer, *core.Engine, *tcp.Transport, []core.TransferRequest, chan struct{}) {
	f := startFake(t, "gated")
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	took := make(chan struct{}, 16)
	tr.OnCallerRead(func() { took <- struct{}{} })
	local := register(t, e, 4096, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: 4096}}
	f.answer <- struct{}{}
	code, _, err := run(t, e, req, 30*time.Second) // dials; the reader goroutine reads this one
	require.Equal(t, status.OK, code, "%v", err)
	for len(took) > 0 {
		recv(t, took, "the caller to take the read side")
	}
	// The write side is free again, so the next request is written by its
	// submitter, before Submit returns (a writer goroutine woken instead
	// would skip a request canceled before it ran).
	require.Eventually(t, func() bool { return !tr.Writing() }, 10*time.Second, time.Millisecond)
	return f, e, tr, req, took
}

// A caller that waits for its batch reads the reply itself: it holds the
// read side before the peer answers, and the reply is counted as the
// caller's, never the reader goroutine's, whether it waits with a timeout
// or not. This holds whether the batch was
// submitted as Waiting (the reader goroutine is not woken for it) or not
// (the reader goroutine, waiting at a reply boundary, is kicked and lets
// go).
func TestCallerReadsItsReply(t *testing.T) {
	for _, tc := range []struct {
		waiting bool
		timeout time.Duration
	}{{true, -1}, {false, -1}, {true, 20 * time.Second}, {false, 20 * time.Second}} {
		waiting := tc.waiting
		t.Run(fmt.Sprintf("waiting=%v/timeout=%v", waiting, tc.timeout), func(t *testing.T) {
			f, e, tr, req, took := helpedFake(t)
			for i := 0; i < 3; i++ {
				before := tr.Stats()
				b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: waiting})
				require.NoError(t, err)
				res := waitAsyncFor(b, tc.timeout)
				recv(t, took, "the caller to take the read side") // the peer has not answered
				code, _, _ := b.Status(nil)
				require.Equal(t, status.Pending, code)
				f.answer <- struct{}{}
				r := recv(t, res, "Wait to return")
				require.Equal(t, status.OK, r.code, "%v", r.err)
				e.ReleaseBatch(b)
				after := tr.Stats()
				require.Equal(t, before["replies_by_caller"]+1, after["replies_by_caller"], "%v", after)
				require.Equal(t, before["replies_by_reader"], after["replies_by_reader"], "%v", after)
			}
			require.EqualValues(t, 1, tr.Stats()["dials"])
			require.Zero(t, tr.Stats()["protocol_errors"])
		})
	}
}

// Canceling a batch whose caller is blocked reading its reply: the
// caller is kicked, its Wait returns Canceled without the reply, the
// reply that comes later is read (into scratch) by the reader goroutine,
// and the stream serves the next batch.
func TestCancelWhileCallerReads(t *testing.T) {
	for _, timeout := range helpWaits {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			f, e, tr, req, took := helpedFake(t)
			b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: true})
			require.NoError(t, err)
			res := waitAsyncFor(b, timeout)
			recv(t, took, "the caller to take the read side")
			byReader := tr.Stats()["replies_by_reader"]
			require.True(t, b.Cancel(), "the transport let go of the request")
			r := recv(t, res, "Wait to return after Cancel") // never answered: only the cancel ends this Wait
			require.Equal(t, status.Canceled, r.code, "%v", r.err)
			e.ReleaseBatch(b)
			require.Zero(t, tr.Stats()["requests_in_flight"])

			f.answer <- struct{}{} // the late reply is still read, by the reader goroutine
			require.Eventually(t, func() bool { return tr.Stats()["replies_by_reader"] == byReader+1 }, 10*time.Second, time.Millisecond)
			f.answer <- struct{}{}
			code, _, err := run(t, e, req, 30*time.Second)
			require.Equal(t, status.OK, code, "%v", err)
			require.EqualValues(t, 1, tr.Stats()["dials"], "the stream was kept")
			require.Zero(t, tr.Stats()["protocol_errors"])
		})
	}
}

// The connection breaks while a caller is blocked reading its reply: the
// caller's Wait ends with TransportError, and once the transport is
// uninstalled nothing is left (the reader goroutine freed the receive
// buffer after the caller let go of it).
func TestConnectionBreaksWhileCallerReads(t *testing.T) {
	for _, timeout := range helpWaits {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			f, e, tr, req, took := helpedFake(t)
			b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: true})
			require.NoError(t, err)
			res := waitAsyncFor(b, timeout)
			recv(t, took, "the caller to take the read side")
			f.closeConns()
			r := recv(t, res, "Wait to return")
			require.Equal(t, status.TransportError, r.code, "%v", r.err)
			e.ReleaseBatch(b)
			require.Eventually(t, func() bool { return tr.Stats()["connections"] == 0 }, 10*time.Second, time.Millisecond)
			require.NoError(t, e.Uninstall("tcp"))
			requireIdle(t, tr)
		})
	}
}

// Two callers on one stream: the second finds the first reading and
// waits; the first reads until its own batch is done and hands the rest
// to the reader goroutine. Both end OK, in any order of answers.
func TestTwoCallersOneStream(t *testing.T) {
	for _, timeout := range helpWaits {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			f, e, tr, req, took := helpedFake(t)
			first, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: true})
			require.NoError(t, err)
			res1 := waitAsyncFor(first, timeout)
			recv(t, took, "the caller to take the read side")
			second, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: true})
			require.NoError(t, err)
			res2 := waitAsyncFor(second, timeout)
			f.answer <- struct{}{}
			f.answer <- struct{}{}
			for _, res := range []<-chan waitResult{res1, res2} {
				r := recv(t, res, "Wait to return")
				require.Equal(t, status.OK, r.code, "%v", r.err)
			}
			e.ReleaseBatch(first)
			e.ReleaseBatch(second)
			require.Zero(t, tr.Stats()["protocol_errors"])
			require.Zero(t, tr.Stats()["requests_in_flight"])
		})
	}
}

// After callers have read their replies, the reader goroutine takes the
// idle connection back (within a millisecond), so a connection the
// target drops while idle is noticed without a request on it.
func TestIdleDropNoticedAfterCallerReads(t *testing.T) {
	// One stream: the batches below would move on to a second one after
	// a MiB (256 of them, on a loaded machine).
	a, ta := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	b, tb := newEngine(t, core.Options{})
	src := alloc(t, a, 4096, 0)
	dst := alloc(t, b, 4096, rw)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	req := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 4096}}
	// A caller reads its reply only when the reader goroutine is not
	// inside one: on a loaded machine that can take a few batches.
	for i := 0; i < 5 || ta.Stats()["replies_by_caller"] == 0; i++ {
		require.Less(t, i, 10000, "no caller ever read its own reply")
		bt, err := a.Submit(req, core.TransferOptions{Timeout: 10 * time.Second, Waiting: true})
		require.NoError(t, err)
		code, err := bt.Wait(-1)
		require.Equal(t, status.OK, code, "%v", err)
		a.ReleaseBatch(bt)
	}
	require.EqualValues(t, 1, ta.Stats()["connections"])
	tb.ResetServerConns()
	require.Eventually(t, func() bool { return ta.Stats()["connections"] == 0 }, 10*time.Second, time.Millisecond,
		"the initiator never noticed the dropped connection")
}

// Many goroutines share one stream with batches of one and two, waiting
// and not, timed and not, and some canceled while in flight: every batch ends OK (data
// read back equal) or Canceled, nothing is left in flight, no protocol
// error, no duplicate completion, and both callers and the reader
// goroutine read replies.
func TestHelpStress(t *testing.T) {
	const workers, rounds, block = 4, 150, 8 << 10
	peer := startPeer(t, workers*2*block)
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	src := register(t, e, workers*2*block, 0)
	dst := register(t, e, workers*2*block, 0)
	seg := openSegment(t, e, peer.Name)
	remote := peer.Buffers[0].Addr
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uint64(w * 2 * block)
			out, in := src[off:off+2*block], dst[off:off+2*block]
			for i := 0; i < rounds; i++ {
				for k := range out {
					out[k] = byte(w*31 + i + k)
				}
				waiting := i%2 == 0
				wait := time.Duration(-1)
				if i%4 >= 2 {
					wait = 30 * time.Second // timed, as the Python layer waits
				}
				for _, n := range []int{1, 2} {
					reqs := make([]core.TransferRequest, n)
					for j := range reqs {
						o := off + uint64(j*block)
						reqs[j] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + o, Segment: seg, Remote: remote + o, Len: block}
					}
					bt, err := e.Submit(reqs, core.TransferOptions{Timeout: 30 * time.Second, Waiting: waiting})
					if err != nil {
						errs <- err
						return
					}
					code, err := bt.Wait(wait)
					e.ReleaseBatch(bt)
					if code != status.OK {
						errs <- err
						return
					}
				}
				if i%10 == 5 { // one canceled in flight, not waited for
					bt, err := e.Submit([]core.TransferRequest{{Op: core.OpRead, Local: host.Addr(dst) + off, Segment: seg,
						Remote: remote + off, Len: 2 * block}}, core.TransferOptions{Timeout: 30 * time.Second})
					if err != nil {
						errs <- err
						return
					}
					if !bt.Cancel() {
						errs <- fmt.Errorf("worker %d: a canceled batch was not let go", w)
						return
					}
					if code, _, _ := bt.Status(nil); code != status.OK && code != status.Canceled {
						errs <- fmt.Errorf("worker %d: canceled batch ended %v", w, code)
						return
					}
					e.ReleaseBatch(bt)
				}
				bt, err := e.Submit([]core.TransferRequest{{Op: core.OpRead, Local: host.Addr(dst) + off, Segment: seg,
					Remote: remote + off, Len: 2 * block}}, core.TransferOptions{Timeout: 30 * time.Second, Waiting: waiting})
				if err != nil {
					errs <- err
					return
				}
				code, err := bt.Wait(wait)
				e.ReleaseBatch(bt)
				if code != status.OK {
					errs <- err
					return
				}
				if !bytes.Equal(in, out) {
					errs <- fmt.Errorf("worker %d round %d: the data read back differs from the data written", w, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := tr.Stats()
	require.Zero(t, st["protocol_errors"], "%v", st)
	require.Zero(t, st["requests_in_flight"], "%v", st)
	require.Positive(t, st["replies_by_caller"], "%v", st)
	require.Positive(t, st["replies_by_reader"], "%v", st)
	require.Zero(t, e.Stats().DuplicateCompletions)
}

// A waiting caller reads the replies of one stream (its batch's first
// request's); a batch spread over two streams has the other one's replies
// read by that stream's reader goroutine, woken for them, even when a
// caller had let go of that stream with nothing due (its reader would
// otherwise come back only after its watch, an hour here).
func TestWaitingBatchOverTwoStreams(t *testing.T) {
	a, ta := newEngineWith(t, core.Options{}, tcp.Options{Streams: 2})
	ta.SetWatchDelay(time.Hour)
	b, _ := newEngine(t, core.Options{})
	const n = 1 << 20 // a request fills a stream's turn: the next goes to the other stream
	src := alloc(t, a, 2*n, 0)
	dst := alloc(t, b, 2*n, rw)
	random(src)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	one := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: n}}
	// Batches of one, alternating between the streams, until two in a row
	// were read by their callers: both streams' readers are then away.
	for i, inRow := 0, 0; inRow < 2; i++ {
		require.Less(t, i, 10000, "callers never read their own replies")
		byCaller := ta.Stats()["replies_by_caller"]
		bt, err := a.Submit(one, core.TransferOptions{Timeout: 10 * time.Second, Waiting: true})
		require.NoError(t, err)
		code, err := bt.Wait(-1)
		require.Equal(t, status.OK, code, "%v", err)
		a.ReleaseBatch(bt)
		if ta.Stats()["replies_by_caller"] > byCaller {
			inRow++
		} else {
			inRow = 0
		}
	}
	two := []core.TransferRequest{
		{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: n},
		{Op: core.OpWrite, Local: host.Addr(src) + n, Segment: seg, Remote: host.Addr(dst) + n, Len: n},
	}
	byReader := ta.Stats()["replies_by_reader"]
	bt, err := a.Submit(two, core.TransferOptions{Timeout: 10 * time.Second, Waiting: true})
	require.NoError(t, err)
	code, err := bt.Wait(-1)
	a.ReleaseBatch(bt)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, src, dst)
	require.Positive(t, ta.Stats()["replies_by_reader"]-byReader, "the second stream's reader read its reply")
	require.EqualValues(t, 2, ta.Stats()["connections"])
}
