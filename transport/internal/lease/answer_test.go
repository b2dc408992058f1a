package lease

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func TestAnswerEntryRoundTrip(t *testing.T) {
	var e wire.Encoder
	AppendAnswerEntry(&e, status.OK, "ignored for a grant")
	e.U64(42) // a transport's granted field
	AppendAnswerEntry(&e, status.NotRegistered, "gone")
	AppendAnswerEntry(&e, status.PermissionDenied, strings.Repeat("é", MaxAnswerMessage)) // cut on a rune

	d := wire.NewDecoder(e.Out())
	code, msg := DecodeAnswerEntry(&d)
	require.Equal(t, status.OK, code)
	require.Empty(t, msg)
	require.Equal(t, uint64(42), d.U64())
	code, msg = DecodeAnswerEntry(&d)
	require.Equal(t, status.NotRegistered, code)
	require.Equal(t, "gone", msg)
	code, msg = DecodeAnswerEntry(&d)
	require.Equal(t, status.PermissionDenied, code)
	require.LessOrEqual(t, len(msg), MaxAnswerMessage)
	require.True(t, strings.HasPrefix(strings.Repeat("é", MaxAnswerMessage), msg))
	require.Len(t, msg, MaxAnswerMessage) // 2-byte runes: exactly 100 fit
	require.NoError(t, d.Finish())
}

func TestAnswerEntryRejectsMadeUpCodes(t *testing.T) {
	for _, code := range []int32{1, 7, -99999} {
		var e wire.Encoder
		e.U32(uint32(code))
		e.String("x")
		d := wire.NewDecoder(e.Out())
		DecodeAnswerEntry(&d)
		require.Error(t, d.Finish(), "code %d", code)
		require.Equal(t, status.Protocol, status.CodeOf(d.Finish()))
	}
}

func TestAnswerEntryTruncated(t *testing.T) {
	var e wire.Encoder
	AppendAnswerEntry(&e, status.NotRegistered, "gone")
	b := e.Out()
	for n := 0; n < len(b); n++ {
		d := wire.NewDecoder(b[:n])
		DecodeAnswerEntry(&d)
		require.Error(t, d.Finish(), "%d of %d bytes", n, len(b))
	}
}
