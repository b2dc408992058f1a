package wire

import (
	"encoding/binary"

	"github.com/tent-dev/tent/status"
)

// Encoder appends little-endian fields to a byte slice. The zero value is
// ready to use; NewEncoder lets a caller reuse a buffer so that encoding on a
// hot path does not allocate once the buffer has grown.
type Encoder struct {
	buf []byte
}

// NewEncoder returns an Encoder that appends to dst (keeping its contents).
func NewEncoder(dst []byte) Encoder { return Encoder{buf: dst} }

// Reset makes e append to dst, keeping its contents.
func (e *Encoder) Reset(dst []byte) { e.buf = dst }

// Out returns the encoded bytes.
func (e *Encoder) Out() []byte { return e.buf }

// Len returns the number of bytes encoded so far.
func (e *Encoder) Len() int { return len(e.buf) }

// U8 appends one byte.
func (e *Encoder) U8(v uint8) { e.buf = append(e.buf, v) }

// U16 appends v little-endian.
func (e *Encoder) U16(v uint16) { e.buf = binary.LittleEndian.AppendUint16(e.buf, v) }

// U32 appends v little-endian.
func (e *Encoder) U32(v uint32) { e.buf = binary.LittleEndian.AppendUint32(e.buf, v) }

// U64 appends v little-endian.
func (e *Encoder) U64(v uint64) { e.buf = binary.LittleEndian.AppendUint64(e.buf, v) }

// Raw appends b as is, without a length prefix (magics, nonces, MACs).
func (e *Encoder) Raw(b []byte) { e.buf = append(e.buf, b...) }

// RawString appends s as is, without a length prefix.
func (e *Encoder) RawString(s string) { e.buf = append(e.buf, s...) }

// Bytes appends a u32 length followed by b. Callers bound len(b) by the
// limit the decoder will apply; the encoder does not know it.
func (e *Encoder) Bytes(b []byte) {
	e.U32(uint32(len(b)))
	e.buf = append(e.buf, b...)
}

// String appends a u32 length followed by the bytes of s.
func (e *Encoder) String(s string) {
	e.U32(uint32(len(s)))
	e.buf = append(e.buf, s...)
}

// Decoder reads little-endian fields from a byte slice received from a peer.
// Every read checks bounds; the first failure is recorded and later reads
// return zero values, so a caller decodes a whole message and checks Err (or
// Finish) once. Errors are status.Protocol errors naming the offset.
//
// Reads never allocate except String, which copies. Bytes and Raw return
// sub-slices of the input: copy them if they must outlive it.
type Decoder struct {
	buf []byte
	off int
	err error
}

// NewDecoder returns a Decoder over b.
func NewDecoder(b []byte) Decoder { return Decoder{buf: b} }

// Reset makes d decode b from the start and clears any recorded error.
func (d *Decoder) Reset(b []byte) { *d = Decoder{buf: b} }

// Err returns the first error recorded, or nil.
func (d *Decoder) Err() error { return d.err }

// Offset returns the number of bytes consumed.
func (d *Decoder) Offset() int { return d.off }

// Remaining returns the number of bytes not yet consumed.
func (d *Decoder) Remaining() int { return len(d.buf) - d.off }

// Fail records err unless an error is already recorded. Codecs built on the
// Decoder use it for semantic checks so that the first problem wins.
func (d *Decoder) Fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Finish returns the recorded error, or a Protocol error if bytes are left:
// trailing garbage means the peer and we disagree about the layout.
func (d *Decoder) Finish() error {
	if d.err != nil {
		return d.err
	}
	if n := len(d.buf) - d.off; n != 0 {
		d.err = status.Errorf(status.Protocol, "wire: %d trailing bytes after offset %d", n, d.off)
	}
	return d.err
}

// take returns the next n bytes, or nil after recording an error. n must be
// non-negative.
func (d *Decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.buf)-d.off {
		d.truncated(n)
		return nil
	}
	b := d.buf[d.off : d.off+n : d.off+n]
	d.off += n
	return b
}

// truncated is out of line so that the read fast paths stay small enough to
// inline and never build an error value.
//
//go:noinline
func (d *Decoder) truncated(n int) {
	d.err = status.Errorf(status.Protocol, "wire: truncated: need %d bytes at offset %d, %d left",
		n, d.off, len(d.buf)-d.off)
}

// U8 reads one byte.
func (d *Decoder) U8() uint8 {
	if d.err == nil && d.off < len(d.buf) {
		v := d.buf[d.off]
		d.off++
		return v
	}
	d.take(1)
	return 0
}

// U16 reads a little-endian uint16.
func (d *Decoder) U16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

// U32 reads a little-endian uint32.
func (d *Decoder) U32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// U64 reads a little-endian uint64.
func (d *Decoder) U64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// Raw reads exactly n bytes (a fixed-size field) and returns them without
// copying.
func (d *Decoder) Raw(n int) []byte {
	if n < 0 {
		d.Fail(status.Errorf(status.Internal, "wire: negative raw length %d", n))
		return nil
	}
	return d.take(n)
}

// length reads a u32 length prefix and checks it against max and against
// the bytes left, before anything is allocated for it.
func (d *Decoder) length(max uint32) int {
	at := d.off
	n := d.U32()
	if d.err != nil {
		return 0
	}
	if n > max {
		d.err = status.Errorf(status.Protocol, "wire: length %d at offset %d exceeds limit %d", n, at, max)
		return 0
	}
	if uint64(n) > uint64(len(d.buf)-d.off) {
		d.err = status.Errorf(status.Protocol, "wire: length %d at offset %d exceeds the %d bytes left",
			n, at, len(d.buf)-d.off)
		return 0
	}
	return int(n)
}

// Bytes reads a u32 length (at most max) and that many bytes, without
// copying. A zero length yields an empty, non-nil slice only if the input is
// non-nil; callers must not depend on the distinction.
func (d *Decoder) Bytes(max uint32) []byte {
	n := d.length(max)
	if d.err != nil {
		return nil
	}
	return d.take(n)
}

// String reads a u32 length (at most max) and that many bytes as a string.
func (d *Decoder) String(max uint32) string {
	n := d.length(max)
	if d.err != nil || n == 0 {
		return ""
	}
	return string(d.take(n))
}

// Count reads a u32 element count, at most max, and checks that the bytes
// left can hold that many elements of at least minSize bytes each. Sizing a
// slice from the result is then bounded by the input length, so a peer
// cannot make us allocate for elements it did not send.
func (d *Decoder) Count(max uint32, minSize int) int {
	at := d.off
	n := d.U32()
	if d.err != nil {
		return 0
	}
	if n > max {
		d.err = status.Errorf(status.Protocol, "wire: count %d at offset %d exceeds limit %d", n, at, max)
		return 0
	}
	if minSize > 0 && uint64(n)*uint64(minSize) > uint64(len(d.buf)-d.off) {
		d.err = status.Errorf(status.Protocol,
			"wire: count %d at offset %d needs at least %d bytes, %d left",
			n, at, uint64(n)*uint64(minSize), len(d.buf)-d.off)
		return 0
	}
	return int(n)
}
