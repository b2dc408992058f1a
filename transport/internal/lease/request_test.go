package lease

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func encodeRequest(id uint64, ttl time.Duration, rs ...Range) []byte {
	e := wire.NewEncoder(nil)
	BeginRequest(&e, id, ttl, len(rs))
	for _, r := range rs {
		AppendRange(&e, r.Op, r.Addr, r.Len)
	}
	return e.Out()
}

func TestRequestRoundTrip(t *testing.T) {
	in := []Range{{Op: core.OpRead, Addr: 0x1000, Len: 8}, {Op: core.OpWrite, Addr: ^uint64(0), Len: 1}}
	p := encodeRequest(7, time.Second, in...)
	require.Len(t, p, RequestHeadSize+2*RangeSize)
	var m Request
	require.NoError(t, DecodeRequest(p, 4, &m))
	require.Equal(t, uint64(7), m.ID)
	require.Equal(t, time.Second, m.TTL)
	require.Equal(t, in, m.Ranges)
	require.Equal(t, core.AccessRemoteRead, m.Ranges[0].Access())
	require.Equal(t, core.AccessRemoteWrite, m.Ranges[1].Access())
}

func TestRequestRejects(t *testing.T) {
	var m Request
	for name, p := range map[string][]byte{
		"empty":    encodeRequest(1, 0),
		"over max": encodeRequest(1, 0, make([]Range, 3)...),
		"bad op":   encodeRequest(1, 0, Range{Op: 2}),
		"trailing": append(encodeRequest(1, 0, Range{}), 0),
		"short":    encodeRequest(1, 0, Range{})[:RequestHeadSize+3],
	} {
		require.Equal(t, status.Protocol, status.CodeOf(DecodeRequest(p, 2, &m)), name)
	}
	p := encodeRequest(1, -time.Second, Range{})
	require.NoError(t, DecodeRequest(p, 2, &m))
	require.Zero(t, m.TTL, "a negative ttl encodes as 0")
	huge := encodeRequest(1, 0, Range{})
	copy(huge[8:], bytes.Repeat([]byte{0xff}, 8))
	require.NoError(t, DecodeRequest(huge, 2, &m))
	require.Equal(t, MaxTTL, m.TTL, "clamped")
}

// The target's check: every range through Engine.Acquire with the access
// its op needs, and ranges inside an already pinned region share its pin.
func TestPins(t *testing.T) {
	e, err := core.New(core.Options{Transports: []string{}, UnregisterTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	defer e.Close()
	buf := make([]byte, 8192)
	ro := make([]byte, 4096)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: uint64(len(buf))}, core.PermRemoteRead|core.PermRemoteWrite)
	require.NoError(t, err)
	rr, err := e.Register(core.RegionDesc{Addr: host.Addr(ro), Len: uint64(len(ro))}, core.PermRemoteRead)
	require.NoError(t, err)

	var p Pins
	got, err := p.Acquire(e, Range{Op: core.OpWrite, Addr: r.Addr, Len: 16})
	require.NoError(t, err)
	require.Same(t, r, got)
	got, err = p.Acquire(e, Range{Op: core.OpRead, Addr: r.Addr + 4096, Len: 16})
	require.NoError(t, err)
	require.Same(t, r, got)
	require.Len(t, p.Regions, 1, "the second range shares the first one's pin")

	_, err = p.Acquire(e, Range{Op: core.OpWrite, Addr: rr.Addr, Len: 8})
	require.Equal(t, status.PermissionDenied, status.CodeOf(err))
	_, err = p.Acquire(e, Range{Op: core.OpRead, Addr: r.Addr + 8000, Len: 1000})
	require.Error(t, err, "a range past its region is refused")
	_, err = p.Acquire(e, Range{Op: core.OpRead, Addr: rr.Addr, Len: 8})
	require.NoError(t, err)
	require.Len(t, p.Regions, 2)

	// Pinned regions cannot go; released ones can.
	require.Equal(t, status.Busy, status.CodeOf(e.Unregister(rr)), "pinned")
	p.Release(e)
	require.Empty(t, p.Regions)
	require.NoError(t, e.Unregister(r))
	require.NoError(t, e.Unregister(rr))
	_, err = p.Acquire(e, Range{Op: core.OpRead, Addr: r.Addr, Len: 8})
	require.Equal(t, status.NotRegistered, status.CodeOf(err))
	runtime.KeepAlive(buf)
	runtime.KeepAlive(ro)
}
