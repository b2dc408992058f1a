package main

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/status"
)

// badPages maps a read-write page, a PROT_NONE page and a read-only page,
// and returns bad pointers into them by name (tests/c/test_badinput.c runs
// the same kinds through every function, one process per case).
func badPages(t *testing.T) (rw uintptr, bad map[string]uintptr) {
	t.Helper()
	m, err := syscall.Mmap(-1, 0, 3*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	require.NoError(t, syscall.Mprotect(m[4096:8192], syscall.PROT_NONE))
	require.NoError(t, syscall.Mprotect(m[8192:], syscall.PROT_READ))
	base := uintptr(unsafeAddr(m))
	return base, map[string]uintptr{
		"near-NULL":                 8,
		"PROT_NONE":                 base + 4096,
		"read-only":                 base + 8192,
		"4 bytes before PROT_NONE":  base + 4096 - 4,
		"end of the address space":  ^uintptr(0) - 3,
		"non-canonical (kernel) va": 1 << 63,
	}
}

// A bad out-parameter fails the call with INVALID_ARGUMENT, and what the
// call would have created is not left behind.
func TestBadOutParamsRollBack(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	_, bad := badPages(t)
	base := lib.handles.Len()
	for name, p := range bad {
		t.Run(name, func(t *testing.T) {
			requireFail(t, status.InvalidArgument, cEngineCreateRaw(0, p))
			requireFail(t, status.InvalidArgument, cRegisterRaw(e, buf, 4096, 0, p))
			requireFail(t, status.InvalidArgument, cRegisterBatchOut(e, buf, 1, p))
			out, freeOut := cMalloc(16)
			defer freeOut()
			requireFail(t, status.InvalidArgument, cAllocRaw(e, 4096, p, out))
			requireFail(t, status.InvalidArgument, cAllocRaw(e, 4096, out, p))
			requireStats(t, e, 0, 0)
			s, r := cStats(e, 0)
			require.Equal(t, status.OK, r.Code, r.Msg)
			require.Zero(t, s.Allocations)
			require.Equal(t, base, lib.handles.Len(), "a handle leaked")
		})
	}
}

// Bad input pointers are INVALID_ARGUMENT naming the argument, never
// INTERNAL ("nil pointer dereference") or a crash.
func TestBadInputPointersAreInvalidArgument(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	_, bad := badPages(t)
	out, freeOut := cMalloc(8)
	defer freeOut()
	for name, p := range bad {
		if name == "read-only" {
			continue // readable: "" is a bad location, but not a bad pointer
		}
		t.Run(name, func(t *testing.T) {
			r := cRegisterRaw(e, buf, 4096, p, out)
			requireFail(t, status.InvalidArgument, r)
			require.Contains(t, r.Msg, "location")
			r = cEngineCreateRaw(p, out)
			requireFail(t, status.InvalidArgument, r)
			require.Contains(t, r.Msg, "opts")
			requireFail(t, status.InvalidArgument, cRegisterBatchRaw(e, p, 1, false))
			requireFail(t, status.InvalidArgument, cUnregisterBatchRaw(e, p, 1))
			requireStats(t, e, 0, 0)
		})
	}
}

// An n no array can have is INVALID_ARGUMENT before anything is read or
// allocated for it (it used to abort the process: runtime out of memory).
func TestAbsurdBatchCounts(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	ids, freeIDs := cMalloc(8)
	defer freeIDs()
	for _, n := range []uint64{1 << 40, maxBatch + 1, 1<<63 + 1} {
		r := cRegisterBatchOut(e, buf, n, ids)
		requireFail(t, status.InvalidArgument, r)
		require.Contains(t, r.Msg, "TENT_MAX_BATCH")
		requireFail(t, status.InvalidArgument, cUnregisterBatchRaw(e, ids, n))
	}
	// Within the bound but longer than the memory: fails at the first
	// unreadable chunk, with nothing registered.
	rwp, _ := badPages(t)
	d := rwp + 4096 - 24 // one tent_region_desc, then PROT_NONE
	require.NoError(t, writeValue(d, cRegionDesc{addr: buf, len: 64}, "test"))
	requireFail(t, status.InvalidArgument, cRegisterBatchRaw(e, d, 2, false))
	requireStats(t, e, 0, 0)
}

// A location naming a device is checked against the devices present:
// without a CUDA driver any GPU location is UNSUPPORTED; with one, a GPU
// past the last is INVALID_ARGUMENT.
func TestLocationNamingAbsentDevice(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	if m, err := cumem.Open(); err == nil && m.Driver().DeviceCount() > 0 {
		loc := fmt.Sprintf("cuda:%d", m.Driver().DeviceCount())
		_, r := cRegister(e, buf, 4096, &loc, rw, true)
		requireFail(t, status.InvalidArgument, r)
		requireStats(t, e, 0, 0)
		return
	}
	for _, loc := range []string{"cuda", "cuda:0", "cuda:99"} {
		_, r := cRegister(e, buf, 4096, &loc, rw, true)
		requireFail(t, status.Unsupported, r)
		require.Contains(t, r.Msg, "no CUDA driver")
	}
	loc := "cpu:65535"
	_, r := cRegister(e, buf, 4096, &loc, rw, true)
	requireFail(t, status.InvalidArgument, r)
	require.Contains(t, r.Msg, "NUMA node 65535")
	requireStats(t, e, 0, 0)
}

// Names and addresses that are not UTF-8 are refused where they enter:
// they would come back altered from JSON and every language's strings.
func TestNamesThatAreNotUTF8(t *testing.T) {
	base := lib.handles.Len()
	for _, o := range []*cOptions{
		{Name: strp("engine-\xff"), Transports: strp("fake")},
		{ListenAddr: strp("127.0.0.1\xc3:0"), Transports: strp("fake")},
		{Metadata: strp("etcd://h\xfe:1"), Transports: strp("fake")},
		{Prefix: strp("/tent\xed\xa0\x80"), Transports: strp("fake")}, // an encoded surrogate
	} {
		_, r := cEngineCreate(o)
		requireFail(t, status.InvalidArgument, r)
		require.Contains(t, r.Msg, "not valid UTF-8")
	}
	require.Equal(t, base, lib.handles.Len())
	e, _ := newEngine(t)
	_, r := cSegmentOpen(e, "127.0.0.1\xff:1")
	requireFail(t, status.InvalidArgument, r)
	require.Contains(t, r.Msg, "not valid UTF-8")
	requireStats(t, e, 0, 0)
	// valid UTF-8 beyond ASCII is a name like any other
	e2, r := cEngineCreate(&cOptions{Name: strp("moteur-é"), Transports: strp("fake")})
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, status.OK, cEngineDestroy(e2).Code)
}
