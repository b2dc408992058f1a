package rdma

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
	"github.com/tent-dev/tent/transport/tcp"
)

// Without a verbs library the engine still builds, leaves rdma out of its
// transports and says why in its stats.
func TestNoLibraryLeavesRDMAOutWithReason(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	e, err := core.New(core.Options{Available: []core.TransportSpec{Spec(Options{Library: missing}), tcp.Spec(tcp.Options{})}})
	require.NoError(t, err)
	defer e.Close()
	for _, tr := range e.Transports() {
		require.NotEqual(t, Name, tr.Name())
	}
	why := e.Stats().Unavailable[Name]
	require.Contains(t, why, "no verbs library")
	require.Contains(t, why, missing)
}

func TestSpecRanksBetweenShmAndTCP(t *testing.T) {
	s := Spec(Options{})
	require.Equal(t, Name, s.Name)
	require.Less(t, s.Rank, tcp.Rank)
	require.Greater(t, s.Rank, 30, "after shm")
	require.Equal(t, []uint8{KindConnect}, s.Kinds)
}

// Naming rdma for a transfer on such an engine is UNSUPPORTED, with the
// reason, not a bare "not installed".
func TestNamingUnavailableRDMAIsUnsupported(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	e, err := core.New(core.Options{Available: []core.TransportSpec{Spec(Options{Library: missing}), tcp.Spec(tcp.Options{})}})
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Submit([]core.TransferRequest{{Op: core.OpWrite, Len: 1}}, core.TransferOptions{Transport: Name})
	require.ErrorIs(t, err, status.ErrUnsupported)
	require.ErrorContains(t, err, "no verbs library")
	require.NoError(t, e.Uninstall(tcp.Name))
	_, err = e.Submit([]core.TransferRequest{{Op: core.OpWrite, Len: 1}}, core.TransferOptions{Transport: tcp.Name})
	require.ErrorIs(t, err, status.ErrNotFound, "an uninstalled transport is not found")
}

// With the fake libibverbs listing two devices the engine opens them and
// installs rdma; with none it leaves rdma out and says why.
func TestFakeDevicesInstallRDMA(t *testing.T) {
	lib := fakeverbs.Build(t)
	t.Setenv(fakeverbs.StateEnv, t.TempDir())
	t.Setenv(fakeverbs.DevicesEnv, "2")
	// Held open here so that its counters can be read after the engine
	// has closed its own handle.
	held, err := verbs.Open(lib)
	require.NoError(t, err)
	defer held.Close()
	e, err := core.New(core.Options{Available: []core.TransportSpec{Spec(Options{Library: lib}), tcp.Spec(tcp.Options{})}})
	require.NoError(t, err)
	installed := false
	for _, tr := range e.Transports() {
		installed = installed || tr.Name() == Name
	}
	require.True(t, installed, "rdma installed; unavailable: %q", e.Stats().Unavailable[Name])
	require.NoError(t, e.Close())
	live, err := fakeverbs.Counts(lib)
	require.NoError(t, err)
	require.True(t, live.Zero(), "every verbs object released by Close: %+v", live)

	// A fresh build: the fake reads its environment once per load.
	t.Setenv(fakeverbs.DevicesEnv, "0")
	none := fakeverbs.Build(t)
	e2, err := core.New(core.Options{Available: []core.TransportSpec{Spec(Options{Library: none}), tcp.Spec(tcp.Options{})}})
	require.NoError(t, err)
	defer e2.Close()
	require.Contains(t, e2.Stats().Unavailable[Name], "no RDMA device")
}
