package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/status"
)

// panicsAfterFirst completes its first request, then panics.
type panicsAfterFirst struct{ *coretest.Mover }

func (m panicsAfterFirst) Submit(reqs []*core.Request) {
	reqs[0].Done(reqs[0].Len, nil)
	panic("mover bug")
}

// A mover whose Submit panics does not take the caller down or leave the
// batch hanging: what it completed stays completed, the rest fails
// Internal with the panic in its message, and nothing stays pinned.
func TestPanickingSubmitFailsTheRest(t *testing.T) {
	a, reqs := reuseSetup(t, panicsAfterFirst{coretest.NewMover("panics")})
	batch := submitOK(t, a, reqs, core.TransferOptions{})
	code, err := batch.Wait(10 * time.Second)
	require.Equal(t, status.Internal, code)
	require.ErrorContains(t, err, "panics submit panicked: mover bug")
	st := make([]core.RequestStatus, batch.Len())
	batch.Status(st)
	require.Equal(t, status.OK, st[0].Code)
	for i := 1; i < len(st); i++ {
		require.Equal(t, status.Internal, st[i].Code, "request %d", i)
	}
	<-batch.Settled()
	require.Zero(t, a.Stats().RequestsInFlight)
	a.ReleaseBatch(batch)
}
