package rdma

import (
	"crypto/rand"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

func TestMain(m *testing.M) {
	peertest.Main(procAvailable()...)
	os.Exit(m.Run())
}

// procAvailable is what the tests' engines (and their peers) may install.
func procAvailable() []core.TransportSpec {
	return []core.TransportSpec{Spec(Options{}), tcp.Spec(tcp.Options{})}
}

// fake is the fake libibverbs of one test, with the devices both processes
// see and the directory where they share MRs and queue pairs.
type fake struct {
	lib string
	env []string
}

// useFake builds the fake library and points this process (and the peers
// it starts) at it, with the given devices ("fake0,fake1").
func useFake(t *testing.T, devices string) *fake {
	t.Helper()
	f := &fake{lib: fakeverbs.Build(t)}
	state := t.TempDir()
	f.env = []string{verbs.LibraryEnv + "=" + f.lib, "FAKEVERBS_DEVICES=" + devices, "FAKEVERBS_STATE=" + state, "FAKEVERBS_FAIL="}
	t.Setenv(verbs.LibraryEnv, f.lib)
	t.Setenv("FAKEVERBS_DEVICES", devices)
	t.Setenv("FAKEVERBS_STATE", state)
	t.Setenv("FAKEVERBS_FAIL", "")
	return f
}

// counts reads the live verbs objects of this process.
func (f *fake) counts(t *testing.T) fakeverbs.Live {
	t.Helper()
	c, err := fakeverbs.Counts(f.lib)
	require.NoError(t, err)
	return c
}

// requireNoObjects checks that this process holds no verbs object.
func (f *fake) requireNoObjects(t *testing.T) {
	t.Helper()
	require.Equal(t, fakeverbs.Live{}, f.counts(t), "verbs objects left behind")
}

// newProcEngine makes an engine with a fresh rdma transport on the fake (and
// tcp after it when withTCP), closed when the test ends.
func newProcEngine(t *testing.T, withTCP bool) (*core.Engine, *Transport) {
	t.Helper()
	// The fake held open by the test, loaded now that the test's
	// environment (FAKEVERBS_FAIL) is set, so that its counters can still
	// be read once the engine has closed its handle.
	held, err := verbs.Open(os.Getenv(verbs.LibraryEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Close() })
	e, err := core.New(core.Options{Available: procAvailable(), Transports: []string{}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	tr := New(Options{})
	require.NoError(t, e.Install(tr))
	require.Empty(t, tr.Unavailable())
	if withTCP {
		require.NoError(t, e.Install(tcp.New(tcp.Options{})))
	}
	return e, tr
}

// startPeer runs a peer engine with rdma and tcp (for retries) in another
// process.
func startPeer(t *testing.T, f *fake, bufs ...peertest.Buffer) *peertest.Peer {
	t.Helper()
	return peertest.Start(t, peertest.Config{Transports: []string{Name, tcp.Name}, Buffers: bufs, Env: f.env})
}

// localBuf registers n random bytes of the Go heap with e.
func localBuf(t *testing.T, e *core.Engine, n int) ([]byte, *core.Region) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, rw)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(b) })
	return b, r
}

func sum(t *testing.T, p *peertest.Peer, i int) string {
	t.Helper()
	s, err := p.Cmd("sum %d", i)
	require.NoError(t, err)
	return s
}

// peerRegion is the peer's published region at addr.
func peerRegion(t *testing.T, seg *core.Segment, addr uint64) wire.RegionDesc {
	t.Helper()
	d := seg.Peer().Desc()
	require.NotNil(t, d)
	for _, r := range d.Regions {
		if r.Addr == addr {
			return r
		}
	}
	t.Fatalf("peer publishes no region at %#x", addr)
	return wire.RegionDesc{}
}

// postRawProc posts one work request on NIC 0 straight to the peer's NIC 0,
// past every check core makes, and returns its outcome: how a test asks
// the (fake) NIC itself what a key allows.
func postRawProc(t *testing.T, tr *Transport, seg *core.Segment, op opcode, local *core.Region, remote uint64, rkey uint32, n uint32) error {
	t.Helper()
	d := seg.Peer().Desc()
	key, addr := connKey{peer: d.Name, incarnation: d.Incarnation}, endpointOf(d)
	got := make(chan error, 1)
	p := &pending{done: func(_ uint64, err error) { got <- err }}
	p.left.Store(1)
	tr.post(key, addr, time.Now().Add(10*time.Second), []*workRequest{{req: p, deadline: time.Now().Add(10 * time.Second), wr: sendWR{
		ID: tr.ids.Add(1), Op: op, LocalAddr: local.Addr, Length: n, LKey: tr.lkeys(local)[0],
		RemoteAddr: remote, RKey: rkey, Signaled: true}}})
	select {
	case err := <-got:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("raw work request never completed")
		return nil
	}
}

func ptr[T any](v T) *T { return &v }
