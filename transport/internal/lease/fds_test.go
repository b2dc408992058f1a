package lease

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// socketPair returns two connected Unix stream sockets.
func socketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		f.Close()
		return c.(*net.UnixConn)
	}
	a, b = conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// pipes returns n descriptors to pass (read ends of pipes; the write ends
// are closed).
func pipes(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for range n {
		var p [2]int
		require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
		require.NoError(t, unix.Close(p[1]))
		out = append(out, p[0])
	}
	return out
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// sendRaw sends b with exactly the control data oob.
func sendRaw(t *testing.T, c *net.UnixConn, b, oob []byte) {
	t.Helper()
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	require.NoError(t, err)
	require.Equal(t, len(b), n)
	require.Equal(t, len(oob), oobn)
}

// A frame's descriptors are queued by the time the frame is read, and
// taken in order.
func TestFDReaderDeliversDescriptorsWithTheirFrame(t *testing.T) {
	a, b := socketPair(t)
	var held, recv atomic.Int64
	r := NewFDReader(b, 4, FDCounts{Held: &held, Received: &recv})
	base := openFDs(t)
	fds := pipes(t, 3)
	require.NoError(t, WriteFrame(a, Frame(7, []byte("one")), fds[:2]))
	require.NoError(t, WriteFrame(a, Frame(8, []byte("two")), fds[2:]))
	closeAll(fds) // the messages hold their own duplicates

	typ, p, err := wire.ReadFrame(r, 1<<10, nil)
	require.NoError(t, err)
	require.Equal(t, uint8(7), typ)
	require.Equal(t, "one", string(p))
	got, err := r.Take(2)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.EqualValues(t, 2, held.Load())

	typ, _, err = wire.ReadFrame(r, 1<<10, nil)
	require.NoError(t, err)
	require.Equal(t, uint8(8), typ)
	_, err = r.Take(2)
	require.Equal(t, status.Protocol, status.CodeOf(err), "a frame cannot take more than arrived")
	last, err := r.Take(1)
	require.NoError(t, err)

	r.Close(got)
	r.Close(last)
	require.Zero(t, held.Load())
	require.EqualValues(t, 3, recv.Load())
	require.Equal(t, base, openFDs(t), "every received descriptor closed")
}

// The error rule: a control message that is not SCM_RIGHTS (here
// credentials arriving beside the descriptors) is a Protocol error, the
// descriptors that came with it and those still queued are closed, and
// the stream stays failed.
func TestFDReaderFailsOnForeignControlMessage(t *testing.T) {
	a, b := socketPair(t)
	var held, recv atomic.Int64
	// Room for the credentials too, so the descriptors really arrive.
	r := NewFDReader(b, 32, FDCounts{Held: &held, Received: &recv})
	base := openFDs(t)

	queued := pipes(t, 2)
	require.NoError(t, WriteFrame(a, Frame(1, []byte("ok")), queued))
	closeAll(queued)
	_, _, err := wire.ReadFrame(r, 1<<10, nil)
	require.NoError(t, err)
	require.Equal(t, 2, r.Queued(), "queued, not yet taken")
	require.NoError(t, setPassCred(b)) // from now on the kernel adds credentials too

	bad := pipes(t, 2)
	oob := append(unix.UnixRights(bad...), unix.UnixCredentials(&unix.Ucred{
		Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})...)
	sendRaw(t, a, Frame(2, []byte("bad")), oob)
	closeAll(bad)

	_, _, err = wire.ReadFrame(r, 1<<10, nil)
	require.Equal(t, status.Protocol, status.CodeOf(err), "%v", err)
	require.Zero(t, r.Queued())
	require.Zero(t, held.Load(), "every descriptor received is closed")
	require.EqualValues(t, 4, recv.Load())
	require.Equal(t, base, openFDs(t))

	_, err = r.Take(1)
	require.Equal(t, status.Protocol, status.CodeOf(err), "the failure sticks")
	require.NoError(t, WriteFrame(a, Frame(3, nil), nil))
	_, _, err = wire.ReadFrame(r, 1<<10, nil)
	require.Equal(t, status.Protocol, status.CodeOf(err), "no byte is read past the failure")
}

// More descriptors than the reader makes room for: the kernel truncates
// the control data (MSG_CTRUNC), which is an error, and what did arrive
// is closed.
func TestFDReaderFailsOnTruncatedControlData(t *testing.T) {
	a, b := socketPair(t)
	var held, recv atomic.Int64
	r := NewFDReader(b, 2, FDCounts{Held: &held, Received: &recv})
	base := openFDs(t)
	many := pipes(t, 16)
	require.NoError(t, WriteFrame(a, Frame(1, []byte("x")), many))
	closeAll(many)

	_, _, err := wire.ReadFrame(r, 1<<10, nil)
	require.Equal(t, status.Protocol, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "truncated")
	require.Zero(t, held.Load())
	require.Zero(t, r.Queued())
	require.Equal(t, base, openFDs(t), "the descriptors the kernel did pass are closed")
}

// A control message that does not parse (a header whose length runs past
// the data) fails the same way. The kernel does not produce one, so the
// parse is fed directly.
func TestFDReaderFailsOnMalformedControlMessage(t *testing.T) {
	_, b := socketPair(t)
	var held atomic.Int64
	r := NewFDReader(b, 2, FDCounts{Held: &held})
	queued := pipes(t, 1)
	held.Add(1)
	r.fds = append(r.fds, queued...)
	oob := unix.UnixRights(0)
	oob[0] = 200 // the header's length runs past the data
	err := r.collect(oob, false)
	require.Equal(t, status.Protocol, status.CodeOf(err), "%v", err)
	require.Zero(t, held.Load(), "the queued descriptor is closed")
	require.Equal(t, -1, fcntl(queued[0]), "closed")
}

// CloseAll closes what is queued; a frame read after it cannot keep
// descriptors alive.
func TestFDReaderCloseAll(t *testing.T) {
	a, b := socketPair(t)
	var held atomic.Int64
	r := NewFDReader(b, 4, FDCounts{Held: &held})
	base := openFDs(t)
	fds := pipes(t, 2)
	require.NoError(t, WriteFrame(a, Frame(1, nil), fds[:1]))
	_, _, err := wire.ReadFrame(r, 1<<10, nil)
	require.NoError(t, err)
	r.CloseAll()
	require.Zero(t, held.Load())

	require.NoError(t, WriteFrame(a, Frame(2, nil), fds[1:]))
	closeAll(fds)
	_, _, err = wire.ReadFrame(r, 1<<10, nil)
	require.Error(t, err)
	require.Zero(t, held.Load())
	require.Equal(t, base, openFDs(t))

	a.Close()
	_, err = r.Read(make([]byte, 1))
	require.Error(t, err)
}

// A clean close reads as io.EOF, as framing expects.
func TestFDReaderEOF(t *testing.T) {
	a, b := socketPair(t)
	r := NewFDReader(b, 1, FDCounts{})
	a.Close()
	_, err := r.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
}

func setPassCred(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	return serr
}

func fcntl(fd int) int {
	v, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		return -1
	}
	return v
}
