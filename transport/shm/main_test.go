//go:build linux

package shm

import (
	"crypto/rand"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

func TestMain(m *testing.M) {
	peertest.Commands["attack"] = attackCmd
	peertest.Commands["holdgrant"] = holdGrantCmd
	peertest.Main(available()...)
	os.Exit(m.Run())
}

// available is what the tests' engines may install: shm, and tcp beside it.
func available() []core.TransportSpec { return []core.TransportSpec{Spec(), tcp.Spec(tcp.Options{})} }

// newEngine returns an engine with only a fresh shm transport (plus the
// named extra transports after it), closed when the test ends.
func newEngine(t testing.TB, o core.Options, extra ...string) (*core.Engine, *Transport) {
	t.Helper()
	o.Available = available()
	o.Transports = []string{}
	e, err := core.New(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	tr := New()
	require.NoError(t, e.Install(tr))
	for _, name := range extra {
		require.NoError(t, e.Install(factory(t, name)))
	}
	return e, tr
}

func factory(t testing.TB, name string) core.Transport {
	t.Helper()
	require.Equal(t, "tcp", name)
	return tcp.New(tcp.Options{})
}

// startPeer runs a peer engine with shm (and tcp) in another process.
func startPeer(t testing.TB, bufs ...peertest.Buffer) *peertest.Peer {
	t.Helper()
	return peertest.Start(t, peertest.Config{Transports: []string{"shm", "tcp"}, Buffers: bufs})
}

const rw = core.PermRemoteRead | core.PermRemoteWrite

// localBuf registers n random bytes (Go heap) with e.
func localBuf(t testing.TB, e *core.Engine, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	_, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, rw)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(b) }) // the engine holds only the address
	return b
}

// run submits reqs and waits for every request's final status.
func run(t testing.TB, e *core.Engine, reqs []core.TransferRequest, o core.TransferOptions) (status.Code, []core.RequestStatus, error) {
	t.Helper()
	b, err := e.Submit(reqs, o)
	require.NoError(t, err)
	defer e.ReleaseBatch(b)
	code, werr := b.Wait(time.Until(b.Deadline()) + 5*time.Second)
	st := make([]core.RequestStatus, b.Len())
	c2, done, _ := b.Status(st)
	require.Equal(t, b.Len(), done, "batch still has pending requests long after its deadline (code %v)", c2)
	return code, st, werr
}

func openSeg(t testing.TB, e *core.Engine, name string) *core.Segment {
	t.Helper()
	seg, err := e.OpenSegment(name)
	require.NoError(t, err)
	return seg
}

func sum(t testing.TB, p *peertest.Peer, i int) string {
	t.Helper()
	s, err := p.Cmd("sum %d", i)
	require.NoError(t, err)
	return s
}

// held are the counts that must return to zero (goroutines: to the
// accept loop while installed).
var held = []string{"connections", "leases", "mappings", "fds", "goroutines", "jobs", "grants", "grants_cached"}

func requireIdle(t testing.TB, tr *Transport, installed bool) {
	t.Helper()
	idle := func(st map[string]int64) bool {
		for _, k := range held {
			want := int64(0)
			if k == "goroutines" && installed {
				want = 1
			}
			if st[k] != want {
				return false
			}
		}
		return true
	}
	st := tr.Stats()
	for deadline := time.Now().Add(10 * time.Second); !idle(st) && time.Now().Before(deadline); st = tr.Stats() {
		time.Sleep(5 * time.Millisecond)
	}
	require.True(t, idle(st), "transport still holds resources: %v", st)
}

// procCounts are what teardown must give back to the process: open
// descriptors, goroutines, and mappings. Mappings are counted strictly for
// every named line of /proc/self/maps (files, memfds — which is what this
// transport maps — and the kernel's [heap], [stack], ...). Anonymous
// mappings belong to the Go and race runtimes (heap arenas, allocator
// chunks, thread stacks), which grow and merge them on their own; the
// transport creates none, so they are only reported.
type procCounts struct {
	fds, namedMaps, memfdMaps, goroutines int
	anonMaps                              int    // reported, not compared
	text                                  string // the maps, for the failure message
}

// within reports whether nothing is left above the baseline o (which may
// itself have caught a transient goroutine of the runtime or the engine).
func (c procCounts) within(o procCounts) bool {
	return c.fds <= o.fds && c.namedMaps <= o.namedMaps && c.memfdMaps <= o.memfdMaps && c.goroutines <= o.goroutines
}

func counts(t testing.TB) procCounts {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	c := procCounts{fds: len(ents), goroutines: runtime.NumGoroutine(), text: string(maps)}
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		if f := strings.Fields(line); len(f) >= 6 {
			c.namedMaps++
			if strings.Contains(line, "memfd:") {
				c.memfdMaps++
			}
		} else {
			c.anonMaps++
		}
	}
	return c
}

func requireBaseline(t testing.TB, base procCounts, what string) {
	t.Helper()
	var now procCounts
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if now = counts(t); now.within(base) {
			break
		}
	}
	if !now.within(base) {
		t.Logf("maps now:\n%s\nbaseline:\n%s", now.text, base.text)
	}
	t.Logf("%s: anonymous runtime mappings %d (baseline %d)", what, now.anonMaps, base.anonMaps)
	now.text, base.text = "", ""
	require.True(t, now.within(base), "%s: process counts %+v, baseline %+v", what, now, base)
}

// rawClient speaks the shm protocol directly: a peer with whatever cache
// (stale, lying) a test wants.
type rawClient struct {
	c    *net.UnixConn
	fr   *lease.FDReader
	held atomic.Int64
	recv atomic.Int64
}

func dialRaw(t testing.TB, addr string, secret []byte) (*rawClient, error) {
	t.Helper()
	nc, err := net.Dial("unix", addr)
	require.NoError(t, err)
	uc := nc.(*net.UnixConn)
	if _, err := wire.ClientHandshake(uc, wire.HandshakeConfig{Secret: secret, LocalName: "raw"}, kindShm); err != nil {
		uc.Close()
		return nil, err
	}
	rc := &rawClient{c: uc}
	rc.fr = lease.NewFDReader(uc, maxGrantFDs, lease.FDCounts{Held: &rc.held, Received: &rc.recv})
	t.Cleanup(func() { rc.fr.CloseAll(); uc.Close() })
	return rc, nil
}

func (rc *rawClient) read(t testing.TB) (uint8, []byte) {
	t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, p, err := wire.ReadFrame(rc.fr, maxFrame, nil)
	require.NoError(t, err)
	return typ, p
}

// lease sends a lease for ents and returns the grant and the descriptors
// that came with it (the caller closes them).
func (rc *rawClient) lease(t testing.TB, id uint64, ttl time.Duration, ents ...leaseEntry) (grantHead, []grantEntry, []int) {
	t.Helper()
	reqs := make([]*core.Request, len(ents))
	for i, en := range ents {
		reqs[i] = &core.Request{Op: en.Op, Remote: en.Addr, Len: en.Len}
	}
	_, err := rc.c.Write(appendLease(nil, id, ttl, reqs))
	require.NoError(t, err)
	typ, payload := rc.read(t)
	require.Equal(t, frameGrant, typ)
	d := wire.NewDecoder(payload)
	var h grantHead
	decodeGrantHead(&d, &h)
	require.NoError(t, d.Err())
	fds, err := rc.fr.Take(len(h.fds))
	require.NoError(t, err)
	out := make([]grantEntry, len(ents))
	require.NoError(t, decodeGrantEntries(payload[d.Offset():], out))
	require.Equal(t, id, h.id)
	return h, out, fds
}

func (rc *rawClient) release(t testing.TB, id uint64) {
	t.Helper()
	_, err := rc.c.Write(appendRelease(nil, id))
	require.NoError(t, err)
}
