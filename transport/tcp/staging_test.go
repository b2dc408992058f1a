package tcp_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	tmem "github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// gateGPU is GPU memory ("cuda") of an engine without a CUDA driver:
// "GPU memory" is host memory registered with location cuda:0, and every
// copy first waits at the gate (when one is set), so tests can cancel or
// uninstall while a copy runs.
type gateGPU struct {
	calls   atomic.Int32
	entered chan struct{} // one send per copy that reaches the gate
	gate    chan struct{} // closed to let copies through; nil: no gate
}

func (g *gateGPU) Name() string { return "cuda" }

func (g *gateGPU) CheckDevice(dev int) error {
	if dev > 0 {
		return status.Errorf(status.InvalidArgument, "one GPU only")
	}
	return nil
}

func (g *gateGPU) Detect(uint64) (int, bool, error) { return -1, false, nil }

func (g *gateGPU) Alloc(uint64, int) (*tmem.Allocation, error) {
	return nil, status.Errorf(status.Unsupported, "gateGPU does not allocate")
}

func (g *gateGPU) wait() {
	g.calls.Add(1)
	if g.gate != nil {
		g.entered <- struct{}{}
		<-g.gate
	}
}

func (g *gateGPU) CopyOut(dst []byte, src uint64) error {
	g.wait()
	copy(dst, host.Bytes(src, uint64(len(dst))))
	return nil
}

func (g *gateGPU) CopyIn(dst uint64, src []byte) error {
	g.wait()
	copy(host.Bytes(dst, uint64(len(src))), src)
	return nil
}

// copylessGPU is GPU memory that cannot be copied from or to: the peers'
// (see TestMain), to see a target's staging failure reach the initiator.
type copylessGPU struct{ gateGPU }

func (*copylessGPU) CopyOut([]byte, uint64) error {
	return status.Errorf(status.Unsupported, "no copy engine for this GPU memory (test)")
}

func (*copylessGPU) CopyIn(uint64, []byte) error {
	return status.Errorf(status.Unsupported, "no copy engine for this GPU memory (test)")
}

// gpuLike registers n bytes of mmap'd host memory as cuda:0, which is how
// the transport sees GPU memory.
func gpuLike(t *testing.T, e *core.Engine, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n), Location: "cuda:0"}, 0)
	require.NoError(t, err)
	require.True(t, r.Loc.IsCUDA())
	return b
}

// requireStagingReleased waits for the staging buffers to go back: a
// request reports its outcome before its piece's buffer is returned.
func requireStagingReleased(t *testing.T, tr *tcp.Transport) {
	t.Helper()
	require.Eventually(t, func() bool { return tr.Stats()["staging_buffers"] == 0 }, 10*time.Second, time.Millisecond,
		"staging buffers still held: %d", tr.Stats()["staging_buffers"])
}

// Requests on local GPU memory go through host staging buffers, in pieces,
// and say so; cancel and uninstall while a staging copy runs end the
// batch without another GPU copy, and every staging buffer and goroutine
// is released.
func TestStaging(t *testing.T) {
	const size = 9<<20 + 7 // three pieces of at most 4 MiB
	peer := startPeer(t, 4*size)
	g := &gateGPU{}
	e, tr := newEngine(t, core.Options{Memory: []tmem.Kind{g}})
	gpu := gpuLike(t, e, 4*size)
	seg := openSegment(t, e, peer.Name)
	remote := peer.Buffers[0].Addr
	req := func(op core.Op, i int) core.TransferRequest {
		return core.TransferRequest{Op: op, Local: host.Addr(gpu) + uint64(i*size), Segment: seg,
			Remote: remote + uint64(i*size), Len: size}
	}

	t.Run("data", func(t *testing.T) {
		copy(gpu, peertest.Pattern(11, 4*size))
		code, st, err := run(t, e, []core.TransferRequest{req(core.OpWrite, 0), req(core.OpWrite, 1)}, 10*time.Second)
		require.Equal(t, status.OK, code, "%v", err)
		for _, s := range st {
			require.Equal(t, core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size, Flags: core.FlagStaged}, s)
		}
		want := peertest.Pattern(11, 4*size)[:2*size]
		clear(gpu)
		code, st, err = run(t, e, []core.TransferRequest{req(core.OpRead, 0), req(core.OpRead, 1)}, 10*time.Second)
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, core.FlagStaged, st[1].Flags)
		require.Equal(t, want, gpu[:2*size])
		require.EqualValues(t, 12, g.calls.Load(), "3 pieces x 2 requests x 2 directions")
		requireStagingReleased(t, tr)
	})

	t.Run("target cannot stage", func(t *testing.T) {
		// The peer has GPU memory it cannot copy to host memory.
		addr, err := peer.Cmd("gpulike %d", 1<<20)
		require.NoError(t, err)
		remoteGPU, err := strconv.ParseUint(addr, 10, 64)
		require.NoError(t, err)
		code, st, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(gpu), Segment: seg,
			Remote: remoteGPU, Len: 1 << 20}}, 10*time.Second)
		require.Equal(t, status.Unsupported, code)
		require.Equal(t, tcp.ID, st[0].Transport)
		require.ErrorContains(t, err, "no copy engine for this GPU memory (test)")
		requireStagingReleased(t, tr)
	})

	t.Run("cancel", func(t *testing.T) {
		g.calls.Store(0)
		g.entered, g.gate = make(chan struct{}, 1), make(chan struct{})
		b, err := e.Submit([]core.TransferRequest{req(core.OpWrite, 0), req(core.OpWrite, 1)}, core.TransferOptions{})
		require.NoError(t, err)
		<-g.entered // inside the first GPU copy
		canceled := tr.Stats()["canceled"]
		settled := make(chan bool, 1)
		go func() { settled <- b.Cancel() }() // returns once the transport lets go
		require.Eventually(t, func() bool { return tr.Stats()["canceled"] == canceled+2 }, 5*time.Second, time.Millisecond)
		close(g.gate)
		require.True(t, <-settled)
		code, _ := b.Wait(10 * time.Second)
		require.Equal(t, status.Canceled, code)
		e.ReleaseBatch(b)
		require.Eventually(t, func() bool { return tr.Stats()["staging_buffers"] == 0 }, 5*time.Second, time.Millisecond)
		require.EqualValues(t, 1, g.calls.Load(), "no GPU copy after the cancel")
	})

	t.Run("uninstall", func(t *testing.T) {
		g.calls.Store(0)
		g.entered, g.gate = make(chan struct{}, 1), make(chan struct{})
		b, err := e.Submit([]core.TransferRequest{req(core.OpWrite, 0), req(core.OpWrite, 1), req(core.OpWrite, 2)}, core.TransferOptions{})
		require.NoError(t, err)
		<-g.entered
		require.Positive(t, tr.Stats()["connections"], "the earlier batches' connections")
		done := make(chan error, 1)
		go func() { done <- e.Uninstall("tcp") }()
		// Uninstall closes the connections once it has marked the transport
		// closed; it then waits for the staging goroutine, held at the gate.
		require.Eventually(t, func() bool { return tr.Stats()["connections"] == 0 }, 5*time.Second, time.Millisecond)
		close(g.gate)
		require.NoError(t, <-done)
		code, _ := b.Wait(10 * time.Second)
		require.Equal(t, status.Closed, code)
		e.ReleaseBatch(b)
		require.EqualValues(t, 1, g.calls.Load(), "no GPU copy for pieces that cannot be sent")
		requireIdle(t, tr)
		require.Zero(t, tr.Stats()["staging_buffers"])
	})
}
