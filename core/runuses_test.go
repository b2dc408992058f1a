package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// Submit takes the local uses of a run of requests in one region
// together, once the run ends. An unregister that starts after the run's
// first request took its use fails the call there, and every failure
// gives back exactly the uses taken: the regions end as they began.
func TestSubmitTakesARunsUsesTogether(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	b := newLocalEngine(t, core.Options{})
	srcA, regA := buf(t, a, 4096, 0)
	srcB, regB := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	unregistered := make([]byte, 64)
	A, B, R, U := host.Addr(srcA), host.Addr(srcB), host.Addr(dst), host.Addr(unregistered)
	req := func(local uint64) core.TransferRequest {
		return core.TransferRequest{Op: core.OpWrite, Local: local, Segment: seg, Remote: R, Len: 8}
	}
	clean := func(t *testing.T) {
		t.Helper()
		require.Zero(t, regA.Users(), "uses of the first region")
		require.Zero(t, regB.Users(), "uses of the second region")
		require.Zero(t, a.Stats().Batches)
	}
	unregisterStartsAfter := func(t *testing.T, first int, r *core.Region) {
		a.OnAcquired(func(i int) {
			if i == first {
				r.StartClosing()
			}
		})
		t.Cleanup(func() { a.OnAcquired(nil); r.StopClosing() })
	}

	t.Run("unregister during the last run", func(t *testing.T) {
		unregisterStartsAfter(t, 0, regA)
		_, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), req(A + 16)}, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrNotRegistered)
		require.Contains(t, err.Error(), "request 1:")
		clean(t)
	})
	t.Run("unregister during a run another region ends", func(t *testing.T) {
		unregisterStartsAfter(t, 0, regA)
		_, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), req(B)}, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrNotRegistered)
		require.Contains(t, err.Error(), "request 1:")
		clean(t)
	})
	t.Run("unregister during the second run", func(t *testing.T) {
		unregisterStartsAfter(t, 2, regB)
		_, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), req(B), req(B + 8), req(B + 16)},
			core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrNotRegistered)
		require.Contains(t, err.Error(), "request 3:")
		clean(t)
	})
	t.Run("a bad request inside a run", func(t *testing.T) {
		bad := req(A + 16)
		bad.Op = 7
		_, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), bad}, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrInvalidArgument)
		require.Contains(t, err.Error(), "request 2:")
		clean(t)
	})
	t.Run("an unregistered request after runs", func(t *testing.T) {
		_, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), req(B), req(B + 8), req(U)},
			core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrNotRegistered)
		require.Contains(t, err.Error(), "request 4:")
		clean(t)
	})
	t.Run("segments are checked once a run, the first too", func(t *testing.T) {
		closed, err := a.OpenSegment(b.Name())
		require.NoError(t, err)
		require.NoError(t, a.CloseSegment(closed))
		noSeg := req(A)
		noSeg.Segment = nil
		_, err = a.Submit([]core.TransferRequest{noSeg, req(A + 8)}, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrInvalidHandle)
		require.Contains(t, err.Error(), "request 0:")
		late := req(A + 16)
		late.Segment = closed
		_, err = a.Submit([]core.TransferRequest{req(A), req(A + 8), late}, core.TransferOptions{})
		require.ErrorIs(t, err, status.ErrInvalidHandle)
		require.Contains(t, err.Error(), "request 2:")
		clean(t)
	})
	t.Run("runs that succeed hold one use a request", func(t *testing.T) {
		var seen [][2]int64
		a.OnAcquired(func(int) { seen = append(seen, [2]int64{regA.Users(), regB.Users()}) })
		t.Cleanup(func() { a.OnAcquired(nil) })
		batch, err := a.Submit([]core.TransferRequest{req(A), req(A + 8), req(A + 16), req(B), req(B + 8)},
			core.TransferOptions{})
		require.NoError(t, err)
		require.Equal(t, [][2]int64{{1, 0}, {3, 1}}, seen, "a run's uses are taken when it ends")
		code, _ := wait(t, batch)
		require.Equal(t, status.OK, code)
		a.ReleaseBatch(batch)
		clean(t)
	})
}
