package lease

import (
	"bytes"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// FuzzDecodeRequest: the bytes an initiator sends a target (shm leases,
// cuda calls). Any input decodes or fails with a Protocol error, never
// panics, never yields more ranges than the limit or than the input holds,
// and a decoded request encodes back to the same bytes unless its ttl was
// clamped.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(encodeRequest(1, time.Second, Range{Op: core.OpRead, Addr: 0x1000, Len: 8}), uint8(4))
	f.Add(encodeRequest(7, 0, Range{Op: core.OpWrite, Addr: 1, Len: 1},
		Range{Op: core.OpRead, Addr: ^uint64(0), Len: ^uint64(0)}), uint8(2))
	f.Add(encodeRequest(1, 0), uint8(1))
	f.Add(encodeRequest(1, 0, Range{Op: 2}), uint8(1))
	f.Add(append(encodeRequest(1, 0, Range{}), 0), uint8(1))
	f.Add([]byte{}, uint8(0))
	f.Add(make([]byte, RequestHeadSize), uint8(255))
	f.Add(append(make([]byte, 16), 0xff, 0xff, 0xff, 0xff), uint8(255))
	f.Fuzz(func(t *testing.T, p []byte, max uint8) {
		m := Request{Ranges: make([]Range, 3)} // reused storage must not leak into the result
		err := DecodeRequest(p, int(max), &m)
		if err != nil {
			require.Equal(t, status.Protocol, status.CodeOf(err), "%v", err)
			return
		}
		require.NotEmpty(t, m.Ranges)
		require.LessOrEqual(t, len(m.Ranges), int(max))
		require.Equal(t, RequestHeadSize+len(m.Ranges)*RangeSize, len(p))
		require.GreaterOrEqual(t, m.TTL, time.Duration(0))
		require.LessOrEqual(t, m.TTL, MaxTTL)
		for _, r := range m.Ranges {
			require.LessOrEqual(t, r.Op, core.OpWrite)
		}
		if m.TTL == MaxTTL {
			return // clamped: the original ttl is not known any more
		}
		again := encodeRequest(m.ID, m.TTL, m.Ranges...)
		require.True(t, bytes.Equal(again, p), "re-encoded request differs:\n% x\n% x", again, p)
	})
}

// FuzzDecodeAnswerEntry: the head of a target's answer per range. A
// decoded entry is OK or a known failure code (a target cannot make up a
// code that would reach the caller as an unknown tent_status), its message
// is bounded, and whatever is decoded encodes back to the bytes consumed.
func FuzzDecodeAnswerEntry(f *testing.F) {
	for _, c := range []struct {
		code status.Code
		msg  string
	}{{status.OK, ""}, {status.NotRegistered, "gone"}, {status.PermissionDenied, ""}, {status.OutOfRange, "é"}} {
		e := wire.NewEncoder(nil)
		AppendAnswerEntry(&e, c.code, c.msg)
		f.Add(e.Out())
	}
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0})             // PENDING is not a failure code
	f.Add([]byte{0x0f, 0x27, 0, 0, 0, 0, 0, 0})       // 9999
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}) // INT32_MAX
	f.Add([]byte{0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		d := wire.NewDecoder(p)
		code, msg := DecodeAnswerEntry(&d)
		if d.Err() != nil {
			require.Equal(t, status.Protocol, status.CodeOf(d.Err()), "%v", d.Err())
			return
		}
		if code != status.OK {
			_, known := status.Lookup(code)
			require.True(t, known, "unknown code %d accepted", code)
			require.Less(t, int32(code), int32(0), "non-failure code %d accepted as a refusal", code)
			require.LessOrEqual(t, len(msg), MaxAnswerMessage)
		} else {
			require.Empty(t, msg)
		}
		e := wire.NewEncoder(nil)
		AppendAnswerEntry(&e, code, msg)
		require.True(t, bytes.Equal(e.Out(), p[:d.Offset()]), "re-encoded entry differs")
		if utf8.ValidString(msg) {
			require.Equal(t, msg, cutMessage(msg), "a decoded message is already within the bound")
		}
	})
}
