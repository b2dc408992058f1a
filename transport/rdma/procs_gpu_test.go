package rdma

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/rdma/verbs"
	"github.com/tent-dev/tent/transport/tcp"
)

// gpuSetup is an engine with rdma and tcp and the GPU memory of a fake
// CUDA driver, which the fake libibverbs knows as device memory.
type gpuSetup struct {
	f  *fake
	cf *fakecuda.Fake
	d  *cu.Driver
	e  *core.Engine
	tr *Transport
}

func newGPUSetup(t *testing.T, devices string) *gpuSetup {
	t.Helper()
	f := useFake(t, devices)
	cf := fakecuda.New(t)
	d, err := cu.Load(cf.Path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	require.True(t, d.Features().DMABuf)
	t.Setenv("FAKEVERBS_CUDA", cf.Path)
	t.Setenv("FAKEVERBS_PEERMEM", "")
	held, err := verbs.Open(os.Getenv(verbs.LibraryEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Close() })
	e, err := core.New(core.Options{Available: procAvailable(), Transports: []string{}, Memory: []tmem.Kind{cumem.New(d)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	tr := New(Options{})
	require.NoError(t, e.Install(tr))
	require.NoError(t, e.Install(tcp.New(tcp.Options{})))
	return &gpuSetup{f: f, cf: cf, d: d, e: e, tr: tr}
}

// gpuBuf is n bytes of GPU 0 (cuMemAlloc) holding pattern seed.
func (g *gpuSetup) gpuBuf(t *testing.T, n uint64, seed int64) uint64 {
	t.Helper()
	p, err := g.d.MemAlloc(0, n)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.d.MemFree(p)) })
	require.NoError(t, g.d.CopyHtoD(p, peertest.Pattern(seed, n)))
	return p
}

// dmabufFDs counts this process's open fake dmabuf fds.
func dmabufFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	k := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(target, "fakecuda-dmabuf") {
			k++
		}
	}
	return k
}

// transferGPU writes the GPU buffer to the peer, clears it and reads the
// peer's buffer back into it, pinned to via ("" for any transport), and returns
// the two statuses.
func transferGPU(t *testing.T, g *gpuSetup, p *peertest.Peer, gpu uint64, n uint64, via string) []core.RequestStatus {
	t.Helper()
	seg, err := g.e.OpenSegment(p.Name)
	require.NoError(t, err)
	remote := p.Buffers[0].Addr
	code, w, err := run(t, g.e, []core.TransferRequest{{Op: core.OpWrite, Local: gpu, Segment: seg, Remote: remote, Len: n}}, core.TransferOptions{Transport: via})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, peertest.Sum(peertest.Pattern(5, n)), sum(t, p, 0), "the peer holds the GPU's bytes")
	require.NoError(t, g.d.CopyHtoD(gpu, make([]byte, n)))
	code, r, err := run(t, g.e, []core.TransferRequest{{Op: core.OpRead, Local: gpu, Segment: seg, Remote: remote, Len: n}}, core.TransferOptions{Transport: via})
	require.Equal(t, status.OK, code, "%v", err)
	back := make([]byte, n)
	require.NoError(t, g.d.CopyDtoH(back, gpu))
	require.Equal(t, peertest.Sum(peertest.Pattern(5, n)), peertest.Sum(back), "the GPU holds the peer's bytes again")
	return []core.RequestStatus{w[0], r[0]}
}

func (g *gpuSetup) requireGPURegions(t *testing.T, dmabuf, peermem int64) {
	t.Helper()
	st := g.tr.Stats()
	require.Equal(t, dmabuf, st["gpu_regions.dmabuf"], "%v", st)
	require.Equal(t, peermem, st["gpu_regions.peermem"], "%v", st)
}

// GPU memory is registered with every NIC as a dmabuf of the CUDA driver
// (ibv_reg_dmabuf_mr), and rdma moves it straight to and from the peer, no
// staging; the fd is closed once the MRs hold the dmabuf, and unregister
// deregisters them.
func TestProcessesGPUMemoryOverDMABuf(t *testing.T) {
	g := newGPUSetup(t, "fake0,fake1")
	const n = 2 << 20
	p := startPeer(t, g.f, peertest.Buffer{Size: n, Perm: rw})
	gpu := g.gpuBuf(t, n, 5)
	r, err := g.e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
	require.NoError(t, err)
	require.True(t, r.Loc.IsCUDA())
	g.requireGPURegions(t, 1, 0)
	require.EqualValues(t, 2, g.f.counts(t).MRs, "one MR per NIC")
	require.Zero(t, dmabufFDs(t), "the dmabuf fd is closed after registration")
	for _, s := range transferGPU(t, g, p, gpu, n, Name) {
		require.EqualValues(t, ID, s.Transport)
		require.Zero(t, s.Flags&core.FlagStaged, "no staging through host memory")
	}
	require.NoError(t, g.e.Unregister(r))
	g.requireGPURegions(t, 0, 0)
	require.Zero(t, g.f.counts(t).MRs)
	require.NoError(t, g.e.Uninstall(Name))
	g.f.requireNoObjects(t)
}

// A driver that cannot export a dmabuf leaves ibv_reg_mr on the device
// pointer, which works where nvidia-peermem is loaded.
func TestProcessesGPUMemoryOverPeerMem(t *testing.T) {
	g := newGPUSetup(t, "fake0")
	t.Setenv("FAKEVERBS_PEERMEM", "1")
	const n = 2 << 20
	p := startPeer(t, g.f, peertest.Buffer{Size: n, Perm: rw})
	gpu := g.gpuBuf(t, n, 5)
	g.cf.FailTimes("cuMemGetHandleForAddressRange", 1, 1000, 801) // CUDA_ERROR_NOT_SUPPORTED
	r, err := g.e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
	require.NoError(t, err)
	g.requireGPURegions(t, 0, 1)
	for _, s := range transferGPU(t, g, p, gpu, n, Name) {
		require.EqualValues(t, ID, s.Transport)
		require.Zero(t, s.Flags&core.FlagStaged)
	}
	require.NoError(t, g.e.Unregister(r))
	require.Zero(t, g.f.counts(t).MRs)
}

// Without a dmabuf and without peer memory, GPU memory is not registered
// with the NICs: the registration still succeeds, rdma does not serve it,
// and tcp stages it through host memory as before.
func TestProcessesGPUMemoryNoNICPathStagesOnTCP(t *testing.T) {
	g := newGPUSetup(t, "fake0")
	const n = 2 << 20
	p := startPeer(t, g.f, peertest.Buffer{Size: n, Perm: rw})
	gpu := g.gpuBuf(t, n, 5)
	g.cf.FailTimes("cuMemGetHandleForAddressRange", 1, 1000, 801)
	r, err := g.e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
	require.NoError(t, err)
	g.requireGPURegions(t, 0, 0)
	require.Zero(t, g.f.counts(t).MRs, "ibv_reg_mr on device memory failed and left nothing")
	require.Zero(t, g.tr.Stats()["regions"])

	seg, err := g.e.OpenSegment(p.Name)
	require.NoError(t, err)
	code, _, _ := run(t, g.e, []core.TransferRequest{{Op: core.OpWrite, Local: gpu, Segment: seg, Remote: p.Buffers[0].Addr, Len: n}},
		core.TransferOptions{Transport: Name})
	require.NotEqual(t, status.OK, code, "rdma cannot serve unregistered GPU memory")
	for _, s := range transferGPU(t, g, p, gpu, n, "") {
		require.EqualValues(t, tcp.ID, s.Transport)
		require.NotZero(t, s.Flags&core.FlagStaged, "staged through host memory")
	}
	require.NoError(t, g.e.Unregister(r))
}

// A dmabuf registration that fails on the second NIC is undone on the
// first before the device pointer is tried; a panic in the middle of a
// GPU registration leaves no MR, region or open dmabuf fd.
func TestProcessesGPURegistrationRollsBack(t *testing.T) {
	g := newGPUSetup(t, "fake0,fake1")
	t.Setenv("FAKEVERBS_PEERMEM", "1")
	t.Setenv("FAKEVERBS_FAIL", "ibv_reg_dmabuf_mr:dev=fake1")
	const n = 2 << 20
	gpu := g.gpuBuf(t, n, 5)
	r, err := g.e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
	require.NoError(t, err)
	g.requireGPURegions(t, 0, 1)
	require.EqualValues(t, 2, g.f.counts(t).MRs, "fake0's dmabuf MR was deregistered: only the two peermem MRs live")
	require.Zero(t, dmabufFDs(t))
	require.NoError(t, g.e.Unregister(r))
	require.Zero(t, g.f.counts(t).MRs)

	t.Setenv("FAKEVERBS_FAIL", "")
	calls := 0
	g.tr.opts.beforeRegMR = func(int) {
		if calls++; calls == 2 {
			panic("injected between the NICs of a dmabuf registration")
		}
	}
	_, err = g.e.Register(core.RegionDesc{Addr: gpu, Len: n}, rw)
	require.ErrorIs(t, err, status.ErrInternal)
	requireNothingRegistered(t, g.e, g.f)
	g.requireGPURegions(t, 0, 0)
	require.Zero(t, dmabufFDs(t), "the dmabuf fd is closed on the way up")
	require.NoError(t, g.e.Uninstall(Name))
	g.f.requireNoObjects(t)
}
