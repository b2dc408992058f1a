package cuda

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

func TestNoDriverChildProcess(t *testing.T) {
	out := runChild(t, "nodriver", "TENT_CUDA_DRIVER=/nonexistent/libcuda.so.1")
	require.Contains(t, out, "no CUDA driver")
}

func TestNoDriverInProcess(t *testing.T) {
	// No useFake: the engine has no GPU memory.
	e, tr := newEngine(t, "cuda", "local")
	require.Nil(t, tr, "a transport that cannot serve is not installed")
	require.Contains(t, e.Stats().Unavailable[Name], "no CUDA driver: the engine was created without GPU memory")
	_, err := e.Alloc(1<<20, "cuda:0", rw)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	requireMsg(t, err, "cuda:0", "no CUDA driver")
	require.Equal(t, status.NotFound, status.CodeOf(e.Uninstall(Name)))

	// The transport itself, installed directly, stays inert.
	inert := New()
	require.NoError(t, inert.Install(e))
	require.Contains(t, inert.Unavailable(), "no CUDA driver")
	require.Equal(t, int64(0), inert.Stats()["gpus"])
	_, r := hostBuf(t, e, 4096)
	require.False(t, inert.Eligible(&core.Request{LocalRegion: r, RemoteRegion: wireRegion("cuda:0", 1)}))
	require.Empty(t, inert.Endpoints())
	require.NoError(t, inert.Uninstall())
}

func TestAllocRegisterDetect(t *testing.T) {
	f, d := useFake(t)
	e, tr := newEngine(t, "cuda")
	require.Equal(t, int64(2), e.Stats().Transports[Name]["gpus"])
	require.Len(t, tr.Endpoints(), 1)
	require.True(t, strings.HasPrefix(tr.Endpoints()[0].Addr, "@tent-cuda-"))

	r, err := e.Alloc(100_000, "cuda:1", rw)
	require.NoError(t, err)
	require.Equal(t, core.Location{Kind: "cuda", Device: 1}, r.Loc)
	require.Equal(t, uint64(2*gran), r.Len, "rounded up to the granularity")
	require.NotNil(t, r.Alloc)
	require.Equal(t, int64(1), f.Counters().Handles)
	require.Equal(t, int64(1), e.Stats().Transports[Name]["exports"])

	_, err = e.Alloc(4096, "cuda:7", rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))

	// Location detection: device memory of a plain cuMemAlloc, host memory.
	p, err := d.MemAlloc(0, 8192)
	require.NoError(t, err)
	defer d.MemFree(p)
	pr, err := e.Register(core.RegionDesc{Addr: p, Len: 8192}, rw)
	require.NoError(t, err)
	require.Equal(t, "cuda:0", pr.Loc.String())
	require.NoError(t, e.Unregister(pr))
	_, hr := hostBuf(t, e, 4096)
	require.Equal(t, "cpu", hr.Loc.String())

	// A wrong location is refused: host transports would crash on it.
	_, err = e.Register(core.RegionDesc{Addr: p, Len: 8192, Location: "cpu"}, rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	requireMsg(t, err, "GPU memory of cuda:0")
	_, err = e.Register(core.RegionDesc{Addr: p, Len: 8192, Location: "cuda:1"}, rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	// A GPU the driver does not see.
	_, err = e.Register(core.RegionDesc{Addr: p, Len: 8192, Location: "cuda:2"}, rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	requireMsg(t, err, "sees 2 GPU(s)")
	other := make([]byte, 4096)
	_, err = e.Register(core.RegionDesc{Addr: uint64(uintptr(unsafe.Pointer(&other[0]))), Len: 4096, Location: "cuda:0"}, rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	requireMsg(t, err, "not GPU memory")

	desc, err := e.Descriptor()
	require.NoError(t, err)
	rd, ok := desc.FindRegion(r.Addr, 1)
	require.True(t, ok)
	require.Equal(t, r.Alloc.ID, rd.AllocID)
	require.Empty(t, rd.Attachments, "no fabric without FAKECUDA_FABRIC")

	require.NoError(t, e.Free(r))
	require.Equal(t, int64(0), e.Stats().Transports[Name]["exports"])
	require.NoError(t, d.MemFree(p))
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

func TestFabricAllocationAttachment(t *testing.T) {
	f, _ := useFake(t, fakecuda.Fabric(true))
	e, _ := newEngine(t, "cuda")
	r, err := e.Alloc(gran, "cuda:0", rw)
	require.NoError(t, err)
	desc, err := e.Descriptor()
	require.NoError(t, err)
	require.Len(t, desc.Regions, 1)
	fh, size, ok := fabricAttachment(&desc.Regions[0])
	require.True(t, ok)
	require.Equal(t, uint64(gran), size)
	require.Equal(t, "FAKEFAB1", string(fh[:8]))
	require.NoError(t, e.Free(r))
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// TestTransferAcrossProcesses moves data between this process and a peer
// process: DtoD both ways, HtoD and DtoH, at offsets, several allocations
// in one batch, and checks the checksums on both sides.
func TestTransferAcrossProcesses(t *testing.T) {
	f, d := useFake(t)
	const size = 4 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size), gpuBuf(size)})
	e, tr := newEngine(t, "cuda", "local")
	seg := open(t, e, peer.Name)
	b0, b1 := peer.Buffers[0], peer.Buffers[1]
	require.NotZero(t, b0.AllocID)

	lg, err := e.Alloc(2*size, "cuda:0", rw)
	require.NoError(t, err)
	hbuf, hr := hostBuf(t, e, size)

	fds0 := fdCount(t)
	base := live(f)

	// DtoD read of both peer buffers into the two halves of lg.
	mustTransfer(t, e,
		core.TransferRequest{Op: core.OpRead, Local: lg.Addr, Segment: seg, Remote: b0.Addr, Len: size},
		core.TransferRequest{Op: core.OpRead, Local: lg.Addr + size, Segment: seg, Remote: b1.Addr, Len: size})
	require.Equal(t, peertest.Sum(peertest.Pattern(0, size)), peertest.Sum(readDev(t, d, lg.Addr, size)))
	require.Equal(t, peertest.Sum(peertest.Pattern(1, size)), peertest.Sum(readDev(t, d, lg.Addr+size, size)))
	st := e.Stats().Transports[Name]
	require.Equal(t, int64(2), st["imports_total"])
	require.Equal(t, int64(2), st["mappings"])
	require.Equal(t, int64(1), st["sessions"])

	// DtoH read at an offset: the imports are reused.
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: hr.Addr, Segment: seg, Remote: b1.Addr + 1000, Len: size - 1000})
	require.Equal(t, peertest.Pattern(1, size)[1000:], hbuf[:size-1000])
	require.Equal(t, int64(2), e.Stats().Transports[Name]["imports_total"], "cached imports are reused")

	// HtoD write, then DtoD write; the peer's checksums must match.
	copy(hbuf, peertest.Pattern(42, size))
	mustTransfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: hr.Addr, Segment: seg, Remote: b0.Addr, Len: size})
	require.Equal(t, peertest.Sum(peertest.Pattern(42, size)), cmd(t, peer, "sum 0"))
	require.NoError(t, d.CopyHtoD(lg.Addr, peertest.Pattern(43, size)))
	mustTransfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: lg.Addr, Segment: seg, Remote: b1.Addr, Len: size})
	require.Equal(t, peertest.Sum(peertest.Pattern(43, size)), cmd(t, peer, "sum 1"))

	// Many small requests in one batch, alternating directions.
	var reqs []core.TransferRequest
	for i := uint64(0); i < 32; i++ {
		op := core.OpRead
		if i%2 == 1 {
			op = core.OpWrite
		}
		reqs = append(reqs, core.TransferRequest{Op: op, Local: lg.Addr + size + i*4096, Segment: seg, Remote: b0.Addr + i*4096, Len: 4096})
	}
	mustTransfer(t, e, reqs...)

	// The target holds no lease afterwards, and exported no fd it kept.
	eventually(t, "peer leases released", func() bool { return peerStats(t, peer)["leases"] == 0 })
	require.Equal(t, int64(2), peerStats(t, peer)["exports_total"])

	require.NoError(t, e.Uninstall(Name))
	st = tr.Stats()
	require.Zero(t, st["mappings"])
	require.Zero(t, st["streams"])
	require.Zero(t, st["sessions"])
	require.Equal(t, base, live(f), "the uninstall released every import, stream and event")
	waitFDs(t, fds0-1) // minus the transport's own Unix listener
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestNonVMMMemory: plain cuMemAlloc memory registers and works as a
// local buffer of the cuda transport; another process's such memory cannot
// be imported, so without a staging transport nothing can move it.
func TestNonVMMMemory(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, _ := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)

	p, err := d.MemAlloc(0, size)
	require.NoError(t, err)
	defer d.MemFree(p)
	lr, err := e.Register(core.RegionDesc{Addr: p, Len: size}, rw)
	require.NoError(t, err)
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: p, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, p, size))

	addr, err := strconv.ParseUint(cmd(t, peer, "memalloc %d 9", size), 10, 64)
	require.NoError(t, err)
	// (The engine refreshes a descriptor that lacks the region.)
	code, err, _ := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: p, Segment: seg, Remote: addr, Len: size})
	require.Equal(t, status.Unsupported, code)
	requireMsg(t, err, "no installed transport can move")
	require.NoError(t, e.Unregister(lr))
	require.NoError(t, e.Close())
	require.NoError(t, d.MemFree(p))
	f.AssertClean(t)
}

// TestStagedOverTCP: GPU memory that the cuda transport cannot reach in
// another process (cuMemAlloc memory on either side, or local GPU memory
// with the peer's host memory) moves over tcp through host buffers, and
// the status says so; engine-allocated GPU memory still goes through the
// cuda transport. A failed staging copy fails its request only, and every
// staging buffer is unmapped afterwards.
func TestStagedOverTCP(t *testing.T) {
	f, d := useFake(t)
	const size = 6<<20 + 12345 // more than one staging piece (4 MiB)
	peer := peertest.Start(t, peertest.Config{Transports: []string{"cuda", "tcp"}, Env: f.Env(),
		Buffers: []peertest.Buffer{{Size: size, Perm: rw}, gpuBuf(4 * gran)}})
	e, _ := newEngine(t, "cuda", "tcp")
	seg := open(t, e, peer.Name)
	tcpStats := func() map[string]int64 { return e.Stats().Transports["tcp"] }

	p, err := d.MemAlloc(0, 2*size)
	require.NoError(t, err)
	lr, err := e.Register(core.RegionDesc{Addr: p, Len: 2 * size}, rw)
	require.NoError(t, err)
	require.True(t, lr.Loc.IsCUDA())
	hbuf, _ := hostBuf(t, e, size)
	remote, err := strconv.ParseUint(cmd(t, peer, "memalloc %d 9", size), 10, 64)
	require.NoError(t, err)

	staged := core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size, Flags: core.FlagStaged}
	one := func(op core.Op, local, remoteAddr uint64) {
		t.Helper()
		code, err, st := transfer(t, e, core.TransferRequest{Op: op, Local: local, Segment: seg, Remote: remoteAddr, Len: size})
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, staged, st[0])
	}

	// Local GPU <-> the peer's host memory.
	one(core.OpRead, p, peer.Buffers[0].Addr)
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, p, size))
	require.NoError(t, d.CopyHtoD(p, peertest.Pattern(3, size)))
	one(core.OpWrite, p, peer.Buffers[0].Addr)
	require.Equal(t, peertest.Sum(peertest.Pattern(3, size)), cmd(t, peer, "sum 0"))

	// Local host <-> the peer's cuMemAlloc memory (the target stages).
	one(core.OpRead, host.Addr(hbuf), remote)
	require.Equal(t, peertest.Pattern(9, size), hbuf)
	copy(hbuf, peertest.Pattern(4, size))
	one(core.OpWrite, host.Addr(hbuf), remote)

	// GPU to GPU, both staged: what was just written comes back.
	one(core.OpRead, p+size, remote)
	require.Equal(t, peertest.Pattern(4, size), readDev(t, d, p+size, size))

	// Engine-allocated GPU memory of the peer: the cuda transport, no staging.
	code, err, st := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: p, Segment: seg, Remote: peer.Buffers[1].Addr, Len: 4 * gran})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: ID, Bytes: 4 * gran}, st[0])

	// A failing copy from the GPU fails that request, with the driver's
	// reason; the next one works.
	f.Fail("cuMemcpyDtoH_v2", 1, 700) // CUDA_ERROR_ILLEGAL_ADDRESS
	code, err, st = transfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: p, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.NotEqual(t, status.OK, code)
	require.Equal(t, tcp.ID, st[0].Transport)
	requireMsg(t, err, "staging", "cuMemcpyDtoH")
	f.ClearFailures()
	one(core.OpWrite, p, peer.Buffers[0].Addr)
	// The same at the target: its copy to its GPU fails, the reply says why.
	require.Equal(t, "ok", cmd(t, peer, "fail cuMemcpyHtoD_v2 1 700"))
	code, err, _ = transfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(hbuf), Segment: seg, Remote: remote, Len: size})
	require.NotEqual(t, status.OK, code)
	requireMsg(t, err, "refused", "cuMemcpyHtoD")
	one(core.OpRead, host.Addr(hbuf), remote) // the connection is still usable

	require.Zero(t, tcpStats()["staging_buffers"], "the initiator's staging buffers are unmapped")
	require.GreaterOrEqual(t, tcpStats()["bytes_staged"], int64(4*size))
	require.Zero(t, tcpStats()["requests_in_flight"])
	require.NoError(t, e.Unregister(lr))
	require.NoError(t, d.MemFree(p))
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// TestSameProcessPeers: an engine reading and writing GPU memory of
// another engine of the same process, without any import.
func TestSameProcessPeers(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	e1, _ := newEngine(t, "cuda", "local")
	e2, _ := newEngine(t, "cuda", "local")
	rr, err := e2.Alloc(size, "cuda:1", rw)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(rr.Addr, peertest.Pattern(5, size)))
	lr, err := e1.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	hbuf, hr := hostBuf(t, e1, size)
	seg := open(t, e1, e2.Name())

	mustTransfer(t, e1, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: rr.Addr, Len: size})
	require.Equal(t, peertest.Pattern(5, size), readDev(t, d, lr.Addr, size))
	mustTransfer(t, e1, core.TransferRequest{Op: core.OpRead, Local: hr.Addr, Segment: seg, Remote: rr.Addr, Len: size})
	require.Equal(t, peertest.Pattern(5, size), hbuf)
	copy(hbuf, peertest.Pattern(6, size))
	mustTransfer(t, e1, core.TransferRequest{Op: core.OpWrite, Local: hr.Addr, Segment: seg, Remote: rr.Addr, Len: size})
	require.Equal(t, peertest.Pattern(6, size), readDev(t, d, rr.Addr, size))
	require.Zero(t, e1.Stats().Transports[Name]["imports_total"])

	// The target's permissions are enforced.
	ro, err := e2.Alloc(size, "cuda:0", core.PermRemoteRead)
	require.NoError(t, err)
	code, err, _ := transfer(t, e1, core.TransferRequest{Op: core.OpWrite, Local: lr.Addr, Segment: seg, Remote: ro.Addr, Len: size})
	require.Equal(t, status.PermissionDenied, code, "%v", err)

	require.NoError(t, e1.Close())
	require.NoError(t, e2.Close())
	f.AssertClean(t)
}

// TestLeaseProtocol drives the target's lease checks directly: every
// range is checked with Acquire and refusals carry the target's code;
// granted ranges are held until released.
func TestLeaseProtocol(t *testing.T) {
	f, _ := useFake(t)
	const size = 2 * gran
	ro := gpuBuf(size)
	ro.Perm = core.PermRemoteRead
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size), ro})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	desc := seg.Peer().Desc()
	s, err := tr.session(desc, false, time.Now().Add(5*time.Second))
	require.NoError(t, err)

	b0, b1 := peer.Buffers[0], peer.Buffers[1]
	id, gs, err := s.lease([]leaseRange{
		{addr: b0.Addr, len: size, write: true},
		{addr: b1.Addr, len: 10, write: true},        // read-only region
		{addr: b0.Addr + size - 10, len: 20},         // runs past the region
		{addr: 4096, len: 10},                        // not registered
		{addr: b1.Addr + 100, len: 10, write: false}, // fine
	}, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	require.NotZero(t, id)
	require.NoError(t, gs[0].err)
	require.Equal(t, b0.AllocID, gs[0].alloc)
	require.Equal(t, b0.Addr, gs[0].base)
	require.True(t, gs[0].cuda)
	require.Equal(t, status.PermissionDenied, status.CodeOf(gs[1].err))
	require.Equal(t, status.OutOfRange, status.CodeOf(gs[2].err))
	require.Equal(t, status.NotRegistered, status.CodeOf(gs[3].err))
	require.NoError(t, gs[4].err)
	require.Equal(t, int64(1), peerStats(t, peer)["leases"])

	s.release(id)
	eventually(t, "lease released", func() bool { return peerStats(t, peer)["leases"] == 0 })

	// A lease nobody releases ends with the session.
	_, _, err = s.lease([]leaseRange{{addr: b0.Addr, len: 1}}, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	require.Equal(t, int64(1), peerStats(t, peer)["leases"])
	s.fail(status.Errorf(status.Closed, "test"))
	eventually(t, "lease released on close", func() bool { return peerStats(t, peer)["leases"] == 0 })

	// Import of an unknown allocation: the target's NotFound.
	s, err = tr.session(desc, false, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	_, _, _, err = s.importFD(12345, time.Now().Add(5*time.Second))
	require.Equal(t, status.NotFound, status.CodeOf(err))
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// TestImportFaults fails each step of an import in turn (and the copy and
// stream steps after it): the request fails cleanly, nothing stays behind,
// and the next request imports afresh and succeeds.
func TestImportFaults(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	read := core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size}

	// Warm up the session, streams and events, then measure.
	mustTransfer(t, e, read)
	require.NoError(t, e.Uninstall(Name))
	require.NoError(t, e.Install(tr))
	fds0 := fdCount(t)
	base := live(f)

	for _, step := range []struct {
		fn   string
		err  int
		code status.Code
	}{
		{"cuMemImportFromShareableHandle", 2, status.NoMemory},
		{"cuMemGetAllocationGranularity", 1, status.InvalidArgument},
		{"cuMemAddressReserve", 2, status.NoMemory},
		{"cuMemMap", 1, status.InvalidArgument},
		{"cuMemSetAccess", 1, status.InvalidArgument},
		{"cuStreamCreate", 2, status.NoMemory},
		{"cuMemcpyAsync", 1, status.InvalidArgument},
	} {
		t.Run(step.fn, func(t *testing.T) {
			require.NoError(t, d.CopyHtoD(lr.Addr, make([]byte, size)))
			failures := f.Counters().Failures
			f.Fail(step.fn, 1, step.err)
			code, err, _ := transfer(t, e, read)
			require.Equal(t, step.code, code, "%v", err)
			requireMsg(t, err, step.fn)
			require.Equal(t, failures+1, f.Counters().Failures)
			st := tr.Stats()
			if step.fn != "cuMemcpyAsync" && step.fn != "cuStreamCreate" {
				require.Zero(t, st["mappings"], "a failed import holds nothing")
				require.Zero(t, st["cached_imports"])
			}
			// The next request succeeds (importing again when needed).
			mustTransfer(t, e, read)
			require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
			require.NoError(t, e.Uninstall(Name))
			require.Equal(t, base, live(f))
			waitFDs(t, fds0-1)
			require.NoError(t, e.Install(tr))
			waitFDs(t, fds0)
		})
	}
	// An event that cannot be created: the copy still completes (the
	// stream is synchronized instead).
	f.Fail("cuEventCreate", 1, 2)
	mustTransfer(t, e, read)

	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestExportFault: the target fails to export; the request fails with the
// target's code, the target keeps no fd, and a retry works.
func TestExportFault(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)}, "FAKECUDA_FAIL=cuMemExportToShareableHandle:1:2")
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	read := core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size}
	base := live(f)

	code, err, _ := transfer(t, e, read)
	require.Equal(t, status.NoMemory, code)
	requireMsg(t, err, "cuMemExportToShareableHandle")
	require.Equal(t, int64(1), peerFake(t, peer).Failures)
	require.Equal(t, int64(1), peerStats(t, peer)["export_failures"])
	require.Equal(t, base, live(f))
	require.Zero(t, tr.Stats()["mappings"])

	// The session is up now; a successful export leaves no fd behind at
	// the target (it closes its copy once sent).
	peerFDs := peerInt(t, peer, "fds")
	mustTransfer(t, e, read)
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
	// The target closes its copy after the send returns, which can be after
	// the initiator has finished the transfer with the received duplicate.
	eventually(t, "the target to close the fd it exported once sent", func() bool {
		return peerInt(t, peer, "fds") == peerFDs
	})
	require.Equal(t, int64(1), peerFake(t, peer).ExportedFDs)

	require.NoError(t, e.Close())
	f.AssertClean(t)
	// The peer frees its buffer: nothing of the fake stays alive there.
	require.Equal(t, "ok", cmd(t, peer, "free 0"))
	require.Empty(t, peerFake(t, peer).Leaks())
	require.NoError(t, peer.Stop())
}

// TestUninstallInFlight: requests that have not started copying fail with
// ErrUninstalled; copies already queued complete; everything is released.
func TestUninstallInFlight(t *testing.T) {
	for _, stage := range []string{"leased", "queued"} {
		t.Run(stage, func(t *testing.T) {
			f, d := useFake(t)
			const size = 2 * gran
			peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
			e, tr := newEngine(t, "cuda")
			seg := open(t, e, peer.Name)
			lr, err := e.Alloc(size, "cuda:0", rw)
			require.NoError(t, err)
			read := core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size}
			fds0 := fdCount(t)
			base := live(f)

			b, release := submitHeld(t, e, stage, read)
			done := make(chan error, 1)
			go func() { done <- e.Uninstall(Name) }()
			eventually(t, "uninstall started", tr.down.Load)
			select {
			case err := <-done:
				t.Fatalf("Uninstall returned (%v) while a copy was in flight", err)
			case <-time.After(50 * time.Millisecond):
			}
			release()
			require.NoError(t, <-done)
			code, err := b.Wait(-1)
			if stage == "leased" {
				require.Equal(t, status.Closed, code)
				requireMsg(t, err, "uninstalled")
			} else {
				require.Equal(t, status.OK, code, "%v", err)
				require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
			}
			require.Equal(t, base, live(f))
			waitFDs(t, fds0-1)
			// The target let go of the lease: the buffer frees at once.
			require.Equal(t, "ok", cmd(t, peer, "free 0"))
			require.NoError(t, e.Close())
			f.AssertClean(t)
			require.NoError(t, peer.Stop())
		})
	}
}

// TestCloseInFlight: destroying the engine with a batch in flight.
func TestCloseInFlight(t *testing.T) {
	f, _ := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	warm, _ := newEngine(t, "cuda") // the netpoller and such, before measuring
	require.NoError(t, warm.Close())
	fds0 := fdCount(t)

	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	b, release := submitHeld(t, e, "leased",
		core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	eventually(t, "uninstall started", tr.down.Load)
	release()
	require.NoError(t, <-done)
	code, _ := b.Wait(-1)
	require.Equal(t, status.Closed, code)
	<-b.Settled()
	f.AssertClean(t)
	waitFDs(t, fds0)
	eventually(t, "peer leases released", func() bool { return peerStats(t, peer)["leases"] == 0 })
	require.NoError(t, peer.Stop())
}

// TestReallocReimports: the peer frees its allocation and allocates again
// (at the same address, the fake's mmap permitting): the next transfer
// imports the new allocation and reads the new data, and the old import
// is released.
func TestReallocReimports(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	old := peer.Buffers[0]
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: old.Addr, Len: size})
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
	handles := f.Counters().Handles // ours: lr and the import

	var addr, alloc uint64
	_, err = fmt.Sscan(cmd(t, peer, "realloc 0 77"), &addr, &alloc)
	require.NoError(t, err)
	require.NotEqual(t, old.AllocID, alloc)
	if addr != old.Addr {
		t.Logf("the fake reallocated at %#x, not %#x: the ABA case is not exercised this run", addr, old.Addr)
	}
	// The target revoked the old allocation: our import goes without a
	// transfer.
	eventually(t, "old import released", func() bool { return tr.Stats()["mappings"] == 0 })
	require.Equal(t, handles-1, f.Counters().Handles)

	eventually(t, "new data", func() bool {
		code, _, _ := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: addr, Len: size})
		return code == status.OK
	})
	require.Equal(t, peertest.Pattern(77, size), readDev(t, d, lr.Addr, size))
	st := tr.Stats()
	require.Equal(t, int64(2), st["imports_total"], "a new import happened")
	require.Equal(t, int64(1), st["mappings"])
	require.Equal(t, handles, f.Counters().Handles)
	require.Equal(t, int64(2), peerFake(t, peer).ExportedFDs, "the target exported the new allocation")
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestStaleEntryNeverUsed: with revocation and descriptor invalidation
// turned off, the import of a freed allocation stays cached, yet it is
// never used for the allocation now at the address: the target's lease
// names the allocation, and imports are keyed by incarnation and
// allocation id, never by address.
func TestStaleEntryNeverUsed(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	tr.noInvalidate.Store(true)
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	first := peer.Buffers[0]
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: first.Addr, Len: size})

	var addr, alloc uint64
	_, err = fmt.Sscan(cmd(t, peer, "realloc 0 78"), &addr, &alloc)
	require.NoError(t, err)
	eventually(t, "new data", func() bool {
		code, _, _ := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: addr, Len: size})
		return code == status.OK
	})
	require.Equal(t, peertest.Pattern(78, size), readDev(t, d, lr.Addr, size))
	tr.mu.Lock()
	var allocs []uint64
	for k := range tr.cache {
		allocs = append(allocs, k.alloc)
	}
	tr.mu.Unlock()
	require.ElementsMatch(t, []uint64{first.AllocID, alloc}, allocs, "both imports cached, each under its own id")
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestReinstallReimports: Uninstall releases every import (generation
// bump); a request after re-installing imports again.
func TestReinstallReimports(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	read := core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size}
	mustTransfer(t, e, read)
	gen := tr.gen
	require.Equal(t, int64(1), tr.Stats()["imports_total"])

	require.NoError(t, e.Uninstall(Name))
	require.Zero(t, tr.Stats()["mappings"])
	require.Greater(t, tr.gen, gen)
	code, _, _ := transfer(t, e, read)
	require.Equal(t, status.Unsupported, code, "no transport left for GPU memory")

	// The same object again, then a fresh one.
	require.NoError(t, e.Install(tr))
	cmd(t, peer, "fill 0 11")
	mustTransfer(t, e, read)
	require.Equal(t, peertest.Pattern(11, size), readDev(t, d, lr.Addr, size))
	require.Equal(t, int64(2), tr.Stats()["imports_total"], "re-imported after re-install")
	require.NoError(t, e.Uninstall(Name))

	tr2 := New()
	require.NoError(t, e.Install(tr2))
	cmd(t, peer, "fill 0 12")
	mustTransfer(t, e, read)
	require.Equal(t, peertest.Pattern(12, size), readDev(t, d, lr.Addr, size))
	require.Equal(t, int64(1), tr2.Stats()["imports_total"])
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestPeerDiesReleasesImports: a peer that exits takes its session down;
// its imports are released at once (they kept its GPU memory alive).
func TestPeerDiesReleasesImports(t *testing.T) {
	f, _ := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.Equal(t, int64(1), tr.Stats()["mappings"])
	peer.Kill()
	eventually(t, "imports released", func() bool { return tr.Stats()["mappings"] == 0 && tr.Stats()["sessions"] == 0 })
	code, _, _ := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.NotEqual(t, status.OK, code)
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// TestFabricAcrossHosts: a peer on "another host" (TENT_MACHINE_ID) is
// reached through the fabric handle in its descriptor and a lease session
// over the engine's TCP listener.
func TestFabricAcrossHosts(t *testing.T) {
	f, d := useFake(t, fakecuda.Fabric(true))
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)}, "TENT_MACHINE_ID=another-host")
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	require.NotEqual(t, e.MachineID(), seg.Peer().Desc().MachineID)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	mustTransfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
	require.NoError(t, d.CopyHtoD(lr.Addr, peertest.Pattern(3, size)))
	mustTransfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	require.Equal(t, peertest.Sum(peertest.Pattern(3, size)), cmd(t, peer, "sum 0"))
	require.Zero(t, peerStats(t, peer)["exports_total"], "no fd crossed")
	require.Equal(t, int64(1), tr.Stats()["imports_total"])
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestSecretRequired: the Unix endpoint runs the engine's handshake.
func TestSecretRequired(t *testing.T) {
	f, _ := useFake(t)
	peer := peertest.Start(t, peertest.Config{Transports: []string{"cuda"}, Secret: "s3cret",
		Buffers: []peertest.Buffer{gpuBuf(gran)}, Env: f.Env()})
	e, err := core.New(core.Options{Available: available(), Transports: []string{"cuda"}, Secret: []byte("s3cret"), Memory: gpuMemory()})
	require.NoError(t, err)
	defer e.Close()
	tr := cudaOf(e)
	seg := open(t, e, peer.Name)
	desc := seg.Peer().Desc()

	other, err := core.New(core.Options{Available: available(), Transports: []string{"cuda"}, Secret: []byte("wrong"), Memory: gpuMemory()})
	require.NoError(t, err)
	defer other.Close()
	_, err = cudaOf(other).dial(other, desc, false, time.Now().Add(5*time.Second))
	require.Equal(t, status.AuthFailed, status.CodeOf(err), "%v", err)
	s, err := tr.dial(e, desc, false, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	s.c.Close()
	require.NoError(t, e.Close())
	require.NoError(t, other.Close())
	f.AssertClean(t)
}

// TestCancelInFlight: a batch destroyed while its copy has not started:
// the transport drops the request (Canceled) and lets go of it at once.
func TestCancelInFlight(t *testing.T) {
	f, _ := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, tr := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	b, release := submitHeld(t, e, "leased",
		core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	canceled := make(chan bool, 1)
	go func() { canceled <- b.Cancel() }()
	eventually(t, "cancel reached the transport", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, c := range tr.active {
			if c {
				return true
			}
		}
		return false
	})
	release()
	require.True(t, <-canceled)
	code, _ := b.Wait(-1)
	require.Equal(t, status.Canceled, code)
	require.Zero(t, tr.Stats()["inflight"])
	eventually(t, "peer leases released", func() bool { return peerStats(t, peer)["leases"] == 0 })
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// TestTargetUninstallWaitsForLeases: a target whose transport is
// uninstalled while an initiator holds a lease (its copies may be in
// flight) gives it time to finish and release before closing the session.
func TestTargetUninstallWaitsForLeases(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := startPeer(t, f, []peertest.Buffer{gpuBuf(size)})
	e, _ := newEngine(t, "cuda")
	seg := open(t, e, peer.Name)
	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	b, release := submitHeld(t, e, "queued",
		core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: peer.Buffers[0].Addr, Len: size})
	took := make(chan string, 1)
	go func() {
		out, err := peer.Cmd("uninstall")
		if err != nil {
			out = err.Error()
		}
		took <- out
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case out := <-took:
		t.Fatalf("the target's uninstall returned (%s) while our lease was held", out)
	default:
	}
	release()
	code, err := b.Wait(-1)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))
	ms, err := strconv.Atoi(<-took)
	require.NoError(t, err)
	require.Less(t, ms, int(closeWait/time.Millisecond), "the target waited no longer than needed")
	// Its sessions are gone: our imports of it went with them.
	eventually(t, "imports released", func() bool { return cudaOf(e).Stats()["mappings"] == 0 })
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}
