package cuda

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// KindCUDA is the channel kind the transport asks for in the handshake,
// on its own Unix listener and on the engine's TCP listener (lease-only
// sessions for fabric imports). core uses 1 (control) and 2 (tcp data).
const KindCUDA uint8 = 4

// Frames of a session, after the handshake (wire framing: type, three
// zero bytes, u32 length, payload). Requests carry a u64 id that the reply
// echoes. A status is an i32 code and a str message, as in core's control
// protocol.
const (
	// S->C, first frame: u64 incarnation of the target engine, u32 pid.
	msgHello uint8 = 1
	// C->S: u64 id, u64 alloc id.
	msgImport uint8 = 2
	// S->C: u64 id, u32 number of fds (0 or 1), status, u64 base, u64 size;
	// the fd travels as SCM_RIGHTS with this frame's bytes.
	msgImported uint8 = 3
	// C->S: u64 id, u64 ttl in ms, count n, n × (u64 addr, u64 len, u8 write).
	msgLease uint8 = 4
	// S->C: u64 id, u64 lease id (0: nothing granted), count n, n ×
	// (status, u64 alloc id, u64 region addr, u64 region len, u8 is cuda,
	// str device uuid).
	msgLeased uint8 = 5
	// C->S: u64 lease id. No reply.
	msgRelease uint8 = 6
	// S->C push: count n, n × u64 alloc id: allocations this session
	// imported that are no longer registered.
	msgRevoke uint8 = 7
)

const (
	// maxFrame bounds every frame of a session.
	maxFrame = 16 << 20
	// maxRanges bounds the ranges of one lease; clients split larger batches.
	maxRanges = 1 << 14
	// maxTTL bounds how long a lease may be asked for.
	maxTTL = time.Hour
	// leaseGrace is how long past the initiator's deadline the target keeps
	// a lease that was not released: the time copies queued just before
	// the deadline have to finish.
	leaseGrace = 5 * time.Second
	// maxMsg bounds status messages.
	maxMsg = 4 << 10
	// maxUUID bounds a device uuid string.
	maxUUID = 64
)

func putStatus(enc *wire.Encoder, err error) {
	enc.U32(uint32(int32(status.CodeOf(err))))
	msg := ""
	if err != nil {
		msg = err.Error()
		if len(msg) > maxMsg {
			msg = msg[:maxMsg]
		}
	}
	enc.String(msg)
}

// getStatus decodes a status; a failure carries the target's code and
// message.
func getStatus(d *wire.Decoder, peer string) error {
	code := status.Code(int32(d.U32()))
	msg := d.String(maxMsg)
	if d.Err() != nil || code == status.OK {
		return nil
	}
	if _, ok := status.Lookup(code); !ok || code > 0 {
		d.Fail(status.Errorf(status.Protocol, "cuda: %s sent unknown status code %d", peer, code))
		return nil
	}
	return status.Errorf(code, "%s: %s", peer, msg)
}

func frameBytes(typ uint8, payload []byte) []byte {
	b := make([]byte, wire.FrameHeaderSize+len(payload))
	b[0] = typ
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	copy(b[wire.FrameHeaderSize:], payload)
	return b
}

// writeFrameFDs writes one frame with fds attached (SCM_RIGHTS) to its
// first byte. The fds stay the caller's: the kernel has duplicated them
// into the message.
func writeFrameFDs(c *net.UnixConn, typ uint8, payload []byte, fds []int) error {
	b := frameBytes(typ, payload)
	oob := unix.UnixRights(fds...)
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return status.Errorf(status.TransportError, "cuda: sendmsg: %w", err)
	}
	if oobn != len(oob) {
		return status.Errorf(status.TransportError, "cuda: sendmsg sent %d of %d control bytes", oobn, len(oob))
	}
	if n < len(b) {
		if _, err := c.Write(b[n:]); err != nil {
			return status.Errorf(status.TransportError, "cuda: write: %w", err)
		}
	}
	return nil
}

// fdReader reads a Unix stream socket with recvmsg, keeping the file
// descriptors that arrive (SCM_RIGHTS) in order. A frame's fds are attached
// to its first byte, so once the frame is read they are in the queue; the
// kernel never merges the fds of two messages into one recvmsg.
type fdReader struct {
	c   *net.UnixConn
	oob []byte

	mu  sync.Mutex
	fds []int
}

const maxFDsPerMsg = 8

func newFDReader(c *net.UnixConn) *fdReader {
	return &fdReader{c: c, oob: make([]byte, unix.CmsgSpace(4*maxFDsPerMsg))}
}

func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := r.c.ReadMsgUnix(p, r.oob)
	if oobn > 0 {
		r.collect(r.oob[:oobn])
	}
	if flags&unix.MSG_CTRUNC != 0 && err == nil {
		// Some fds were dropped by the kernel: the stream no longer says
		// which fd belongs to which frame.
		return n, status.Errorf(status.Protocol, "cuda: control data truncated (too many file descriptors)")
	}
	return n, err
}

func (r *fdReader) collect(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd) // Go asks for MSG_CMSG_CLOEXEC too; be sure
			r.fds = append(r.fds, fd)
		}
	}
}

// take removes the first n queued fds.
func (r *fdReader) take(n int) ([]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > len(r.fds) {
		return nil, status.Errorf(status.Protocol, "cuda: frame announces %d file descriptors, %d arrived", n, len(r.fds))
	}
	out := append([]int(nil), r.fds[:n]...)
	r.fds = r.fds[n:]
	return out, nil
}

// closeAll closes the fds nobody took.
func (r *fdReader) closeAll() {
	r.mu.Lock()
	fds := r.fds
	r.fds = nil
	r.mu.Unlock()
	closeFDs(fds)
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
