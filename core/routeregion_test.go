package core_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
)

// byRegion is a fake mover that promises its Eligible looks only at the
// request's regions (core.RegionEligible).
type byRegion struct{ *coretest.Mover }

func (byRegion) EligibleByRegion() {}

// countEligible makes m accept requests as accept says and counts its
// Eligible calls.
func countEligible(m *coretest.Mover, accept bool) *atomic.Int64 {
	var n atomic.Int64
	m.SetEligible(func(*core.Request) bool { n.Add(1); return accept })
	return &n
}

// Routing asks a RegionEligible mover once per run of requests in the
// same local and remote regions, and any other mover once per request;
// a mover that is not RegionEligible, asked before, makes the answer of
// the ones after it per request too.
func TestRoutingAsksOncePerRegionRun(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	b := newLocalEngine(t, core.Options{})
	srcA, _ := buf(t, a, 4096, 0)
	srcB, _ := buf(t, a, 4096, 0)
	dstX, _ := buf(t, b, 4096, core.PermRemoteWrite)
	dstY, _ := buf(t, b, 4096, core.PermRemoteWrite)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	A, B, X, Y := host.Addr(srcA), host.Addr(srcB), host.Addr(dstX), host.Addr(dstY)
	req := func(local, remote uint64) core.TransferRequest {
		return core.TransferRequest{Op: core.OpWrite, Local: local, Segment: seg, Remote: remote, Len: 8}
	}
	// Three runs of regions: A to X (3), A to Y (2), B to Y (1); then A
	// to X again (a new run).
	reqs := []core.TransferRequest{req(A, X), req(A+8, X+8), req(A+16, X+16), req(A+24, Y), req(A+32, Y+8),
		req(B, Y+16), req(A+40, X+24)}
	run := func(t *testing.T, o core.TransferOptions) {
		t.Helper()
		batch, err := a.Submit(reqs, o)
		require.NoError(t, err)
		requireAllOK(t, batch)
		a.ReleaseBatch(batch)
	}

	refuses := coretest.NewMover("refuses")
	serves := coretest.NewMover("serves")
	require.NoError(t, a.Install(byRegion{refuses}))
	require.NoError(t, a.Install(byRegion{serves}))
	asked := countEligible(refuses, false)
	served := countEligible(serves, true)
	run(t, core.TransferOptions{})
	require.EqualValues(t, 4, asked.Load(), "a refusal holds for its run")
	require.EqualValues(t, 4, served.Load(), "an acceptance holds for its run")

	served.Store(0)
	run(t, core.TransferOptions{Transport: "serves"})
	require.EqualValues(t, 4, served.Load(), "the caller's transport is asked once a run")

	// A plain mover first: every request is asked of both.
	require.NoError(t, a.Uninstall("refuses"))
	require.NoError(t, a.Uninstall("serves"))
	plain := coretest.NewMover("plain")
	require.NoError(t, a.Install(plain))
	require.NoError(t, a.Install(byRegion{serves}))
	asked = countEligible(plain, false)
	served = countEligible(serves, true)
	run(t, core.TransferOptions{})
	require.EqualValues(t, len(reqs), asked.Load())
	require.EqualValues(t, len(reqs), served.Load())
}
