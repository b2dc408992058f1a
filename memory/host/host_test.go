package host

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
)

func TestAllocIsASealedSharedMemfd(t *testing.T) {
	page := uint64(unix.Getpagesize())
	a, err := New().Alloc(page+1, -1)
	require.NoError(t, err)
	require.Equal(t, 2*page, a.Size, "rounded up to pages")
	require.GreaterOrEqual(t, a.FD, 0)
	seals, err := unix.FcntlInt(uintptr(a.FD), unix.F_GET_SEALS, 0)
	require.NoError(t, err)
	require.Equal(t, memfdSeals, seals&memfdSeals)
	require.Error(t, unix.Ftruncate(a.FD, int64(a.Size/2)), "a peer holding the fd cannot shrink it")

	// The same pages through the fd: what a same-host peer maps.
	other, err := unix.Mmap(a.FD, 0, int(a.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	require.NoError(t, New().CopyIn(a.Addr+page, []byte("shared")))
	require.Equal(t, "shared", string(other[page:page+6]))
	require.NoError(t, unix.Munmap(other))

	fd := a.FD
	require.NoError(t, a.Free())
	_, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.ErrorIs(t, err, unix.EBADF, "Free closes the memfd")
}

func TestCopiesTurnFaultsIntoErrors(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	addr := Addr(m)
	require.NoError(t, New().CopyIn(addr, []byte("abc")))
	out := make([]byte, 3)
	require.NoError(t, New().CopyOut(out, addr))
	require.Equal(t, "abc", string(out))
	require.NoError(t, unix.Munmap(m))
	require.ErrorIs(t, New().CopyOut(out, addr), status.ErrInvalidArgument)
	require.ErrorIs(t, New().CopyIn(addr, out), status.ErrInvalidArgument)
}

func TestCheckDevice(t *testing.T) {
	require.NoError(t, New().CheckDevice(-1))
	require.NoError(t, New().CheckDevice(0))
	err := New().CheckDevice(65535)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	require.ErrorContains(t, err, "NUMA node 65535")
	if _, statErr := os.Stat(numaNodeDir + "/node1"); statErr == nil {
		require.NoError(t, New().CheckDevice(1))
	}
	_, ok, err := New().Detect(12345)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "cpu", New().Name())
}
