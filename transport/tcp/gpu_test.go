package tcp_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// gpuEngine is an engine with the tcp transport only and the GPU memory
// of the fake driver d.
func gpuEngine(t *testing.T, d *cu.Driver) *core.Engine {
	t.Helper()
	e, err := core.New(core.Options{Available: available(tcp.Options{}), Transports: []string{"tcp"}, Memory: []tmem.Kind{cumem.New(d)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// memAlloc returns n bytes of cuMemAlloc memory on GPU 0 (memory the cuda
// transport could not share: only staging moves it), freed at cleanup.
func memAlloc(t *testing.T, d *cu.Driver, n uint64) uint64 {
	t.Helper()
	p, err := d.MemAlloc(0, n)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.MemFree(p)) })
	return p
}

func readGPU(t *testing.T, d *cu.Driver, p, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.CopyDtoH(b, p))
	return b
}

// An engine with GPU memory but only the tcp transport, in a process
// where no cuda transport exists at all (this test binary does not link
// it): it detects GPU memory as cuda:N, allocates it, and moves it
// through host staging buffers with its own driver, on both sides of a
// transfer.
func TestGPUMemoryWithoutCUDATransport(t *testing.T) {
	f := fakecuda.New(t)
	d, err := cu.Load(f.Path)
	require.NoError(t, err)
	initiator, target := gpuEngine(t, d), gpuEngine(t, d)
	require.Equal(t, []string{"tcp"}, initiator.Available(), "no cuda transport in the engine")
	require.Equal(t, []string{"cuda", "cpu"}, initiator.Memory().Names())

	const size = 5<<20 + 3 // two staging pieces
	src, dst := memAlloc(t, d, size), memAlloc(t, d, size)
	require.NoError(t, d.CopyHtoD(src, peertest.Pattern(7, size)))

	// Detection: no location given, and the engine says cuda:0.
	rs, err := initiator.Register(core.RegionDesc{Addr: src, Len: size}, 0)
	require.NoError(t, err)
	require.Equal(t, core.Location{Kind: "cuda", Device: 0}, rs.Loc)
	rd, err := target.Register(core.RegionDesc{Addr: dst, Len: size}, core.PermRemoteRead|core.PermRemoteWrite)
	require.NoError(t, err)
	require.Equal(t, "cuda:0", rd.Loc.String())
	// A location given explicitly is checked against the driver, with no
	// cuda transport to do it: GPU memory as host memory would have tcp
	// read a socket into it directly.
	_, err = initiator.Register(core.RegionDesc{Addr: dst, Len: 4096, Location: "cpu"}, 0)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	require.ErrorContains(t, err, "is GPU memory of cuda:0")
	_, err = initiator.Register(core.RegionDesc{Addr: dst, Len: 4096, Location: "cuda:1"}, 0)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	// Allocation: the engine's own GPU memory, on the fake's device 1.
	ra, err := initiator.Alloc(1<<20, "cuda:1", 0)
	require.NoError(t, err)
	require.Equal(t, "cuda:1", ra.Loc.String())
	require.NoError(t, initiator.Free(ra))

	seg, err := initiator.OpenSegment(target.Name())
	require.NoError(t, err)
	// GPU to GPU: staged out of the initiator's GPU, into the target's.
	calls := f.Counters().Calls
	code, st, err := run(t, initiator, []core.TransferRequest{{Op: core.OpWrite, Local: src, Segment: seg, Remote: dst, Len: size}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size, Flags: core.FlagStaged}, st[0])
	require.Equal(t, peertest.Pattern(7, size), readGPU(t, d, dst, size))
	require.Greater(t, f.Counters().Calls, calls+3, "the copies went through the driver")

	// And back, into the initiator's GPU memory.
	require.NoError(t, d.CopyHtoD(dst, peertest.Pattern(8, size)))
	code, st, err = run(t, initiator, []core.TransferRequest{{Op: core.OpRead, Local: src, Segment: seg, Remote: dst, Len: size}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.FlagStaged, st[0].Flags)
	require.Equal(t, peertest.Pattern(8, size), readGPU(t, d, src, size))

	// The staging copy is the driver's: a failing cuMemcpyDtoH fails the
	// request with the driver's error.
	f.Fail("cuMemcpyDtoH_v2", 1, 700) // CUDA_ERROR_ILLEGAL_ADDRESS
	code, _, err = run(t, initiator, []core.TransferRequest{{Op: core.OpWrite, Local: src, Segment: seg, Remote: dst, Len: 4096}}, 10*time.Second)
	require.NotEqual(t, status.OK, code)
	require.ErrorContains(t, err, "cuMemcpyDtoH")
}

// An engine without GPU memory refuses GPU locations, whatever another
// engine of the process has.
func TestGPUMemoryIsPerEngine(t *testing.T) {
	f := fakecuda.New(t)
	d, err := cu.Load(f.Path)
	require.NoError(t, err)
	with := gpuEngine(t, d)
	without, _ := newEngine(t, core.Options{})
	p := memAlloc(t, d, 4096)

	r, err := with.Register(core.RegionDesc{Addr: p, Len: 4096}, 0)
	require.NoError(t, err)
	require.True(t, r.Loc.IsCUDA())
	r2, err := without.Register(core.RegionDesc{Addr: p, Len: 4096}, 0)
	require.NoError(t, err)
	require.Equal(t, "cpu", r2.Loc.String(), "an engine without GPU memory cannot tell GPU memory apart")
	_, err = without.Register(core.RegionDesc{Addr: p + 8192, Len: 4096, Location: "cuda:0"}, 0)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.ErrorContains(t, err, "no CUDA driver")
	_, err = without.Alloc(4096, "cuda:0", 0)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
}
