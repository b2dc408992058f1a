package tcp_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"strconv"
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
	"github.com/tent-dev/tent/wire"
)

func TestMain(m *testing.M) {
	// Peers have GPU memory that cannot be copied (copylessGPU).
	peertest.Memory = func() []tmem.Kind { return []tmem.Kind{&copylessGPU{}} }
	// gpulike SIZE: SIZE bytes of host memory registered as cuda:0 in a
	// peer whose GPU memory cannot be staged; answers the address.
	peertest.Commands["gpulike"] = func(e *core.Engine, args []string) (string, error) {
		size, err := strconv.Atoi(args[0])
		if err != nil {
			return "", err
		}
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return "", err
		}
		addr := host.Addr(b)
		_, err = e.Register(core.RegionDesc{Addr: addr, Len: uint64(size), Location: "cuda:0"}, rw)
		return strconv.FormatUint(addr, 10), err
	}
	peertest.Main(available(tcp.Options{})...)
	os.Exit(m.Run())
}

const rw = core.PermRemoteRead | core.PermRemoteWrite

// available is what the tests' engines may install: tcp alone, with o.
func available(o tcp.Options) []core.TransportSpec { return []core.TransportSpec{tcp.Spec(o)} }

// newEngine returns an engine with only this transport installed, and the
// transport (to read its stats after it is uninstalled).
func newEngine(t testing.TB, opts core.Options) (*core.Engine, *tcp.Transport) {
	t.Helper()
	return newEngineWith(t, opts, tcp.Options{})
}

// newEngineWith is newEngine with the transport's options o.
func newEngineWith(t testing.TB, opts core.Options, o tcp.Options) (*core.Engine, *tcp.Transport) {
	t.Helper()
	opts.Available = available(o)
	opts.Transports = []string{}
	e, err := core.New(opts)
	require.NoError(t, err)
	tr := tcp.New(o)
	require.NoError(t, e.Install(tr))
	t.Cleanup(func() { _ = e.Close() })
	return e, tr
}

// startPeer starts a peer process serving tcp with one read-write buffer
// of size bytes.
func startPeer(t testing.TB, size int) *peertest.Peer {
	t.Helper()
	return peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: uint64(size), Perm: rw}}})
}

// openSegment opens the segment of the peer named name.
func openSegment(t testing.TB, e *core.Engine, name string) *core.Segment {
	t.Helper()
	seg, err := e.OpenSegment(name)
	require.NoError(t, err)
	return seg
}

// register returns a registered buffer of n bytes.
func register(t testing.TB, e *core.Engine, n int, perm core.Perm) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, perm)
	require.NoError(t, err)
	// The engine holds only the address: a test that passes nothing but
	// the address on (to a load running while the engine closes) must not
	// let the collector free the memory under the transport.
	t.Cleanup(func() { runtime.KeepAlive(b) })
	return b
}

// alloc returns n bytes the engine allocated (mmap'd, outside the Go
// heap) and registered. Tests with both engines in one process use it: the
// race detector cannot see the ordering a socket gives between the
// target's write and the initiator's read, and it does not watch memory
// outside the Go heap.
func alloc(t testing.TB, e *core.Engine, n int, perm core.Perm) []byte {
	t.Helper()
	r, err := e.Alloc(uint64(n), "cpu", perm)
	require.NoError(t, err)
	return host.Bytes(r.Addr, uint64(n))
}

func random(b []byte) {
	_, _ = rand.Read(b)
}

// run submits reqs and waits for the batch, returning its statuses.
func run(t testing.TB, e *core.Engine, reqs []core.TransferRequest, timeout time.Duration) (status.Code, []core.RequestStatus, error) {
	t.Helper()
	b, err := e.Submit(reqs, core.TransferOptions{Timeout: timeout})
	require.NoError(t, err)
	code, err := b.Wait(-1)
	st := make([]core.RequestStatus, b.Len())
	b.Status(st)
	e.ReleaseBatch(b)
	return code, st, err
}

func peerSum(t testing.TB, p *peertest.Peer, i int) string {
	t.Helper()
	s, err := p.Cmd("sum %d", i)
	require.NoError(t, err)
	return s
}

// Two engines in two processes: WRITE and READ of random data, checked
// with checksums, over batches of 1 to 1024 requests of 1 byte to 64 MiB
// at unaligned addresses.
func TestTransferAcrossProcesses(t *testing.T) {
	// Buffer 0 takes the 64 MiB request, buffer 1 the others, so that most
	// checksums cover little memory.
	sizes := []int{64<<20 + 4096, 9 << 20}
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: uint64(sizes[0]), Perm: rw}, {Size: uint64(sizes[1]), Perm: rw}}})
	e, tr := newEngine(t, core.Options{})
	src := register(t, e, sizes[0], 0)
	dst := register(t, e, sizes[0], 0)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(t, err)
	// The models of the peer's buffers start as random data written whole
	// (peertest.Pattern is slow under the race detector).
	models := make([][]byte, len(sizes))
	for i, n := range sizes {
		models[i] = make([]byte, n)
		random(models[i])
		copy(src, models[i])
		code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
			Remote: peer.Buffers[i].Addr, Len: uint64(n)}}, 30*time.Second)
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, peertest.Sum(models[i]), peerSum(t, peer, i))
	}

	cases := []struct{ batch, n int }{
		{1, 1}, {1, 4096}, {3, 1000}, {128, 4096}, {1024, 4096}, {1024, 300}, {128, 64 << 10},
		{7, 1<<20 + 17}, {2, 3<<20 + 5}, {1, 64 << 20},
	}
	for ci, c := range cases {
		t.Run(fmt.Sprintf("%dx%d", c.batch, c.n), func(t *testing.T) {
			buf := 1
			stride := c.n + 13
			if 7+c.batch*stride > sizes[1] {
				buf = 0
			}
			require.LessOrEqual(t, 7+c.batch*stride, sizes[buf])
			model, remote := models[buf], peer.Buffers[buf].Addr
			random(src[:c.batch*stride+3])
			reqs := make([]core.TransferRequest, c.batch)
			for i := range reqs {
				reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(3+i*stride),
					Segment: seg, Remote: remote + uint64(7+i*stride), Len: uint64(c.n)}
				copy(model[7+i*stride:7+i*stride+c.n], src[3+i*stride:3+i*stride+c.n])
			}
			code, st, err := run(t, e, reqs, 30*time.Second)
			require.Equal(t, status.OK, code, "%v", err)
			for i := range st {
				require.Equal(t, tcp.ID, st[i].Transport)
				require.EqualValues(t, c.n, st[i].Bytes)
			}
			require.Equal(t, peertest.Sum(model), peerSum(t, peer, buf), "peer's buffer after the WRITE")

			// READ back, from other offsets, into other local addresses.
			for i := range reqs {
				reqs[i] = core.TransferRequest{Op: core.OpRead, Local: host.Addr(dst) + uint64(5+i*stride),
					Segment: seg, Remote: remote + uint64(ci+i*stride), Len: uint64(c.n)}
			}
			code, _, err = run(t, e, reqs, 30*time.Second)
			require.Equal(t, status.OK, code, "%v", err)
			for i := range reqs {
				if !bytes.Equal(dst[5+i*stride:5+i*stride+c.n], model[ci+i*stride:ci+i*stride+c.n]) {
					t.Fatalf("READ %d of %d bytes differs", i, c.n)
				}
			}
		})
	}
	require.NoError(t, e.CloseSegment(seg))
	st := tr.Stats()
	require.Zero(t, st["requests_in_flight"])
	require.Positive(t, st["bytes_sent"])
	require.Positive(t, st["bytes_received"])
}

// The same transfers between two engines of one process (the tcp
// transport does not care), with one stream and with many.
func TestTransferInProcess(t *testing.T) {
	for _, streams := range []int{1, 7} {
		t.Run(fmt.Sprint(streams), func(t *testing.T) {
			a, _ := newEngineWith(t, core.Options{}, tcp.Options{Streams: streams})
			b, _ := newEngine(t, core.Options{})
			src := alloc(t, a, 8<<20, 0)
			dst := alloc(t, b, 8<<20, rw)
			random(src)
			seg, err := a.OpenSegment(b.Name())
			require.NoError(t, err)
			var reqs []core.TransferRequest
			for off := 0; off < 8<<20; off += 1 << 20 {
				reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(off),
					Segment: seg, Remote: host.Addr(dst) + uint64(off), Len: 1 << 20})
			}
			reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 1})
			code, _, err := run(t, a, reqs, 10*time.Second)
			require.Equal(t, status.OK, code, "%v", err)
			require.Equal(t, src, dst)
		})
	}
}

// descOf returns the tcp endpoint and incarnation of a segment.
func descOf(t testing.TB, d *wire.SegmentDesc) (string, uint64) {
	t.Helper()
	for _, ep := range d.Endpoints {
		if ep.Transport == "tcp" {
			return ep.Addr, d.Incarnation
		}
	}
	t.Fatalf("%s publishes no tcp endpoint", d.Name)
	return "", 0
}
