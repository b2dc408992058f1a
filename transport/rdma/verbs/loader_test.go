package verbs

import (
	"github.com/tent-dev/tent/internal/cshared"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// buildFake compiles fakeverbs/fakeverbs.c into a libibverbs.so.1 in a
// temporary directory and returns its path.
func buildFake(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "libibverbs.so.1")
	require.NoError(t, cshared.Build(cshared.Library{Source: "../fakeverbs/fakeverbs.c", Out: out}))
	return out
}

func TestFakeDevicesListed(t *testing.T) {
	path := buildFake(t)
	t.Setenv("FAKEVERBS_DEVICES", "2")
	lib, err := Open(path)
	require.NoError(t, err)
	defer lib.Close()
	names, err := lib.Devices()
	require.NoError(t, err)
	require.Equal(t, []string{"fake_0", "fake_1"}, names)
}

func TestNoDeviceIsAnError(t *testing.T) {
	path := buildFake(t)
	t.Setenv("FAKEVERBS_DEVICES", "0")
	lib, err := Open(path)
	require.NoError(t, err)
	defer lib.Close()
	_, err = lib.Devices()
	require.ErrorIs(t, err, ErrNoDevice)
}

func TestDeviceListFailure(t *testing.T) {
	path := buildFake(t)
	t.Setenv("FAKEVERBS_FAIL", "ibv_get_device_list")
	lib, err := Open(path)
	require.NoError(t, err)
	defer lib.Close()
	_, err = lib.Devices()
	require.ErrorContains(t, err, "ibv_get_device_list failed")
}

func TestNoLibraryGivesReason(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	_, err := Open(missing)
	require.Error(t, err)
	require.Contains(t, err.Error(), missing)
	require.Contains(t, err.Error(), "No such file")
}

func TestLibraryMissingSymbols(t *testing.T) {
	// libc is a real shared object without any verbs symbol.
	_, err := Open("libc.so.6")
	require.ErrorContains(t, err, "lacks ibv_get_device_list")
}

func TestLibraryPathHonoursEnv(t *testing.T) {
	require.Equal(t, DefaultLibrary, LibraryPath(func(string) string { return "" }))
	require.Equal(t, "/x/libfake.so", LibraryPath(func(k string) string {
		if k == LibraryEnv {
			return "/x/libfake.so"
		}
		return os.Getenv(k)
	}))
}
