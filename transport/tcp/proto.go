package tcp

import (
	"encoding/binary"

	"github.com/tent-dev/tent/status"
)

// Wire layout of the data stream; doc.go describes it byte by byte.
const (
	helloSize       = 16
	helloMagic      = "TTCP"
	protoVersion    = 1
	reqHeaderSize   = 24
	replyHeaderSize = 24

	opWrite uint8 = 1
	opRead  uint8 = 2

	// replyStaged, in a successful reply's flags: the target copied the
	// data through host memory (its region is GPU memory).
	replyStaged uint8 = 1

	// MaxChunk bounds the length of one request on the wire. Initiators
	// split larger requests; a target rejects a longer one as a protocol
	// error.
	MaxChunk = 16 << 20
	// maxMessage bounds the error text of a reply.
	maxMessage = 1024
)

func putHello(b []byte, incarnation uint64) {
	copy(b[0:4], helloMagic)
	binary.LittleEndian.PutUint16(b[4:], protoVersion)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], incarnation)
}

func parseHello(b []byte) (incarnation uint64, err error) {
	if len(b) != helloSize {
		return 0, status.Errorf(status.Protocol, "tcp: hello of %d bytes, want %d", len(b), helloSize)
	}
	if string(b[0:4]) != helloMagic {
		return 0, status.Errorf(status.Protocol, "tcp: bad hello magic % x", b[0:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != protoVersion {
		return 0, status.Errorf(status.VersionMismatch, "tcp: data protocol version %d, want %d", v, protoVersion)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return 0, status.Errorf(status.Protocol, "tcp: hello reserved field %#x", r)
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// reqHeader is one request, initiator -> target.
type reqHeader struct {
	op   uint8
	n    uint32 // bytes to move, 1..MaxChunk
	id   uint64
	addr uint64 // target address; addr+n does not overflow
}

func putReqHeader(b []byte, h reqHeader) {
	_ = b[reqHeaderSize-1]
	b[0] = h.op
	b[1] = 0
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], h.n)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint64(b[16:], h.addr)
}

func parseReqHeader(b []byte) (reqHeader, error) {
	if len(b) != reqHeaderSize {
		return reqHeader{}, status.Errorf(status.Protocol, "tcp: request header of %d bytes, want %d", len(b), reqHeaderSize)
	}
	h := reqHeader{
		op:   b[0],
		n:    binary.LittleEndian.Uint32(b[4:]),
		id:   binary.LittleEndian.Uint64(b[8:]),
		addr: binary.LittleEndian.Uint64(b[16:]),
	}
	switch {
	case h.op != opWrite && h.op != opRead:
		return h, badRequest("unknown op", uint64(h.op))
	case b[1] != 0:
		return h, badRequest("unknown flags", uint64(b[1]))
	case b[2]|b[3] != 0:
		return h, badRequest("non-zero reserved field", uint64(binary.LittleEndian.Uint16(b[2:])))
	case h.n == 0 || h.n > MaxChunk:
		return h, badRequest("length outside [1, MaxChunk]", uint64(h.n))
	case h.addr+uint64(h.n) < h.addr:
		return h, badRequest("address + length overflows", h.addr)
	}
	return h, nil
}

//go:noinline
func badRequest(what string, v uint64) error {
	return status.Errorf(status.Protocol, "tcp: bad request header: %s (%#x)", what, v)
}

// replyHeader answers one request, target -> initiator, in request order.
type replyHeader struct {
	op     uint8
	flags  uint8  // replyStaged
	msgLen uint16 // error text that follows the header
	code   status.Code
	id     uint64
	n      uint32 // payload that follows the text: the length of a successful READ, else 0
}

func putReplyHeader(b []byte, h replyHeader) {
	_ = b[replyHeaderSize-1]
	b[0] = h.op
	b[1] = h.flags
	binary.LittleEndian.PutUint16(b[2:], h.msgLen)
	binary.LittleEndian.PutUint32(b[4:], uint32(int32(h.code)))
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint32(b[16:], h.n)
	binary.LittleEndian.PutUint32(b[20:], 0)
}

func parseReplyHeader(b []byte) (replyHeader, error) {
	if len(b) != replyHeaderSize {
		return replyHeader{}, status.Errorf(status.Protocol, "tcp: reply header of %d bytes, want %d", len(b), replyHeaderSize)
	}
	h := replyHeader{
		op:     b[0],
		flags:  b[1],
		msgLen: binary.LittleEndian.Uint16(b[2:]),
		code:   status.Code(int32(binary.LittleEndian.Uint32(b[4:]))),
		id:     binary.LittleEndian.Uint64(b[8:]),
		n:      binary.LittleEndian.Uint32(b[16:]),
	}
	switch {
	case h.op != opWrite && h.op != opRead:
		return h, badReply("unknown op", uint64(h.op))
	case h.flags&^replyStaged != 0:
		return h, badReply("unknown flags", uint64(h.flags))
	case h.flags != 0 && h.code != status.OK:
		return h, badReply("flags on a refusal", uint64(h.flags))
	case binary.LittleEndian.Uint32(b[20:]) != 0:
		return h, badReply("non-zero reserved field", uint64(binary.LittleEndian.Uint32(b[20:])))
	case h.code > 0 || !knownCode(h.code):
		return h, badReply("unknown status code", uint64(uint32(h.code)))
	case h.msgLen > maxMessage:
		return h, badReply("message longer than the limit", uint64(h.msgLen))
	case h.code == status.OK && h.msgLen != 0:
		return h, badReply("message on a success", uint64(h.msgLen))
	case h.n != 0 && (h.code != status.OK || h.op != opRead):
		return h, badReply("payload on a reply that carries none", uint64(h.n))
	case h.n > MaxChunk:
		return h, badReply("payload longer than MaxChunk", uint64(h.n))
	}
	return h, nil
}

func knownCode(c status.Code) bool {
	_, ok := status.Lookup(c)
	return ok
}

//go:noinline
func badReply(what string, v uint64) error {
	return status.Errorf(status.Protocol, "tcp: bad reply header: %s (%#x)", what, v)
}
