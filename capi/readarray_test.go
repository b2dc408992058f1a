package main

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// readArrayVia reads every entry, a chunk at a time, through the scratch
// buffer it is given, which it grows once to a chunk and then reuses: a
// submit through the C ABI allocates no copy of the caller's array.
func TestReadArrayViaReusesItsScratch(t *testing.T) {
	src := make([]uint64, readChunk+44)
	for i := range src {
		src[i] = uint64(i) * 3
	}
	addr := uintptr(unsafe.Pointer(&src[0]))
	var got []uint64
	visit := func(i int, v *uint64) error {
		require.Equal(t, i, len(got))
		got = append(got, *v)
		return nil
	}
	var scratch []uint64
	require.NoError(t, readArrayVia(addr, uint64(len(src)), maxBatch, "test", &scratch, visit))
	require.Equal(t, src, got)
	require.Equal(t, readChunk, cap(scratch))
	first := &scratch[0]

	got = got[:0]
	require.NoError(t, readArrayVia(addr, 10, maxBatch, "test", &scratch, visit))
	require.Equal(t, src[:10], got)
	require.Same(t, first, &scratch[0], "the scratch buffer was reused")

	var sum uint64
	add := func(_ int, v *uint64) error { sum += *v; return nil }
	allocs := testing.AllocsPerRun(10, func() {
		_ = readArrayVia(addr, uint64(len(src)), maxBatch, "test", &scratch, add)
	})
	require.Zero(t, allocs)
}

// requestBufs keeps what it is given, up to its bound, and hands it back.
func TestRequestBufsKeepABound(t *testing.T) {
	var p requestBufs
	require.Nil(t, p.get())
	bufs := make([]*requestBuf, maxRequestBufs+2)
	for i := range bufs {
		bufs[i] = &requestBuf{}
		p.put(bufs[i])
	}
	for i := maxRequestBufs - 1; i >= 0; i-- {
		require.Same(t, bufs[i], p.get())
	}
	require.Nil(t, p.get(), "past the bound nothing was kept")
}
