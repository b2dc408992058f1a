package cuda

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/testenv"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

// An imported CUDA handle (POSIX fd or FABRIC) is mapped with whatever
// access the importer sets, over the whole allocation: only allocations
// registered for remote read and write publish or export one.
func TestHandlesOnlyForReadWriteAllocations(t *testing.T) {
	f, _ := useFake(t, fakecuda.Fabric(true))
	e, _ := newEngine(t, "cuda")
	for _, c := range []struct {
		perm   core.Perm
		handle bool
	}{{rw, true}, {core.PermRemoteRead, false}, {core.PermRemoteWrite, false}} {
		r, err := e.Alloc(gran, "cuda:0", c.perm)
		require.NoError(t, err)
		desc, err := e.Descriptor()
		require.NoError(t, err)
		require.Len(t, desc.Regions, 1)
		_, _, ok := fabricAttachment(&desc.Regions[0])
		require.Equal(t, c.handle, ok, "fabric handle published for permission %v", c.perm)
		require.NoError(t, e.Free(r))
	}
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// A peer asking the target's Unix endpoint for the handle of a read-only
// GPU allocation is refused and gets no fd; the engine reads that memory
// through tcp's staging instead, and writes to it are refused.
func TestReadOnlyGPUAllocation(t *testing.T) {
	f, d := useFake(t)
	const size = 2 * gran
	peer := peertest.Start(t, peertest.Config{Transports: []string{"cuda", "tcp"}, Env: f.Env(),
		Buffers: []peertest.Buffer{{Size: size, Perm: core.PermRemoteRead, Alloc: true, Location: "cuda:0"}}})
	e, tr := newEngine(t, "cuda", "tcp")
	seg := open(t, e, peer.Name)
	ro := peer.Buffers[0]
	require.NotZero(t, ro.AllocID)

	s, err := tr.session(seg.Peer().Desc(), false, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	fd, _, _, err := s.importFD(ro.AllocID, time.Now().Add(5*time.Second))
	require.Equal(t, status.PermissionDenied, status.CodeOf(err), "%v", err)
	require.Equal(t, -1, fd)
	require.Zero(t, peerStats(t, peer)["exports_total"], "no handle was exported")

	lr, err := e.Alloc(size, "cuda:0", rw)
	require.NoError(t, err)
	code, err, st := transfer(t, e, core.TransferRequest{Op: core.OpRead, Local: lr.Addr, Segment: seg, Remote: ro.Addr, Len: size})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, tcp.ID, st[0].Transport)
	require.Equal(t, peertest.Pattern(0, size), readDev(t, d, lr.Addr, size))

	code, _, st = transfer(t, e, core.TransferRequest{Op: core.OpWrite, Local: lr.Addr, Segment: seg, Remote: ro.Addr, Len: size})
	require.Equal(t, status.PermissionDenied, code)
	require.Equal(t, status.PermissionDenied, st[0].Code)
	require.Equal(t, peertest.Sum(peertest.Pattern(0, size)), cmd(t, peer, "sum 0"), "nothing written")
	require.Zero(t, peerStats(t, peer)["exports_total"])
	require.Zero(t, tr.Stats()["imports_total"])

	require.NoError(t, e.Free(lr))
	require.NoError(t, e.Close())
	f.AssertClean(t)
	require.NoError(t, peer.Stop())
}

// handshakeCmd ("handshake ENDPOINT") dials a cuda Unix endpoint, runs the
// handshake with the peer's secret, and answers the status code.
func handshakeCmd(e *core.Engine, args []string) (string, error) {
	c, err := net.Dial("unix", args[0])
	if err != nil {
		return "", err
	}
	defer c.Close()
	_, err = wire.ClientHandshake(c, wire.HandshakeConfig{
		Secret: e.Options().Secret, Deadline: time.Now().Add(10 * time.Second), LocalName: "other-user",
	}, KindCUDA)
	return strconv.Itoa(int(status.CodeOf(err))), nil
}

// The cuda endpoint serves only its own uid or root: a peer of another
// user is cut off before the handshake, so it can ask for no handle.
func TestOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "running a peer as another user needs root")
	}
	setpriv := testenv.RequireBinary(t, "setpriv")
	f, _ := useFake(t)
	e, tr := newEngine(t, "cuda")
	ep := tr.Endpoints()
	require.Len(t, ep, 1)
	bin := sharedCopy(t, os.Args[0])
	run := func(exec ...string) string {
		p := peertest.Start(t, peertest.Config{Transports: []string{}, Binary: bin, Exec: exec})
		ans, err := p.Cmd("handshake %s", ep[0].Addr)
		require.NoError(t, err)
		require.NoError(t, p.Stop())
		return ans
	}
	require.Equal(t, strconv.Itoa(int(status.OK)), run(), "the same user passes")
	require.NotEqual(t, strconv.Itoa(int(status.OK)),
		run(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"), "another user does not")
	require.EqualValues(t, 1, e.Stats().Listeners["cuda"].PeerRejected, "refused at accept")
	require.Zero(t, tr.Stats()["exports_total"])
	require.NoError(t, e.Close())
	f.AssertClean(t)
}

// sharedCopy copies the executable at path into a directory every user
// can enter, and returns the copy's path.
func sharedCopy(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dst := filepath.Join(dir, filepath.Base(path))
	require.NoError(t, os.WriteFile(dst, b, 0o755))
	return dst
}
