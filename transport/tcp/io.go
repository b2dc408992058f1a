package tcp

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

const (
	// readBufSize is the receive buffer of a connection. Headers (and the
	// small payloads that arrive with them) are read through it, many per
	// system call.
	readBufSize = 64 << 10
	// directMin: a payload of which at least this much is still in the
	// socket is read straight into its destination; a smaller remainder is
	// read through the buffer, together with the headers behind it.
	directMin = 16 << 10
)

// bufReader reads a stream of headers and payloads. Bytes that arrived
// together with a header are copied out of its buffer; the rest of a large
// payload goes from the socket straight into the destination.
type bufReader struct {
	src io.Reader
	// raw, when set, serves tryFill and readv; count and onTimeout do
	// for them what src does for itself: count the bytes, and tell a
	// deadline that should be extended (true) from one that has passed.
	raw       syscall.RawConn
	count     *atomic.Int64
	onTimeout func() bool
	buf       []byte
	r, w      int
	hdr       int  // header size
	large     bool // large payloads are coming: read one header at a time into buf
	// guarded: the reading goroutine runs under host.Guard, so a fault on
	// registered memory is already an error; copies need no guard each.
	guarded bool

	// The system calls raw runs, made once (setRaw) so that a read
	// allocates nothing, and what they take and give back.
	readOnce, readvOnce, pollOnce func(fd uintptr) bool
	into                          []byte
	iov                           [2][]byte
	poll                          unix.Timespec
	n                             int
	err                           error
}

// setRaw makes the reader serve tryFill, awaitData and large payloads
// with system calls on raw.
func (b *bufReader) setRaw(raw syscall.RawConn) {
	b.raw = raw
	b.readOnce, b.readvOnce, b.pollOnce = b.readNow, b.readvNow, b.pollNow
}

// readNow reads b.into once, without waiting.
func (b *bufReader) readNow(fd uintptr) bool {
	for {
		b.n, b.err = unix.Read(int(fd), b.into)
		if b.err != unix.EINTR {
			return true // never wait
		}
	}
}

// readvNow reads into b.iov; it asks to wait when the socket is empty.
func (b *bufReader) readvNow(fd uintptr) bool {
	for {
		b.n, b.err = unix.Readv(int(fd), b.iov[:])
		if b.err != unix.EINTR {
			return b.err != unix.EAGAIN
		}
	}
}

// pollNow blocks in ppoll(2) on fd for up to b.poll.
func (b *bufReader) pollNow(fd uintptr) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Ppoll(fds[:], &b.poll, nil); err != unix.EINTR {
			return true
		}
	}
}

// newBufReader reads src through buf, which has readBufSize bytes.
func newBufReader(src io.Reader, hdr int, buf []byte) *bufReader {
	return &bufReader{src: src, buf: buf, hdr: hdr}
}

// expect tells the reader the payload size announced by the header just
// read. While payloads are large, reads into the buffer stop at the next
// header, so that the payloads go straight to their destinations; small
// payloads come through the buffer, many per read.
func (b *bufReader) expect(n int) { b.large = n >= directMin }

// room returns the part of the buffer a read may fill, for n buffered bytes.
func (b *bufReader) room(n int) []byte {
	if b.large {
		return b.buf[b.w:max(b.w, b.r+n)]
	}
	return b.buf[b.w:]
}

// buffered returns the number of bytes read but not consumed.
func (b *bufReader) buffered() int { return b.w - b.r }

// compact makes room for n buffered bytes (n <= len(buf)).
func (b *bufReader) compact(n int) {
	if b.r == b.w {
		b.r, b.w = 0, 0
	} else if len(b.buf)-b.r < n {
		b.w = copy(b.buf, b.buf[b.r:b.w])
		b.r = 0
	}
}

// tryFill reads what the socket holds, without waiting, and reports
// whether it got anything. Without a raw connection it reports false.
func (b *bufReader) tryFill() (bool, error) {
	if b.raw == nil {
		return false, nil
	}
	b.compact(b.hdr)
	room := b.room(b.hdr)
	if len(room) == 0 {
		return false, nil
	}
	b.into, b.n, b.err = room, 0, nil
	err := b.raw.Read(b.readOnce)
	n, rerr := b.n, b.err
	b.into, b.err = nil, nil
	switch {
	case err != nil:
		return false, err
	case rerr == unix.EAGAIN:
		return false, nil
	case rerr != nil:
		return false, rerr
	case n == 0:
		return false, io.ErrUnexpectedEOF
	}
	b.w += n
	if b.count != nil {
		b.count.Add(int64(n))
	}
	return true, nil
}

// awaitData blocks the calling thread in ppoll(2) until the socket has
// data, its peer hangs up, or d passes, when fewer than n bytes are
// buffered; it reports nothing (the read that follows sees what came, or
// waits in the netpoller as usual). Without a raw connection it returns
// at once. A read deadline already passed (a kick) returns at once too,
// but one set while the thread is in ppoll is seen only when d is up.
func (b *bufReader) awaitData(n int, d time.Duration) {
	if b.raw == nil || b.w-b.r >= n || d <= 0 {
		return
	}
	b.poll = unix.NsecToTimespec(d.Nanoseconds())
	_ = b.raw.Read(b.pollOnce)
}

// fill reads until at least n bytes (n <= len(buf)) are buffered.
func (b *bufReader) fill(n int) error {
	b.compact(n)
	for b.w-b.r < n {
		m, err := b.src.Read(b.room(n))
		b.w += m
		if err != nil && b.w-b.r < n {
			if err == io.EOF && b.w-b.r > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// next returns the next n bytes, valid until the next call.
func (b *bufReader) next(n int) ([]byte, error) {
	if b.w-b.r < n {
		if err := b.fill(n); err != nil {
			return nil, err
		}
	}
	p := b.buf[b.r : b.r+n : b.r+n]
	b.r += n
	return p, nil
}

// readInto fills dst from the stream. dst is registered memory: a fault on
// it (its owner unmapped it without unregistering) is an error that ends
// the connection, never a crash; the kernel reports the same as EFAULT on
// the readv path.
func (b *bufReader) readInto(dst []byte) error {
	k, err := b.copyOut(dst)
	if err != nil {
		return err
	}
	b.r += k
	rest := dst[k:]
	if len(rest) == 0 {
		return nil
	}
	if len(rest) < directMin {
		if err := b.fill(len(rest)); err != nil {
			return noEOF(err)
		}
		k, err := b.copyOut(rest)
		if err != nil {
			return err
		}
		b.r += k
		return nil
	}
	if b.raw == nil {
		_, err := io.ReadFull(b.src, rest)
		return noEOF(err)
	}
	// The buffer is empty: readv fills the rest of the payload, and what
	// follows it (the next header) lands in the buffer.
	b.r, b.w = 0, 0
	b.large = true
	for len(rest) > 0 {
		n, err := b.readv(rest, b.room(b.hdr))
		if err != nil {
			return noEOF(err)
		}
		if n <= len(rest) {
			rest = rest[n:]
		} else {
			b.w = n - len(rest)
			rest = nil
		}
	}
	return nil
}

// copyOut copies buffered bytes into dst, the start of a payload's
// destination.
func (b *bufReader) copyOut(dst []byte) (int, error) {
	if b.guarded {
		return copy(dst, b.buf[b.r:b.w]), nil
	}
	return host.Copy(dst, b.buf[b.r:b.w])
}

// readv reads into a, then c, waiting for data (and honoring the
// deadline, with onTimeout's second chance, as src does).
func (b *bufReader) readv(a, c []byte) (int, error) {
	b.iov = [2][]byte{a, c}
	defer func() { b.iov = [2][]byte{} }() // no reference to registered memory outlives the read
	for {
		b.n, b.err = 0, nil
		err := b.raw.Read(b.readvOnce)
		n, rerr := b.n, b.err
		b.err = nil
		if err == nil {
			err = rerr
		}
		if n > 0 {
			if b.count != nil {
				b.count.Add(int64(n))
			}
			return n, nil
		}
		if err == nil {
			return 0, io.EOF
		}
		if isTimeout(err) && b.onTimeout != nil && b.onTimeout() {
			continue
		}
		return 0, err
	}
}

// discard skips n bytes of the stream (a payload nobody may receive),
// reading them through the buffer.
func (b *bufReader) discard(n int) error {
	b.large = false
	for n > 0 {
		if b.r == b.w {
			if err := b.fill(1); err != nil {
				return noEOF(err)
			}
		}
		k := min(n, b.w-b.r)
		b.r += k
		n -= k
	}
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// iovec collects headers and payloads for one writev: headers are appended
// to one reusable buffer, payloads are referenced where they lie, and
// headers with no payload between them go out as one piece.
type iovec struct {
	hdr   []byte
	pays  []payloadAt
	bufs  net.Buffers
	out   net.Buffers // what WriteTo consumes: a field, so that it does not escape per write
	bytes int
}

type payloadAt struct {
	off int // header bytes before the payload
	b   []byte
}

// header returns room for the next header of n bytes.
func (v *iovec) header(n int) []byte {
	l := len(v.hdr)
	v.hdr = append(v.hdr, make([]byte, n)...)
	v.bytes += n
	return v.hdr[l : l+n : l+n]
}

// payload appends b after the headers added so far.
func (v *iovec) payload(b []byte) {
	v.pays = append(v.pays, payloadAt{off: len(v.hdr), b: b})
	v.bytes += len(b)
}

func (v *iovec) empty() bool { return v.bytes == 0 }

// writeTo writes the pieces in order, as much as w takes, and consumes
// what it wrote: after an error, the next call writes the rest.
func (v *iovec) writeTo(w io.Writer) (int64, error) {
	if v.out == nil {
		v.out = v.buffers()
	}
	return v.out.WriteTo(w)
}

// buffers returns the pieces in order; the result is consumed by WriteTo.
func (v *iovec) buffers() net.Buffers {
	bufs := v.bufs[:0]
	at := 0
	for _, p := range v.pays {
		if p.off > at {
			bufs = append(bufs, v.hdr[at:p.off])
			at = p.off
		}
		bufs = append(bufs, p.b)
	}
	if len(v.hdr) > at {
		bufs = append(bufs, v.hdr[at:])
	}
	v.bufs = bufs
	return bufs
}

func (v *iovec) reset() {
	clear(v.pays) // no references to registered memory outlive the write
	clear(v.bufs[:cap(v.bufs)])
	v.hdr, v.pays, v.bufs, v.out, v.bytes = v.hdr[:0], v.pays[:0], v.bufs[:0], nil, 0
}

// ioError turns a socket error into a status error: deadlines are
// Timeout, everything else (EOF, reset, closed) TransportError.
func ioError(what string, err error) error {
	if status.HasCode(err) {
		return err
	}
	if isTimeout(err) {
		return status.Errorf(status.Timeout, "tcp: %s: %w", what, err)
	}
	return status.Errorf(status.TransportError, "tcp: %s: %w", what, err)
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
