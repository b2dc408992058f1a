//go:build linux

package shm

import (
	"errors"
	"io"
	"net"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
)

// fdReader is a buffered reader over a Unix connection that collects the
// file descriptors arriving with the bytes (SCM_RIGHTS). Descriptors are
// queued in arrival order; a grant takes as many as it announces from the
// front. The kernel attaches a sendmsg's descriptors to its first byte, so
// by the time a whole frame has been read its descriptors are queued.
type fdReader struct {
	c    *net.UnixConn
	buf  []byte
	r, w int
	oob  []byte
	fds  []int
	held *atomic.Int64 // the transport's count of received, unclosed fds
	recv *atomic.Int64 // the transport's count of fds ever received
}

func newFDReader(c *net.UnixConn, held, recv *atomic.Int64) *fdReader {
	return &fdReader{
		c:    c,
		buf:  make([]byte, 64<<10),
		oob:  make([]byte, unix.CmsgSpace(2*maxGrantFDs*4)),
		held: held,
		recv: recv,
	}
}

func (f *fdReader) Read(p []byte) (int, error) {
	if f.r == f.w {
		n, oobn, flags, _, err := f.c.ReadMsgUnix(f.buf, f.oob)
		if oobn > 0 {
			if perr := f.collect(f.oob[:oobn]); perr != nil {
				return 0, perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return 0, status.Errorf(status.Protocol, "shm: file descriptors truncated by the kernel")
		}
		if n <= 0 {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.EOF // as a plain Read reports it, so framing sees a clean close
			}
			return 0, err
		}
		f.r, f.w = 0, n
	}
	n := copy(p, f.buf[f.r:f.w])
	f.r += n
	return n, nil
}

func (f *fdReader) collect(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return status.Errorf(status.Protocol, "shm: bad control message: %v", err)
	}
	var bad error
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = status.Errorf(status.Protocol, "shm: unexpected control message (level %d type %d)",
				msgs[i].Header.Level, msgs[i].Header.Type)
			continue
		}
		f.held.Add(int64(len(fds)))
		f.recv.Add(int64(len(fds)))
		f.fds = append(f.fds, fds...)
	}
	return bad
}

// take removes the first n queued descriptors; the caller owns them.
func (f *fdReader) take(n int) ([]int, error) {
	if n > len(f.fds) {
		return nil, status.Errorf(status.Protocol, "shm: grant announces %d file descriptors, %d arrived", n, len(f.fds))
	}
	out := append([]int(nil), f.fds[:n]...)
	f.fds = append(f.fds[:0], f.fds[n:]...)
	return out, nil
}

// closeAll closes every queued descriptor.
func (f *fdReader) closeAll() {
	for _, fd := range f.fds {
		closeFD(fd, f.held)
	}
	f.fds = nil
}

func closeFD(fd int, held *atomic.Int64) {
	_ = unix.Close(fd)
	held.Add(-1)
}
