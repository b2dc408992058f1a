package tcp_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// The target keeps the region of a run of requests pinned until their
// replies are written, and checks each request against it: one batch on
// one stream, alternating between a read-write and a read-only region,
// gets every WRITE to the read-only one refused, every request crossing a
// region's end refused, and the rest done; afterwards the regions
// unregister at once (nothing is left pinned), and a WRITE into an
// unregistered one is refused.
func TestTargetRegionPerRun(t *testing.T) {
	a, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 1})
	b, _ := newEngineWith(t, core.Options{UnregisterTimeout: time.Minute}, tcp.Options{})
	const n = 64 << 10
	src := alloc(t, a, 2*n, 0)
	dst := alloc(t, a, 2*n, 0)
	random(src)
	rwR, err := b.Alloc(n, "cpu", rw)
	require.NoError(t, err)
	roR, err := b.Alloc(n, "cpu", core.PermRemoteRead)
	require.NoError(t, err)
	random(host.Bytes(roR.Addr, n))
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	addr, inc := descOf(t, seg.Peer().Desc())

	// Sent raw: the initiator's own checks would refuse the bad ones
	// before they reach the target.
	const block = 4 << 10
	var reqs []tcp.RawReq
	var want []status.Code
	for i := uint64(0); i < 8; i++ {
		off := i * block
		reqs = append(reqs,
			tcp.RawReq{Op: core.OpWrite, Local: host.Addr(src) + off, Remote: rwR.Addr + off, N: block},
			tcp.RawReq{Op: core.OpWrite, Local: host.Addr(src) + off, Remote: roR.Addr + off, N: block},
			tcp.RawReq{Op: core.OpRead, Local: host.Addr(dst) + off, Remote: roR.Addr + off, N: block},
			tcp.RawReq{Op: core.OpWrite, Local: host.Addr(src) + off, Remote: rwR.Addr + n - block/2, N: block},
		)
		want = append(want, status.OK, status.PermissionDenied, status.OK, status.OutOfRange)
	}
	errs := tr.RawBatch(addr, inc, reqs, 30*time.Second)
	for i, err := range errs {
		require.Equal(t, want[i%4], status.CodeOf(err), "request %d: %v", i, err)
	}
	require.Equal(t, src[:8*block], host.Bytes(rwR.Addr, 8*block))
	require.Equal(t, host.Bytes(roR.Addr, 8*block), dst[:8*block])

	done := make(chan error, 2)
	go func() { done <- b.Free(rwR) }()
	go func() { done <- b.Free(roR) }()
	for range 2 {
		require.NoError(t, recv(t, done, "the target's regions to be freed"))
	}
	err = tr.Raw(addr, inc, core.OpWrite, host.Addr(src), rwR.Addr, block, 30*time.Second)
	require.Equal(t, status.NotRegistered, status.CodeOf(err), "%v", err)
}
