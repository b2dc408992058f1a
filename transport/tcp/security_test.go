package tcp_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// tcp hands a peer nothing but answers: every request is checked by the
// target before it touches memory. A read-only engine allocation (the
// memory same-host peers could otherwise get as a memfd) is readable and
// refuses writes, from the engine and from a raw request that skips the
// initiator's own check.
func TestReadOnlyAllocationOverTCP(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: 1 << 20, Perm: core.PermRemoteRead, Alloc: true}}})
	e, tr := newEngine(t, core.Options{})
	dst := register(t, e, 1<<20, 0)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(t, err)
	ro := peer.Buffers[0]
	require.NotZero(t, ro.AllocID)
	before := peerSum(t, peer, 0)

	code, st, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(dst), Segment: seg,
		Remote: ro.Addr, Len: 1 << 20}}, 5*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, tcp.ID, st[0].Transport)
	require.Equal(t, peertest.Pattern(0, 1<<20), dst)

	_, st, _ = run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(dst), Segment: seg,
		Remote: ro.Addr, Len: 4096}}, 5*time.Second)
	require.Equal(t, status.PermissionDenied, st[0].Code)
	addr, inc := descOf(t, seg.Peer().Desc())
	err = tr.Raw(addr, inc, core.OpWrite, host.Addr(dst), ro.Addr, 1<<20, 5*time.Second)
	require.Equal(t, status.PermissionDenied, status.CodeOf(err), "%v", err)
	require.Equal(t, before, peerSum(t, peer, 0), "the read-only allocation is unchanged")
}
