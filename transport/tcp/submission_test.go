package tcp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A submission goes back for reuse only once each of its states has
// completed, has no chunk left on the wire and no goroutine inside its
// memory, and no Cancel or Help holds one of them; and only once.
func TestSubmissionReusedOnlyWhenReleased(t *testing.T) {
	tr := New(Options{})
	sub := tr.takeSubmission(3, 3)
	require.Len(t, sub.states, 4, "class of 3 requests")
	done := make(chan error, 3)
	for i := range 3 {
		sub.states[i] = reqState{t: tr, sub: sub, raw: done, op: opRead, n: 4096}
		sub.states[i].prepare(false)
	}
	tr.inflight.Add(3)
	killed, held, entered := &sub.states[0], &sub.states[1], &sub.states[2]

	// Canceled while its chunk is on the wire: it completes at once, but
	// the chunk still refers to it until its reply is read.
	killed.kill(errCanceled)
	require.Equal(t, errCanceled, <-done)
	// Found by Cancel (or Help) before it completed.
	held.hold()
	held.chunkDone(nil, false)
	require.NoError(t, <-done)
	held.kill(errCanceled) // Cancel acts on what it found: no effect, no second release
	// A goroutine inside its memory (a WRITE being sent, a READ reply
	// being copied) when the chunk ends.
	require.True(t, entered.enter())
	entered.chunkDone(nil, false)

	killed.chunkDone(nil, false) // the canceled chunk's reply is in
	require.Zero(t, tr.FreeSubmissions())
	held.unhold()
	require.Zero(t, tr.FreeSubmissions())
	require.Empty(t, done, "completes when the goroutine leaves, not before")
	entered.exit()
	require.NoError(t, <-done)
	require.Equal(t, 1, tr.FreeSubmissions())
	require.Zero(t, sub.refs.Load())
	for i := range 3 {
		require.Nil(t, sub.states[i].r, "a free submission keeps no request alive")
		require.Nil(t, sub.states[i].err)
	}
	require.Same(t, sub, tr.takeSubmission(4, 4))
	require.Zero(t, tr.FreeSubmissions())
	require.Zero(t, tr.inflight.Load())
}

// Submit calls too large for a class allocate their own states, which
// are never kept.
func TestLargeSubmissionNotKept(t *testing.T) {
	tr := New(Options{})
	n := 1<<(subClasses-1) + 1
	sub := tr.takeSubmission(n, n)
	require.Len(t, sub.states, n)
	done := make(chan error, n)
	for i := range n {
		sub.states[i] = reqState{t: tr, sub: sub, raw: done, op: opRead, n: 1}
		sub.states[i].prepare(false)
	}
	tr.inflight.Add(int64(n))
	for i := range n {
		sub.states[i].chunkDone(nil, false)
		require.NoError(t, <-done)
	}
	require.Zero(t, tr.FreeSubmissions())
	require.Zero(t, sub.refs.Load())
}
