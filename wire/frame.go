package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/tent-dev/tent/status"
)

const (
	// FrameHeaderSize is the size of a control frame header.
	FrameHeaderSize = 8
	// MaxFrame bounds any control frame payload, whatever the caller asks.
	MaxFrame = 64 << 20

	// Small frames are copied behind their header into a pooled buffer and
	// written with one Write call; larger ones go out with writev when the
	// writer is a socket, to avoid copying the payload.
	smallFrame = 64 << 10
	// firstChunk is what ReadFrame allocates for a payload larger than the
	// caller's buffer before any of it has arrived; it then grows by
	// doubling with the data. So a header claiming a huge length, with
	// nothing behind it, holds at most this much per connection, and
	// otherwise a peer pays in bandwidth for at least half of what it makes
	// us allocate.
	firstChunk = 64 << 10
)

var framePool = sync.Pool{New: func() any {
	b := make([]byte, 0, 4<<10)
	return &b
}}

// WriteFrame writes one control frame: type, three zero bytes, the payload
// length as u32, then the payload. The frame goes out in a single Write
// (or a single writev on a TCP or Unix socket), so frames written from
// several goroutines never interleave on a net.Conn.
func WriteFrame(w io.Writer, typ uint8, payload []byte) error {
	if len(payload) > MaxFrame {
		return status.Errorf(status.InvalidArgument, "frame: payload length %d exceeds limit %d", len(payload), MaxFrame)
	}
	if len(payload) > smallFrame {
		switch w.(type) {
		case *net.TCPConn, *net.UnixConn:
			hdr := make([]byte, FrameHeaderSize)
			putFrameHeader(hdr, typ, len(payload))
			bufs := net.Buffers{hdr, payload}
			_, err := bufs.WriteTo(w)
			return ioError("frame: write", err)
		}
	}
	bp := framePool.Get().(*[]byte)
	b := append((*bp)[:0], make([]byte, FrameHeaderSize)...)
	putFrameHeader(b, typ, len(payload))
	b = append(b, payload...)
	_, err := w.Write(b)
	if cap(b) <= smallFrame+FrameHeaderSize {
		*bp = b[:0]
		framePool.Put(bp)
	}
	return ioError("frame: write", err)
}

func putFrameHeader(b []byte, typ uint8, n int) {
	b[0] = typ
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
}

// ReadFrame reads one control frame. The payload is read into buf when it is
// large enough (so a caller looping with the same buffer does not allocate)
// and is only valid until buf is reused. maxLen bounds the payload; 0 or a
// value above MaxFrame means MaxFrame.
//
// A peer that closed the connection between frames yields a status.Closed
// error that also matches io.EOF. Lengths over the limit and non-zero
// reserved bytes are status.Protocol errors; deadlines give status.Timeout.
func ReadFrame(r io.Reader, maxLen uint32, buf []byte) (typ uint8, payload []byte, err error) {
	if maxLen == 0 || maxLen > MaxFrame {
		maxLen = MaxFrame
	}
	// Read the header through buf when possible: a local array would escape
	// through the io.Reader interface and cost an allocation per frame.
	var hdr []byte
	if cap(buf) >= FrameHeaderSize {
		hdr = buf[:FrameHeaderSize]
	} else {
		hdr = make([]byte, FrameHeaderSize)
	}
	if n, err := io.ReadFull(r, hdr); err != nil {
		if n == 0 && err == io.EOF {
			return 0, nil, status.Errorf(status.Closed, "frame: peer closed the connection: %w", io.EOF)
		}
		if err == io.ErrUnexpectedEOF {
			return 0, nil, status.Errorf(status.Protocol,
				"frame: connection closed after %d of %d header bytes: %w", n, FrameHeaderSize, err)
		}
		return 0, nil, ioError("frame: read header", err)
	}
	typ = hdr[0]
	if hdr[1]|hdr[2]|hdr[3] != 0 {
		return 0, nil, status.Errorf(status.Protocol, "frame: non-zero reserved bytes % x (type %d)", hdr[1:4], typ)
	}
	n := binary.LittleEndian.Uint32(hdr[4:])
	if n > maxLen {
		return 0, nil, status.Errorf(status.Protocol, "frame: type %d length %d exceeds limit %d", typ, n, maxLen)
	}
	if int(n) <= cap(buf) {
		payload = buf[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return 0, nil, frameBodyError(typ, n, err)
		}
		return typ, payload, nil
	}
	// Grow with the data rather than trusting the header.
	payload = make([]byte, 0, min(int(n), firstChunk))
	for len(payload) < int(n) {
		if len(payload) == cap(payload) {
			grown := make([]byte, len(payload), min(2*cap(payload), int(n)))
			copy(grown, payload)
			payload = grown
		}
		end := min(cap(payload), int(n))
		m, err := io.ReadFull(r, payload[len(payload):end])
		payload = payload[:len(payload)+m]
		if err != nil {
			return 0, nil, frameBodyError(typ, n, err)
		}
	}
	return typ, payload, nil
}

func frameBodyError(typ uint8, n uint32, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return status.Errorf(status.Protocol, "frame: connection closed inside type %d payload of %d bytes: %w",
			typ, n, io.ErrUnexpectedEOF)
	}
	return ioError("frame: read payload", err)
}

// ioError classifies a transport error: deadlines become Timeout, anything
// else TransportError. Errors that already carry a status code keep it.
func ioError(op string, err error) error {
	if err == nil {
		return nil
	}
	if status.CodeOf(err) != status.Internal {
		return err
	}
	if isTimeout(err) {
		return status.Errorf(status.Timeout, "%s: %w", op, err)
	}
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) {
		return status.Errorf(status.Closed, "%s: %w", op, err)
	}
	return status.Errorf(status.TransportError, "%s: %w", op, err)
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ReadFrameWithin is ReadFrame from r (c itself, or a buffered reader on
// c) for a connection c that may stay idle between frames for as long as
// the peer likes, but on which a frame, once its header arrived, must
// arrive whole within d: a peer that sends a header and then stalls (or
// drips the payload) is cut off with a Timeout instead of holding the
// reader, and its buffer, forever. It leaves no read deadline set on c.
func ReadFrameWithin(r io.Reader, c net.Conn, maxLen uint32, buf []byte, d time.Duration) (typ uint8, payload []byte, err error) {
	br := &bodyDeadline{r: r, c: c, d: d}
	typ, payload, err = ReadFrame(br, maxLen, buf)
	if br.set {
		_ = c.SetReadDeadline(time.Time{})
	}
	return typ, payload, err
}

// bodyDeadline sets c's read deadline once a frame header has been read.
type bodyDeadline struct {
	r    io.Reader
	c    net.Conn
	d    time.Duration
	read int
	set  bool
}

func (r *bodyDeadline) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.read += n
	if !r.set && r.read >= FrameHeaderSize {
		r.set = true
		_ = r.c.SetReadDeadline(time.Now().Add(r.d))
	}
	return n, err
}
