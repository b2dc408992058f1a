package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/status"
)

func requireCode(t testing.TB, err error, code status.Code, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, code, status.CodeOf(err), append([]any{"error: %v"}, err)...)
}

func TestEncoderDecoderRoundTrip(t *testing.T) {
	var e Encoder
	e.U8(0xab)
	e.U16(0xbeef)
	e.U32(0xdeadbeef)
	e.U64(0x0123456789abcdef)
	e.Raw([]byte{1, 2, 3})
	e.Bytes([]byte("payload"))
	e.String("name")
	e.String("")
	e.U32(3) // a count
	require.Equal(t, 1+2+4+8+3+4+7+4+4+4+4, e.Len())

	d := NewDecoder(e.Out())
	require.Equal(t, uint8(0xab), d.U8())
	require.Equal(t, uint16(0xbeef), d.U16())
	require.Equal(t, uint32(0xdeadbeef), d.U32())
	require.Equal(t, uint64(0x0123456789abcdef), d.U64())
	require.Equal(t, []byte{1, 2, 3}, d.Raw(3))
	require.Equal(t, []byte("payload"), d.Bytes(16))
	require.Equal(t, "name", d.String(4))
	require.Equal(t, "", d.String(0))
	require.Equal(t, 0, d.Remaining()-4)
	require.Equal(t, 3, d.Count(3, 0))
	require.NoError(t, d.Finish())
}

func TestEncoderLittleEndian(t *testing.T) {
	e := NewEncoder([]byte{0xff})
	e.U16(0x0102)
	e.U32(0x03040506)
	e.U64(0x0708090a0b0c0d0e)
	require.Equal(t, []byte{0xff, 2, 1, 6, 5, 4, 3, 0xe, 0xd, 0xc, 0xb, 0xa, 9, 8, 7}, e.Out())
}

func TestDecoderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		read func(d *Decoder)
		msg  string
	}{
		{"u8 empty", nil, func(d *Decoder) { d.U8() }, "need 1 bytes at offset 0, 0 left"},
		{"u16 short", []byte{1}, func(d *Decoder) { d.U16() }, "need 2 bytes at offset 0, 1 left"},
		{"u32 short", []byte{1, 2, 3}, func(d *Decoder) { d.U32() }, "need 4 bytes"},
		{"u64 short", []byte{1, 2, 3, 4, 5, 6, 7}, func(d *Decoder) { d.U64() }, "need 8 bytes"},
		{"raw short", []byte{1}, func(d *Decoder) { d.Raw(2) }, "need 2 bytes"},
		{"bytes over limit", []byte{5, 0, 0, 0, 1, 2, 3, 4, 5}, func(d *Decoder) { d.Bytes(4) }, "length 5 at offset 0 exceeds limit 4"},
		{"bytes over remaining", []byte{5, 0, 0, 0, 1}, func(d *Decoder) { d.Bytes(100) }, "length 5 at offset 0 exceeds the 1 bytes left"},
		{"string over limit", []byte{2, 0, 0, 0, 'a', 'b'}, func(d *Decoder) { d.String(1) }, "exceeds limit 1"},
		{"huge length", []byte{0xff, 0xff, 0xff, 0xff}, func(d *Decoder) { d.Bytes(1 << 31) }, "length 4294967295 at offset 0 exceeds limit 2147483648"},
		{"count over limit", []byte{9, 0, 0, 0}, func(d *Decoder) { d.Count(8, 0) }, "count 9 at offset 0 exceeds limit 8"},
		{"count over remaining", []byte{3, 0, 0, 0, 1, 2, 3, 4, 5}, func(d *Decoder) { d.Count(8, 2) }, "count 3 at offset 0 needs at least 6 bytes, 5 left"},
		{"trailing", []byte{1, 2}, func(d *Decoder) { d.U8() }, "1 trailing bytes after offset 1"},
		{"second error ignored", []byte{1}, func(d *Decoder) { d.U16(); d.Fail(status.ErrInternal) }, "need 2 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(tc.in)
			tc.read(&d)
			err := d.Finish()
			requireCode(t, err, status.Protocol)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestDecoderSticky(t *testing.T) {
	d := NewDecoder([]byte{1, 2, 3})
	require.Equal(t, uint32(0), d.U32())
	first := d.Err()
	requireCode(t, first, status.Protocol)
	// Later reads that would fit still return zero and keep the first error.
	require.Equal(t, uint8(0), d.U8())
	require.Nil(t, d.Raw(1))
	require.Equal(t, "", d.String(10))
	require.Equal(t, 0, d.Count(10, 1))
	require.Equal(t, 0, d.Offset())
	require.Same(t, first, d.Err())
	require.Same(t, first, d.Finish())

	d.Reset([]byte{7})
	require.NoError(t, d.Err())
	require.Equal(t, uint8(7), d.U8())
	require.NoError(t, d.Finish())
}

func TestDecoderDoesNotAllocate(t *testing.T) {
	var e Encoder
	e.U8(1)
	e.U16(2)
	e.U32(3)
	e.U64(4)
	e.Bytes([]byte("0123456789"))
	e.Raw(make([]byte, 32))
	e.U32(2)
	buf := e.Out()
	var d Decoder
	var sink uint64
	allocs := testing.AllocsPerRun(1000, func() {
		d.Reset(buf)
		sink += uint64(d.U8()) + uint64(d.U16()) + uint64(d.U32()) + d.U64()
		sink += uint64(len(d.Bytes(64)) + len(d.Raw(32)) + d.Count(4, 0))
		if d.Finish() != nil {
			panic("decode failed")
		}
	})
	require.Zero(t, allocs)
	require.NotZero(t, sink)
}

func TestEncoderReuseDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 256)
	var e Encoder
	allocs := testing.AllocsPerRun(1000, func() {
		e.Reset(buf[:0])
		e.U8(1)
		e.U16(2)
		e.U32(3)
		e.U64(4)
		e.String("hello")
		e.Bytes(buf[:0])
	})
	require.Zero(t, allocs)
}
