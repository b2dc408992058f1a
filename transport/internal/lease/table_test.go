package lease

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

func newTableEngine(t *testing.T) (*core.Engine, *core.Region) {
	t.Helper()
	e, err := core.New(core.Options{Transports: []string{}, UnregisterTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	buf := make([]byte, 4096)
	t.Cleanup(func() { runtime.KeepAlive(buf) })
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: 4096}, core.PermRemoteRead|core.PermRemoteWrite)
	require.NoError(t, err)
	return e, r
}

func pin(t *testing.T, e *core.Engine, r *core.Region) Pins {
	t.Helper()
	var p Pins
	_, err := p.Acquire(e, Range{Op: core.OpWrite, Addr: r.Addr, Len: 8})
	require.NoError(t, err)
	return p
}

// Every lease is released exactly once, by whichever of Release, its
// deadline and Close comes first; its pins go with it.
func TestTableReleasesOnce(t *testing.T) {
	e, r := newTableEngine(t)
	var heldN, expired atomic.Int64
	tb := NewTable(e, TableCounts{Held: &heldN, Expired: &expired})

	require.NoError(t, tb.Hold(1, pin(t, e, r), time.Hour))
	require.True(t, tb.Has(1))
	require.EqualValues(t, 1, heldN.Load())
	require.Equal(t, status.Busy, status.CodeOf(e.Unregister(r)), "a held lease pins its region")
	dup := pin(t, e, r)
	require.Equal(t, status.Protocol, status.CodeOf(tb.Hold(1, dup, time.Hour)), "an id is held once")
	dup.Release(e)
	require.True(t, tb.Release(1))
	require.False(t, tb.Release(1), "a second release is ignored")
	require.Zero(t, heldN.Load())

	// The deadline: a lease nobody releases is taken back.
	require.NoError(t, tb.Hold(2, pin(t, e, r), time.Nanosecond))
	require.Eventually(t, func() bool { return expired.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, heldN.Load())
	require.False(t, tb.Release(2), "expired already")

	// Close releases what is left and refuses new leases.
	require.NoError(t, tb.Hold(3, pin(t, e, r), time.Hour))
	require.NoError(t, tb.Hold(4, pin(t, e, r), time.Hour))
	tb.Close()
	require.Zero(t, heldN.Load())
	require.Zero(t, tb.Len())
	late := pin(t, e, r)
	require.Equal(t, status.Closed, status.CodeOf(tb.Hold(5, late, time.Hour)))
	late.Release(e)
	require.EqualValues(t, 1, expired.Load())
	require.NoError(t, e.Unregister(r), "every pin was released")
}

// Release, expiry and Close racing on the same leases: each is released
// once (the engine would panic on a double release of a region's pin,
// and the count would go negative).
func TestTableRace(t *testing.T) {
	e, r := newTableEngine(t)
	var heldN atomic.Int64
	tb := NewTable(e, TableCounts{Held: &heldN})
	const n = 200
	for id := uint64(1); id <= n; id++ {
		ttl := time.Hour
		if id%3 == 0 {
			ttl = time.Nanosecond
		}
		require.NoError(t, tb.Hold(id, pin(t, e, r), ttl))
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := uint64(1); id <= n; id++ {
				tb.Release(id)
			}
		}()
	}
	tb.Close()
	wg.Wait()
	require.Eventually(t, func() bool { return heldN.Load() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, e.Unregister(r))
}
