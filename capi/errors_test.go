package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
)

// A failure whose code tent.h does not define (a made-up code a peer's
// bytes carried in, or a bug) reaches C as TENT_ERR_INTERNAL with the code
// in the message, never as a value a caller's switch does not know; the
// same for a request's status.
func TestUnknownCodesNeverReachC(t *testing.T) {
	for _, c := range []status.Code{-9999, -23, 2, 12345, status.Code(-1 << 31)} {
		require.Equal(t, int32(status.Internal), int32(fail(status.Errorf(c, "from a peer"))), "code %d", c)
		require.Equal(t, int32(status.Internal), int32(requestCode(c)), "code %d", c)
	}
	require.Equal(t, int32(status.Timeout), int32(fail(status.Errorf(status.Timeout, "late"))))
	for _, c := range []status.Code{status.OK, status.Pending, status.NotFound, status.VersionMismatch} {
		require.Equal(t, int32(c), int32(requestCode(c)))
	}
}
