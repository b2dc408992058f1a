package verbs_test

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// openFake builds the fake, sets its devices and opens it.
func openFake(t *testing.T, devices string) (*verbs.Library, string) {
	t.Helper()
	path := fakeverbs.Build(t)
	t.Setenv(fakeverbs.DevicesEnv, devices)
	lib, err := verbs.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lib.Close() })
	return lib, path
}

func requireNoLiveObjects(t *testing.T, path string) {
	t.Helper()
	live, err := fakeverbs.Counts(path)
	require.NoError(t, err)
	require.True(t, live.Zero(), "live objects left: %+v", live)
}

// endpoint is one side of a connection: a device context with a PD, a CQ
// and an RC QP.
type endpoint struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
}

func newEndpoint(t *testing.T, lib *verbs.Library, dev string) *endpoint {
	t.Helper()
	ctx, err := lib.OpenDevice(dev)
	require.NoError(t, err)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cq, err := ctx.CreateCQ(64)
	require.NoError(t, err)
	qp, err := pd.CreateRCQP(cq, cq, verbs.QPCaps{MaxSendWR: 32, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	return &endpoint{ctx: ctx, pd: pd, cq: cq, qp: qp}
}

func (e *endpoint) addr(t *testing.T, psn uint32) verbs.QPAddr {
	t.Helper()
	port, err := e.ctx.QueryPort(1)
	require.NoError(t, err)
	gid, err := e.ctx.QueryGID(1, 0)
	require.NoError(t, err)
	return verbs.QPAddr{QPN: e.qp.Num(), PSN: psn, LID: port.LID, GID: gid, Port: 1}
}

// connect walks the QP to RTS towards remote.
func (e *endpoint) connect(t *testing.T, remote verbs.QPAddr, psn uint32) {
	t.Helper()
	require.NoError(t, e.qp.ToInit(1, verbs.AccessRemoteWrite|verbs.AccessRemoteRead))
	require.NoError(t, e.qp.ToRTR(remote, verbs.MTU4096))
	require.NoError(t, e.qp.ToRTS(psn))
}

func (e *endpoint) close(t *testing.T) {
	t.Helper()
	require.NoError(t, e.qp.Destroy())
	require.NoError(t, e.cq.Destroy())
	require.NoError(t, e.pd.Dealloc())
	require.NoError(t, e.ctx.Close())
}

// waitCompletions polls until n completions arrived (the fake completes at
// post time, so they are there at once; the loop bounds the wait).
func waitCompletions(t *testing.T, cq *verbs.CQ, n int) []verbs.Completion {
	t.Helper()
	out := make([]verbs.Completion, 0, n)
	buf := make([]verbs.Completion, 16)
	require.Eventually(t, func() bool {
		got, err := cq.Poll(buf)
		require.NoError(t, err)
		out = append(out, buf[:got]...)
		return len(out) >= n
	}, verbsWait, pollTick)
	return out
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
