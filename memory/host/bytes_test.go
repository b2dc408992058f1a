package host

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
)

func TestCopyFaultIsAnError(t *testing.T) {
	page := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	addr := Addr(m)
	require.NoError(t, unix.Munmap(m))

	src := make([]byte, 64)
	_, err = Copy(Bytes(addr, 64), src)
	require.ErrorIs(t, err, status.ErrInvalidArgument)
	require.Contains(t, err.Error(), "not mapped")
	_, err = Copy(src, Bytes(addr, 64))
	require.ErrorIs(t, err, status.ErrInvalidArgument)

	n, err := Copy(src[:8], []byte("abcdefgh"))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, "abcdefgh", string(src[:8]))

	require.ErrorIs(t, Guard(func() error { Bytes(addr, 1)[0] = 1; return nil }), status.ErrInvalidArgument)
	var fault *Fault
	err = Guard(func() error { Bytes(addr+8, 1)[0] = 1; return nil })
	require.ErrorAs(t, err, &fault)
	require.Equal(t, uintptr(addr+8), fault.Addr)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	require.False(t, errors.As(status.Errorf(status.InvalidArgument, "other"), &fault), "only a fault is a Fault")
	require.Panics(t, func() { _ = Guard(func() error { panic("a bug") }) })
}
