package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// GPU memory belongs to each engine, not to the cuda transport or the
// process: of three engines in this process, one with the cuda transport,
// one with tcp only and GPU memory, one with tcp only and no GPU memory,
// installing, uninstalling and reinstalling cuda on the first (and closing
// it) changes nothing in how the others detect, allocate and stage GPU
// memory.
func TestEnginesDoNotShareMemory(t *testing.T) {
	_, d := useFake(t)
	withCUDA, tr := newEngine(t, "cuda", "local")
	require.NotNil(t, tr)
	tcpGPU, _ := newEngine(t, "tcp")
	require.Nil(t, cudaOf(tcpGPU))
	testDriver = nil // the next engine gets no GPU memory
	tcpHost, _ := newEngine(t, "tcp")

	const n = 1 << 20
	gpu, err := d.MemAlloc(0, n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.MemFree(gpu) })
	// Host memory outside the Go heap: the target's tcp server writes it
	// on its own goroutine, ordered with this test only by the socket.
	hbuf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(hbuf) })
	_, err = tcpHost.Register(core.RegionDesc{Addr: host.Addr(hbuf), Len: n}, rw)
	require.NoError(t, err)
	seg := open(t, tcpGPU, tcpHost.Name())

	detect := func(e *core.Engine) string {
		t.Helper()
		r, err := e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
		require.NoError(t, err)
		require.NoError(t, e.Unregister(r))
		return r.Loc.String()
	}
	allocates := func(e *core.Engine) bool {
		t.Helper()
		r, err := e.Alloc(n, "cuda:1", rw)
		if err != nil {
			require.Equal(t, status.Unsupported, status.CodeOf(err), "%v", err)
			return false
		}
		require.Equal(t, "cuda:1", r.Loc.String())
		require.NoError(t, e.Free(r))
		return true
	}
	seed := int64(0)
	stages := func() {
		t.Helper()
		r, err := tcpGPU.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
		require.NoError(t, err)
		defer func() { require.NoError(t, tcpGPU.Unregister(r)) }()
		seed++
		want := peertest.Pattern(seed, n)
		require.NoError(t, d.CopyHtoD(gpu, want))
		clear(hbuf)
		code, err, st := transfer(t, tcpGPU, core.TransferRequest{Op: core.OpWrite, Local: gpu, Segment: seg, Remote: host.Addr(hbuf), Len: n})
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, core.FlagStaged, st[0].Flags)
		require.Equal(t, want, hbuf)
		require.NoError(t, d.CopyHtoD(gpu, make([]byte, n)))
		code, err, st = transfer(t, tcpGPU, core.TransferRequest{Op: core.OpRead, Local: gpu, Segment: seg, Remote: host.Addr(hbuf), Len: n})
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, core.FlagStaged, st[0].Flags)
		got := make([]byte, n)
		require.NoError(t, d.CopyDtoH(got, gpu))
		require.Equal(t, want, got)
	}
	others := func(stage string) {
		t.Helper()
		t.Log(stage)
		require.Equal(t, "cuda:0", detect(tcpGPU), stage)
		require.True(t, allocates(tcpGPU), stage)
		stages()
		require.Equal(t, "cpu", detect(tcpHost), stage)
		require.False(t, allocates(tcpHost), stage)
		_, err := tcpHost.Register(core.RegionDesc{Addr: gpu, Len: n, Location: "cuda:0"}, rw)
		require.Equal(t, status.Unsupported, status.CodeOf(err), stage)
	}

	others("cuda installed on the first engine")
	require.Equal(t, "cuda:0", detect(withCUDA))
	require.NoError(t, withCUDA.Uninstall(Name))
	others("cuda uninstalled from the first engine")
	// The first engine's GPU memory is its own too: it outlives its
	// transport.
	require.Equal(t, "cuda:0", detect(withCUDA))
	require.True(t, allocates(withCUDA))
	require.NoError(t, withCUDA.Install(New()))
	require.NotNil(t, cudaOf(withCUDA))
	others("cuda installed again")
	require.NoError(t, withCUDA.Close())
	others("the first engine closed")
}
