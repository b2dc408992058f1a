package status

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCodeOf(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		code  Code
		coded bool
	}{
		{"nil", nil, OK, false},
		{"sentinel", ErrOverlap, Overlap, true},
		{"errorf", Errorf(Busy, "x %d", 1), Busy, true},
		{"wrapped sentinel", fmt.Errorf("ctx: %w", ErrTimeout), Timeout, true},
		{"wrapped errorf", fmt.Errorf("ctx: %w", Errorf(Closed, "c")), Closed, true},
		{"outermost wins", Errorf(TransportError, "t: %w", ErrTimeout), TransportError, true},
		{"joined", errors.Join(errors.New("a"), ErrNotFound), NotFound, true},
		{"plain", errors.New("plain"), Internal, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.code, CodeOf(tc.err))
			require.Equal(t, tc.coded, HasCode(tc.err))
		})
	}
	require.ErrorIs(t, Errorf(Overlap, "x"), ErrOverlap)
	require.NotErrorIs(t, Errorf(Overlap, "x"), ErrBusy)
	require.ErrorIs(t, Errorf(TransportError, "t: %w", ErrTimeout), ErrTimeout, "cause stays inspectable")
}

func TestTableUnique(t *testing.T) {
	names := map[string]bool{}
	codes := map[Code]bool{}
	for _, e := range Table {
		require.False(t, names[e.Name], e.Name)
		require.False(t, codes[e.Code], e.Name)
		names[e.Name], codes[e.Code] = true, true
		require.NotEmpty(t, e.Text)
		got, ok := Lookup(e.Code)
		require.True(t, ok)
		require.Equal(t, e, got)
	}
	require.Equal(t, "ERR_OVERLAP", Overlap.String())
	require.Equal(t, "Code(-999)", Code(-999).String())
}
