package tcp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// waitAsyncFor is waitAsync with a timed Wait (timeout > 0), as the
// Python layer waits (in slices), or an untimed one (negative).
func waitAsyncFor(b *core.Batch, timeout time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		code, err := b.Wait(timeout)
		ch <- waitResult{code, err}
	}()
	return ch
}

// splitFake is an engine on one stream to a "split" fake peer (which
// answers each request in two parts, each for a token), whose first
// request (the dial) has been answered; took gets a value each time a
// waiting caller takes the read side, past each time a timed caller's
// limit passes inside a reply. local is 64 KiB.
func splitFake(t *testing.T) (f *fakePeer, e *core.Engine, tr *tcp.Transport, seg *core.Segment, local []byte, took, past chan struct{}) {
	f = startFake(t, "split")
	e, tr = newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	took, past = make(chan struct{}, 16), make(chan struct{}, 16)
	tr.OnCallerRead(func() { took <- struct{}{} })
	tr.OnPastLimit(func() { past <- struct{}{} })
	local = register(t, e, 64<<10, 0)
	seg, err := e.OpenSegment(f.addr())
	require.NoError(t, err)
	f.answer <- struct{}{}
	f.answer <- struct{}{}
	code, _, err := run(t, e, writeReq(local, seg, 4096), 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	for len(took) > 0 {
		recv(t, took, "the caller to take the read side")
	}
	return f, e, tr, seg, local, took, past
}

func writeReq(local []byte, seg *core.Segment, n uint64) []core.TransferRequest {
	return []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: n}}
}

func readReq(local []byte, seg *core.Segment, n uint64) []core.TransferRequest {
	return []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg, Remote: fakeBase, Len: n}}
}

// A timed Wait whose timeout passes while the caller reads for its batch
// (nothing, or part of the reply's header, has come): Wait returns
// Timeout, the caller lets go at the reply boundary without losing what
// it read, and the reply is then read by the reader goroutine: the batch
// ends OK on the same stream, and the next timed Wait is helped again.
func TestTimedHelpLetsGoAtBoundary(t *testing.T) {
	for _, partial := range []bool{false, true} {
		for _, waiting := range []bool{true, false} {
			t.Run(fmt.Sprintf("partial=%v/waiting=%v", partial, waiting), func(t *testing.T) {
				f, e, tr, seg, local, took, _ := splitFake(t)
				req := writeReq(local, seg, 4096)
				before := tr.Stats()
				b, err := e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: waiting})
				require.NoError(t, err)
				res := waitAsyncFor(b, 200*time.Millisecond)
				recv(t, took, "the caller to take the read side")
				if partial {
					f.answer <- struct{}{} // the first 10 bytes of the header
					require.Eventually(t, func() bool { return tr.Stats()["bytes_received"] == before["bytes_received"]+10 },
						10*time.Second, time.Millisecond)
				}
				r := recv(t, res, "the timed Wait to return")
				require.Equal(t, status.Timeout, r.code, "%v", r.err)
				if !partial {
					f.answer <- struct{}{}
				}
				f.answer <- struct{}{}                                          // the rest of the reply
				recv(t, b.Done(), "the reader goroutine to complete the batch") // nobody waits: no helper
				code, _, err := b.Status(nil)
				require.Equal(t, status.OK, code, "%v", err)
				e.ReleaseBatch(b)
				after := tr.Stats()
				require.Equal(t, before["replies_by_reader"]+1, after["replies_by_reader"], "%v", after)
				require.Equal(t, before["replies_by_caller"], after["replies_by_caller"], "%v", after)

				// The stream goes on, and a timed Wait reads its own reply.
				b, err = e.Submit(req, core.TransferOptions{Timeout: 30 * time.Second, Waiting: waiting})
				require.NoError(t, err)
				res = waitAsyncFor(b, 20*time.Second)
				recv(t, took, "the caller to take the read side")
				f.answer <- struct{}{}
				f.answer <- struct{}{}
				r = recv(t, res, "Wait to return")
				require.Equal(t, status.OK, r.code, "%v", r.err)
				e.ReleaseBatch(b)
				st := tr.Stats()
				require.Equal(t, after["replies_by_caller"]+1, st["replies_by_caller"], "%v", st)
				require.EqualValues(t, 1, st["dials"], "the stream was kept")
				require.Zero(t, st["protocol_errors"])
			})
		}
	}
}

// A timed Wait whose timeout passes while the caller is inside its
// reply's payload (through the receive buffer for 4 KiB, straight into
// the destination for 64 KiB): the caller reads the reply to its end, so
// the Wait ends OK, the data is whole and the stream serves the next
// batch.
func TestTimedHelpFinishesTheReplyItIsIn(t *testing.T) {
	for _, n := range []uint64{4 << 10, 64 << 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			f, e, tr, seg, local, took, past := splitFake(t)
			clear(local)
			before := tr.Stats()
			b, err := e.Submit(readReq(local, seg, n), core.TransferOptions{Timeout: 30 * time.Second})
			require.NoError(t, err)
			res := waitAsyncFor(b, 200*time.Millisecond)
			recv(t, took, "the caller to take the read side")
			f.answer <- struct{}{} // the header and 1 KiB of the payload
			recv(t, past, "the timeout to pass inside the reply")
			f.answer <- struct{}{}
			r := recv(t, res, "the timed Wait to return")
			require.Equal(t, status.OK, r.code, "%v", r.err)
			e.ReleaseBatch(b)
			for i := uint64(0); i < n; i++ {
				if local[i] != byte(i) {
					t.Fatalf("byte %d is %d, want %d", i, local[i], byte(i))
				}
			}
			st := tr.Stats()
			require.Equal(t, before["replies_by_caller"]+1, st["replies_by_caller"], "%v", st)

			f.answer <- struct{}{}
			f.answer <- struct{}{}
			code, _, err := run(t, e, writeReq(local, seg, 4096), 30*time.Second)
			require.Equal(t, status.OK, code, "%v", err)
			require.EqualValues(t, 1, tr.Stats()["dials"], "the stream was kept")
			require.Zero(t, tr.Stats()["protocol_errors"])
		})
	}
}
