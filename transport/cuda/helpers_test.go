package cuda

import (
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

const (
	gran = 64 << 10 // the fake's granularity in these tests
	rw   = core.PermRemoteRead | core.PermRemoteWrite
)

func wireRegion(loc string, alloc uint64) *wire.RegionDesc {
	return &wire.RegionDesc{Addr: 1 << 20, Len: 4096, Perm: wire.PermRead | wire.PermWrite, Location: loc, AllocID: alloc}
}

// testDriver is the fake driver of the running test (useFake), whose GPU
// memory the engines of newEngine and gpuMemory get; nil: engines without
// GPU memory.
var testDriver *cu.Driver

// useFake makes a fresh fake driver the one the engines of this test get
// their GPU memory, and so their cuda transport, from.
func useFake(t *testing.T, opts ...fakecuda.Option) (*fakecuda.Fake, *cu.Driver) {
	t.Helper()
	f := fakecuda.New(t, append([]fakecuda.Option{fakecuda.Granularity(gran)}, opts...)...)
	d, err := cu.Load(f.Path)
	require.NoError(t, err)
	testDriver = d
	t.Cleanup(func() {
		testDriver = nil
	})
	return f, d
}

// gpuMemory is Options.Memory for an engine of this test: the fake
// driver's GPU memory after useFake, else none.
func gpuMemory() []tmem.Kind {
	if testDriver == nil {
		return nil
	}
	return []tmem.Kind{cumem.New(testDriver)}
}

// live is the fake's live-object counters (running totals zeroed), to
// compare with a baseline.
func live(f *fakecuda.Fake) fakecuda.Counters {
	c := f.Counters()
	c.ExportedFDs, c.Calls, c.Failures, c.Contexts = 0, 0, 0, 0
	return c
}

// thisProcess is the set of local peers the tests' engines share, as the
// engines of one libtent.so do.
var thisProcess = core.NewLocalPeers()

func newEngine(t *testing.T, transports ...string) (*core.Engine, *Transport) {
	t.Helper()
	e, err := core.New(core.Options{Available: available(), Transports: transports, DefaultTimeout: 10 * time.Second,
		Memory: gpuMemory(), LocalPeers: thisProcess})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, cudaOf(e)
}

func cudaOf(e *core.Engine) *Transport {
	for _, x := range e.Transports() {
		if c, ok := x.(*Transport); ok {
			return c
		}
	}
	return nil
}

func startPeer(t *testing.T, f *fakecuda.Fake, bufs []peertest.Buffer, env ...string) *peertest.Peer {
	t.Helper()
	return peertest.Start(t, peertest.Config{Transports: []string{"cuda"}, Buffers: bufs, Env: append(f.Env(), env...)})
}

func gpuBuf(size uint64) peertest.Buffer {
	return peertest.Buffer{Size: size, Perm: rw, Alloc: true, Location: "cuda:0"}
}

func open(t *testing.T, e *core.Engine, name string) *core.Segment {
	t.Helper()
	s, err := e.OpenSegment(name)
	require.NoError(t, err)
	return s
}

// transfer runs one batch to completion and returns the statuses.
func transfer(t *testing.T, e *core.Engine, reqs ...core.TransferRequest) (status.Code, error, []core.RequestStatus) {
	t.Helper()
	b, err := e.Submit(reqs, core.TransferOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	code, werr := b.Wait(-1)
	st := make([]core.RequestStatus, len(reqs))
	b.Status(st)
	e.ReleaseBatch(b)
	return code, werr, st
}

// submitHeld submits req as a batch of one and returns once the transport
// has reached stage with it (Transport.stageHook: "leased", "queued"); it stays
// blocked there until release is called, which also removes the hook.
func submitHeld(t *testing.T, e *core.Engine, stage string, req core.TransferRequest) (b *core.Batch, release func()) {
	t.Helper()
	entered, released := make(chan struct{}, 1), make(chan struct{})
	hook := func(s string) {
		if s == stage {
			entered <- struct{}{}
			<-released
		}
	}
	tr := cudaOf(e)
	tr.stageHook.Store(&hook)
	b, err := e.Submit([]core.TransferRequest{req}, core.TransferOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	<-entered
	return b, func() {
		tr.stageHook.Store(nil) // later batches run through
		close(released)
	}
}

func mustTransfer(t *testing.T, e *core.Engine, reqs ...core.TransferRequest) {
	t.Helper()
	code, err, st := transfer(t, e, reqs...)
	require.Equal(t, status.OK, code, "%v", err)
	for i, s := range st {
		require.Equal(t, ID, s.Transport, "request %d served by transport %d", i, s.Transport)
		require.Equal(t, reqs[i].Len, s.Bytes)
	}
}

func readDev(t *testing.T, d *cu.Driver, addr, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.CopyDtoH(b, addr))
	return b
}

func cmd(t *testing.T, p *peertest.Peer, format string, args ...any) string {
	t.Helper()
	out, err := p.Cmd(format, args...)
	require.NoError(t, err)
	return out
}

func peerInt(t *testing.T, p *peertest.Peer, c string) int {
	t.Helper()
	n, err := strconv.Atoi(cmd(t, p, "%s", c))
	require.NoError(t, err)
	return n
}

func peerStats(t *testing.T, p *peertest.Peer) map[string]int64 {
	t.Helper()
	var m map[string]int64
	require.NoError(t, json.Unmarshal([]byte(cmd(t, p, "stats")), &m))
	return m
}

func peerFake(t *testing.T, p *peertest.Peer) fakecuda.Counters {
	t.Helper()
	var c fakecuda.Counters
	require.NoError(t, json.Unmarshal([]byte(cmd(t, p, "fake")), &c))
	return c
}

// eventually polls cond for up to 30 s: a bound for a condition that never
// comes, long enough for a loaded machine.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hostBuf(t *testing.T, e *core.Engine, n uint64) ([]byte, *core.Region) {
	t.Helper()
	b := make([]byte, n)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: n}, rw)
	require.NoError(t, err)
	require.Equal(t, "cpu", r.Loc.Kind)
	t.Cleanup(func() { runtime.KeepAlive(b) }) // the engine holds only the address
	return b, r
}

func requireMsg(t *testing.T, err error, parts ...string) {
	t.Helper()
	require.Error(t, err)
	for _, p := range parts {
		require.True(t, strings.Contains(err.Error(), p), "error %q does not mention %q", err, p)
	}
}
