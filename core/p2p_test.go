package core_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/status"
)

func TestMain(m *testing.M) {
	peertest.Commands["rawnotify"] = rawNotify
	peertest.Main(available()...)
	os.Exit(m.Run())
}

// A peer in another process: its descriptor comes over the control link,
// changes are pushed, notifications flow, and its death is noticed.
func TestP2PSegmentAcrossProcesses(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{
		Transports: []string{"local"},
		Buffers:    []peertest.Buffer{{Size: 4096, Perm: core.PermRemoteRead}, {Size: 8192, Perm: core.PermRemoteWrite}},
	})
	a := newLocalEngine(t, core.Options{DefaultTimeout: 2 * time.Second})
	seg, err := a.OpenSegment(peer.Name)
	require.NoError(t, err)
	d := seg.Peer().Desc()
	require.Equal(t, peer.Name, d.Name)
	require.EqualValues(t, peer.PID, d.PID)
	require.Len(t, d.Regions, 2)
	require.Nil(t, seg.Peer().Local(), "another process is not local")

	require.NoError(t, a.SendNotification(seg, []byte("hello peer")))
	got, err := peer.Cmd("recv")
	require.NoError(t, err)
	require.Equal(t, a.Name()+" hello peer", got)

	// The peer unregisters; the pushed change makes the next resolve see it.
	epoch := seg.Peer().Epoch()
	_, err = peer.Cmd("unregister 0")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s2, err := a.OpenSegment(peer.Name)
		if err != nil {
			return false
		}
		defer a.CloseSegment(s2)
		return len(s2.Peer().Desc().Regions) == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.Greater(t, seg.Peer().Epoch(), epoch)

	// No transport can reach it from here (only "local" is installed):
	// a clear per-request error, not a hang.
	buf0, _ := buf(t, a, 64, 0)
	batch, err := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: addrOf(buf0), Segment: seg,
		Remote: peer.Buffers[1].Addr, Len: 8}}, core.TransferOptions{})
	require.NoError(t, err)
	code, _ := wait(t, batch)
	require.Equal(t, status.Unsupported, code)

	peer.Kill()
	start := time.Now()
	_, err = a.OpenSegment("127.0.0.1:1")
	require.Error(t, err)
	require.Less(t, time.Since(start), 3*time.Second)
	err = a.SendNotification(seg, []byte("anyone?"))
	require.Error(t, err)
	require.Contains(t, []status.Code{status.TransportError, status.Timeout}, status.CodeOf(err), err.Error())
}

func TestAuthentication(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{Transports: []string{"local"}, Secret: "s3cret",
		Buffers: []peertest.Buffer{{Size: 64, Perm: core.PermRemoteRead}}})
	wrong := newLocalEngine(t, core.Options{Secret: []byte("guess"), DefaultTimeout: 2 * time.Second})
	_, err := wrong.OpenSegment(peer.Name)
	require.ErrorIs(t, err, status.ErrAuthFailed)
	none := newLocalEngine(t, core.Options{DefaultTimeout: 2 * time.Second})
	_, err = none.OpenSegment(peer.Name)
	require.ErrorIs(t, err, status.ErrAuthFailed)
	right := newLocalEngine(t, core.Options{Secret: []byte("s3cret")})
	seg, err := right.OpenSegment(peer.Name)
	require.NoError(t, err)
	require.Len(t, seg.Peer().Desc().Regions, 1)
}

func TestListenerIsLoopbackByDefault(t *testing.T) {
	e := newLocalEngine(t, core.Options{})
	require.True(t, strings.HasPrefix(e.ListenAddr(), "127.0.0.1:"), e.ListenAddr())
}

func addrOf(b []byte) uint64 { return uint64(uintptrOf(b)) }

// With p2p metadata a name is an address, checked whole before any dial:
// a malformed one is an invalid argument, not a transport error.
func TestMalformedP2PNamesAreInvalid(t *testing.T) {
	e := newLocalEngine(t, core.Options{DefaultTimeout: 2 * time.Second})
	for _, name := range []string{"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:12ab", "127.0.0.1:0",
		"127.0.0.1", "host name:80", "[127.0.0.1]:80", "999.0.0.1:80", strings.Repeat("a", 1025)} {
		_, err := e.OpenSegment(name)
		require.Equal(t, status.InvalidArgument, status.CodeOf(err), "%q: %v", name, err)
	}
	require.Zero(t, e.Stats().Segments)
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:-1", "localhost:http", "127.0.0.1"} {
		_, err := core.New(core.Options{ListenAddr: addr, Available: available(), Transports: []string{"local"}})
		require.Equal(t, status.InvalidArgument, status.CodeOf(err), "listen %q: %v", addr, err)
	}
}

// An engine of this process is opened by its own name even when that is
// no address (the name check applies to names something must dial).
func TestP2PEngineWithACustomNameOpensItself(t *testing.T) {
	e := newLocalEngine(t, core.Options{Name: "custom name, no port", DefaultTimeout: 2 * time.Second})
	s, err := e.OpenSegment("custom name, no port")
	require.NoError(t, err)
	require.NoError(t, e.CloseSegment(s))
	_, err = e.OpenSegment("another name, no port")
	require.Equal(t, status.InvalidArgument, status.CodeOf(err), "%v", err)
}

// Engines of one process are held to the same secret rule as processes.
func TestInProcessPeersNeedTheSecret(t *testing.T) {
	locked := newLocalEngine(t, core.Options{Secret: []byte("k")})
	open := newLocalEngine(t, core.Options{})
	wrong := newLocalEngine(t, core.Options{Secret: []byte("x")})
	right := newLocalEngine(t, core.Options{Secret: []byte("k")})
	_, err := open.OpenSegment(locked.Name())
	require.ErrorIs(t, err, status.ErrAuthFailed)
	_, err = wrong.OpenSegment(locked.Name())
	require.ErrorIs(t, err, status.ErrAuthFailed)
	_, err = locked.OpenSegment(open.Name())
	require.ErrorIs(t, err, status.ErrAuthFailed)
	seg, err := right.OpenSegment(locked.Name())
	require.NoError(t, err)
	require.NotNil(t, seg.Peer().Local())
	_, err = open.OpenSegment("no-port-here")
	require.ErrorIs(t, err, status.ErrInvalidArgument)
}

// A name answers for one live engine of a set of local peers: a second
// engine asking for it is refused (opening it would reach the first), and
// the name is free again once its engine is closed.
func TestTwoEnginesOfOneProcessCannotShareAName(t *testing.T) {
	peers := core.NewLocalPeers()
	opts := func(name string) core.Options {
		return core.Options{Name: name, Available: available(), Transports: []string{"local"}, LocalPeers: peers}
	}
	first, err := core.New(opts("shared-name"))
	require.NoError(t, err)
	_, err = core.New(opts("shared-name"))
	require.Equal(t, status.NameInUse, status.CodeOf(err), "%v", err)

	// An engine named like another's listen address is refused too.
	_, err = core.New(opts(first.ListenAddr()))
	require.Equal(t, status.NameInUse, status.CodeOf(err), "%v", err)

	s, err := first.OpenSegment("shared-name")
	require.NoError(t, err)
	require.Same(t, first, s.Peer().Local())
	require.NoError(t, first.CloseSegment(s))

	require.NoError(t, first.Close())
	second := newLocalEngine(t, opts("shared-name"))
	s, err = second.OpenSegment("shared-name")
	require.NoError(t, err)
	require.Same(t, second, s.Peer().Local())
}

// Engines reach each other in-process only when given the same set of
// local peers: one outside the set is reached over the network, and a
// name taken in one set is free in another.
func TestLocalPeersAreTheCallersSet(t *testing.T) {
	ours, theirs := core.NewLocalPeers(), core.NewLocalPeers()
	a := newLocalEngine(t, core.Options{Name: "set-member", LocalPeers: ours, Transports: []string{"tcp"}})
	b := newLocalEngine(t, core.Options{LocalPeers: ours, Transports: []string{"tcp"}})
	c := newLocalEngine(t, core.Options{LocalPeers: theirs, Transports: []string{"tcp"}})
	_ = newLocalEngine(t, core.Options{Name: "set-member", LocalPeers: theirs, Transports: []string{"tcp"}})

	s, err := b.OpenSegment("set-member")
	require.NoError(t, err)
	require.Same(t, a, s.Peer().Local())
	s, err = c.OpenSegment(b.ListenAddr())
	require.NoError(t, err)
	require.Nil(t, s.Peer().Local(), "an engine of another set is not local")
	require.Equal(t, b.Name(), s.Peer().Desc().Name)

	// An engine given no set has one of its own: it reaches itself
	// directly and nobody else does.
	alone := newLocalEngine(t, core.Options{LocalPeers: core.NewLocalPeers(), Transports: []string{"tcp"}})
	s, err = alone.OpenSegment(alone.Name())
	require.NoError(t, err)
	require.Same(t, alone, s.Peer().Local())
	s, err = b.OpenSegment(alone.ListenAddr())
	require.NoError(t, err)
	require.Nil(t, s.Peer().Local())
}

// A metadata URL without a directory to open it is refused, not served as
// p2p: peers resolving the name in that service would never find the
// engine.
func TestMetadataWithoutDirectory(t *testing.T) {
	_, err := core.New(core.Options{Metadata: "etcd://127.0.0.1:2379", Transports: []string{}})
	require.ErrorIs(t, err, status.ErrUnsupported)
	require.ErrorContains(t, err, "Options.Directory")
}
