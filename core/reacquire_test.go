package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// reacquire takes a use of a region the caller holds only for a range
// inside it and while no unregister has started; otherwise it leaves the
// use count as it was and sends the caller to Acquire.
func TestReacquire(t *testing.T) {
	var none *Region
	require.Nil(t, none.reacquire(0x1000, 0x10))

	r := &Region{}
	r.Addr, r.Len = 0x1000, 0x100
	r.users.Store(1) // the caller's use

	require.Same(t, r, r.reacquire(0x1080, 0x80))
	require.EqualValues(t, 2, r.users.Load())

	for _, c := range []struct{ addr, n uint64 }{{0x1080, 0x81}, {0xff0, 0x20}, {0x1100, 1}, {0x1000, 0}} {
		require.Nil(t, r.reacquire(c.addr, c.n), "[%#x, +%#x)", c.addr, c.n)
	}
	require.EqualValues(t, 2, r.users.Load(), "a refused range takes no use")

	r.closing.Store(true)
	require.Nil(t, r.reacquire(0x1000, 0x10), "an unregister has started")
	require.EqualValues(t, 2, r.users.Load(), "the use taken to look is given back")
}
