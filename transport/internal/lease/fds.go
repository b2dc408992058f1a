package lease

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
)

// FDCounts are the owner's counters of received descriptors; either may
// be nil.
type FDCounts struct {
	Held     *atomic.Int64 // received and not yet closed
	Received *atomic.Int64 // ever received
}

// FDReader is a buffered reader over a Unix stream socket that collects
// the file descriptors arriving with the bytes (SCM_RIGHTS), in arrival
// order. The kernel attaches a sendmsg's descriptors to its first byte
// and never merges two messages' descriptors into one recvmsg, so once a
// whole frame has been read its descriptors are queued, and the frame
// takes as many as it announces from the front (Take).
//
// The reader is strict: a control message that does not parse, that is
// anything but SCM_RIGHTS, or that the kernel truncated (MSG_CTRUNC: the
// stream no longer says which descriptor belongs to which frame) is a
// status.Protocol error. Every descriptor of that message and every one
// still queued is closed at once, and every later Read returns the same
// error. Read, Take and CloseAll may be called from different goroutines.
type FDReader struct {
	c      *net.UnixConn
	counts FDCounts

	// Read's own state (one reader goroutine).
	buf  []byte
	r, w int
	oob  []byte

	mu   sync.Mutex
	fds  []int
	err  error // sticky: the control-data failure that ended the stream
	done bool  // CloseAll ran: descriptors that arrive later are closed
}

// NewFDReader reads c with room for maxFDs descriptors per recvmsg (more
// in one message is a truncation, hence an error).
func NewFDReader(c *net.UnixConn, maxFDs int, counts FDCounts) *FDReader {
	return &FDReader{
		c:      c,
		counts: counts,
		buf:    make([]byte, 64<<10),
		oob:    make([]byte, unix.CmsgSpace(4*maxFDs)),
	}
}

// Read implements io.Reader over the socket's bytes.
func (f *FDReader) Read(p []byte) (int, error) {
	if f.r == f.w {
		if err := f.sticky(); err != nil {
			return 0, err
		}
		n, oobn, flags, _, err := f.c.ReadMsgUnix(f.buf, f.oob)
		if oobn > 0 || flags&unix.MSG_CTRUNC != 0 {
			if cerr := f.collect(f.oob[:oobn], flags&unix.MSG_CTRUNC != 0); cerr != nil {
				return 0, cerr
			}
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

func (f *FDReader) sticky() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// collect queues the descriptors of oob, or, on any fault in it, closes
// them and everything queued and records the error.
func (f *FDReader) collect(oob []byte, truncated bool) error {
	var got []int
	var bad error
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		bad = status.Errorf(status.Protocol, "lease: bad control message: %v", err)
	}
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = status.Errorf(status.Protocol, "lease: unexpected control message (level %d type %d)",
				msgs[i].Header.Level, msgs[i].Header.Type)
			continue
		}
		got = append(got, fds...)
	}
	if bad == nil && truncated {
		bad = status.Errorf(status.Protocol, "lease: control data truncated by the kernel (too many file descriptors)")
	}
	f.count(len(got))
	f.mu.Lock()
	if bad == nil && !f.done {
		f.fds = append(f.fds, got...)
		f.mu.Unlock()
		return nil
	}
	if bad != nil && f.err == nil {
		f.err = bad
	}
	queued := f.fds
	f.fds = nil
	err = f.err
	f.mu.Unlock()
	f.close(got)
	f.close(queued)
	if err == nil {
		err = status.Errorf(status.Closed, "lease: descriptor reader closed")
	}
	return err
}

func (f *FDReader) count(n int) {
	if n == 0 {
		return
	}
	if f.counts.Held != nil {
		f.counts.Held.Add(int64(n))
	}
	if f.counts.Received != nil {
		f.counts.Received.Add(int64(n))
	}
}

// Take removes the first n queued descriptors; the caller owns them and
// closes them with Close. Fewer than n queued is a Protocol error (a frame
// announced descriptors that did not come with it).
func (f *FDReader) Take(n int) ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if n > len(f.fds) {
		return nil, status.Errorf(status.Protocol, "lease: frame announces %d file descriptors, %d arrived", n, len(f.fds))
	}
	out := append([]int(nil), f.fds[:n]...)
	f.fds = append(f.fds[:0], f.fds[n:]...)
	return out, nil
}

// Queued is the number of descriptors received and not yet taken.
func (f *FDReader) Queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fds)
}

// CloseAll closes every queued descriptor; descriptors that arrive later
// (a Read still in progress) are closed as they come.
func (f *FDReader) CloseAll() {
	f.mu.Lock()
	queued := f.fds
	f.fds = nil
	f.done = true
	f.mu.Unlock()
	f.close(queued)
}

// Close closes fds that came from this reader (taken with Take), keeping
// its count of held descriptors right.
func (f *FDReader) Close(fds []int) { f.close(fds) }

func (f *FDReader) close(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	if f.counts.Held != nil && len(fds) > 0 {
		f.counts.Held.Add(-int64(len(fds)))
	}
}

// WriteFrame writes one frame (wire framing: b must hold the header and
// the payload) with fds attached to its first byte (SCM_RIGHTS). The fds
// stay the caller's: the kernel has duplicated them into the message. A
// stream socket may take part of the bytes; the rest follows with plain
// writes, and the descriptors went with the first part.
func WriteFrame(c *net.UnixConn, b []byte, fds []int) error {
	if len(fds) == 0 {
		_, err := c.Write(b)
		return err
	}
	oob := unix.UnixRights(fds...)
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return status.Errorf(status.TransportError, "lease: sendmsg sent %d of %d control bytes", oobn, len(oob))
	}
	if n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}
