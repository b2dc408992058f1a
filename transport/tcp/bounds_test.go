package tcp_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/logbuf"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// mmap returns n bytes outside the Go heap, unmapped when the test ends
// (after the engines, which were created earlier, are closed).
func mmap(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// The target enforces its registrations on every request, whatever the
// initiator believes: raw requests, which skip the initiator's checks,
// outside any region, across two adjacent regions, without the
// permission, and after an unregistration are refused with their codes,
// and nothing is written.
func TestTargetEnforcesBounds(t *testing.T) {
	_, ta := newEngine(t, core.Options{})
	b, _ := newEngine(t, core.Options{})
	const K = 4096
	mem := mmap(t, 8*K)
	base := host.Addr(mem)
	reg := func(off, n int, perm core.Perm) *core.Region {
		r, err := b.Register(core.RegionDesc{Addr: base + uint64(off), Len: uint64(n)}, perm)
		require.NoError(t, err)
		return r
	}
	r1 := reg(0, 2*K, rw)
	reg(2*K, 2*K, rw) // adjacent to r1
	reg(4*K, K, core.PermRemoteRead)
	reg(5*K, K, core.PermRemoteWrite)
	// [6K, 8K) is not registered.
	random(mem)
	src := mmap(t, 4<<20)
	random(src)
	addr, inc := b.ListenAddr(), b.Incarnation()
	raw := func(op core.Op, off, n int) error {
		return ta.Raw(addr, inc, op, host.Addr(src), base+uint64(off), uint64(n), 5*time.Second)
	}

	cases := []struct {
		name   string
		op     core.Op
		off, n int
		code   status.Code
	}{
		{"write outside any region", core.OpWrite, 6 * K, 100, status.NotRegistered},
		{"read outside any region", core.OpRead, 7*K + 1, 1, status.NotRegistered},
		{"write across two regions", core.OpWrite, 2*K - 50, 100, status.OutOfRange},
		{"read across two regions", core.OpRead, 2*K - 1, 2, status.OutOfRange},
		{"write past the last region", core.OpWrite, 5*K + 10, K, status.OutOfRange},
		{"write to a read-only region", core.OpWrite, 4 * K, 10, status.PermissionDenied},
		{"read from a write-only region", core.OpRead, 5 * K, 10, status.PermissionDenied},
		{"large write outside (chunked, payload drained)", core.OpWrite, 6 * K, 3<<20 + 5, status.NotRegistered},
		{"large write across regions", core.OpWrite, 0, 64 << 10, status.OutOfRange},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := bytes.Clone(mem)
			local := bytes.Clone(src[:64])
			err := raw(c.op, c.off, c.n)
			require.Equal(t, c.code, status.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), "refused")
			require.Equal(t, before, mem, "target memory changed")
			require.Equal(t, local, src[:64], "local memory changed")
			// The stream is still in step: a good request on it works.
			require.NoError(t, raw(core.OpWrite, 100, 1000))
			require.Equal(t, src[:1000], mem[100:1100])
			copy(before[100:1100], src[:1000])
			require.Equal(t, before, mem)
		})
	}

	// Allowed requests in one region, to its very end, and a READ.
	require.NoError(t, raw(core.OpWrite, 2*K, 2*K))
	require.Equal(t, src[:2*K], mem[2*K:4*K])
	require.NoError(t, raw(core.OpRead, 4*K, K))
	require.Equal(t, mem[4*K:5*K], src[:K])

	// After the target unregisters, a stale descriptor does not help.
	require.NoError(t, b.Unregister(r1))
	before := bytes.Clone(mem)
	err := raw(core.OpWrite, 0, 10)
	require.Equal(t, status.NotRegistered, status.CodeOf(err), "%v", err)
	err = raw(core.OpRead, 0, 10)
	require.Equal(t, status.NotRegistered, status.CodeOf(err), "%v", err)
	require.Equal(t, before, mem)
	require.Positive(t, b.Stats().Transports["tcp"]["rejected"])
}

// The same against a peer in another process, with the initiator's stale
// cached descriptor: the peer unregistered a buffer, the descriptor still
// lists it, and the peer refuses.
func TestTargetEnforcesAcrossProcesses(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: 1 << 20, Perm: core.PermRemoteRead}, {Size: 1 << 20, Perm: rw}}})
	e, tr := newEngine(t, core.Options{})
	src := register(t, e, 2<<20, 0)
	random(src)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(t, err)
	stale := seg.Peer().Desc()
	addr, inc := descOf(t, stale)
	sums := []string{peerSum(t, peer, 0), peerSum(t, peer, 1)}

	// Read-only buffer: the engine refuses locally, the target refuses a
	// raw request.
	_, st, _ := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: peer.Buffers[0].Addr, Len: 10}}, 5*time.Second)
	require.Equal(t, status.PermissionDenied, st[0].Code)
	err = tr.Raw(addr, inc, core.OpWrite, host.Addr(src), peer.Buffers[0].Addr, 1<<20, 5*time.Second)
	require.Equal(t, status.PermissionDenied, status.CodeOf(err), "%v", err)

	_, err = peer.Cmd("unregister 1")
	require.NoError(t, err)
	require.Len(t, stale.Regions, 2, "the stale descriptor still lists the buffer")
	for _, n := range []uint64{1, 4096, 1 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			err := tr.Raw(addr, inc, core.OpWrite, host.Addr(src), stale.Regions[1].Addr, n, 5*time.Second)
			require.Equal(t, status.NotRegistered, status.CodeOf(err), "%v", err)
		})
	}
	require.Equal(t, sums, []string{peerSum(t, peer, 0), peerSum(t, peer, 1)}, "the peer's memory changed")
	// Whereas a READ of the read-only buffer works and returns its pattern.
	require.NoError(t, tr.Raw(addr, inc, core.OpRead, host.Addr(src)+1, peer.Buffers[0].Addr, 1<<20, 5*time.Second))
	require.Equal(t, peertest.Pattern(0, 1<<20), src[1:1<<20+1])
}

// Memory a target registered and then unmapped without unregistering: the
// target's copy into it faults. That must fail the requests, not kill the
// target process, and the engines keep working afterwards.
func TestUnmappedTargetMemory(t *testing.T) {
	a, _ := newEngine(t, core.Options{})
	var logged logbuf.Buffer
	b, _ := newEngine(t, core.Options{Logger: slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelError}))})
	src := alloc(t, a, 1<<20, 0)
	good := alloc(t, b, 1<<20, rw)
	random(src)
	m, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	gone := host.Addr(m)
	_, err = b.Register(core.RegionDesc{Addr: gone, Len: 1 << 20}, rw)
	require.NoError(t, err)
	// PROT_NONE faults like an unmapped range, and unlike munmap it keeps
	// the addresses from being reused by the next mmap (a slab, say).
	require.NoError(t, unix.Mprotect(m, unix.PROT_NONE))
	defer unix.Munmap(m)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	for _, n := range []uint64{64, 1 << 20} { // through the buffer, and readv
		for _, op := range []core.Op{core.OpWrite, core.OpRead} {
			code, _, err := run(t, a, []core.TransferRequest{{Op: op, Local: host.Addr(src), Segment: seg, Remote: gone, Len: n}}, 5*time.Second)
			require.NotEqual(t, status.OK, code, "%v", err)
		}
	}
	code, _, err := run(t, a, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: host.Addr(good), Len: 1 << 20}}, 5*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, src, good)
	// The fault that ended a connection is reported as an error, with its
	// address: the guard covers the handler's own code too, where a fault
	// would be a bug.
	require.Contains(t, logged.String(), "tcp connection ended by a memory fault")
	require.Contains(t, logged.String(), fmt.Sprintf("%#x", gone))
}
