package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/capi/internal/capitest"
	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/status"
)

const (
	opRead  = 0 // TENT_OP_READ
	opWrite = 1 // TENT_OP_WRITE
)

// columnsWorld is an engine with the local transport (it moves real
// bytes), 128 KiB of C memory registered read-write and the engine's own
// segment, so a column transfer copies inside buf.
type columnsWorld struct {
	e, reg, seg uint64
	buf         uintptr
	handles     int // lib.handles.Len() once the world is set up
}

const columnsBufLen = 1 << 17

func newColumnsWorld(t *testing.T) *columnsWorld {
	t.Helper()
	base := lib.handles.Len()
	e, r := cEngineCreate(&cOptions{Transports: strp("local"), UnregisterTimeoutMs: 200})
	require.Equal(t, status.OK, r.Code, r.Msg)
	buf, free := cMalloc(columnsBufLen)
	reg, r := cRegister(e, buf, columnsBufLen, strp("cpu"), rw, true)
	require.Equal(t, status.OK, r.Code, r.Msg)
	name, _, r := cEngineName(e, 2048)
	require.Equal(t, status.OK, r.Code, r.Msg)
	seg, r := cSegmentOpen(e, name)
	require.Equal(t, status.OK, r.Code, r.Msg)
	w := &columnsWorld{e: e, reg: reg, seg: seg, buf: buf, handles: lib.handles.Len()}
	t.Cleanup(func() {
		require.Equal(t, status.OK, cSegmentClose(e, seg).Code)
		require.Equal(t, status.OK, cUnregister(e, reg).Code)
		require.Equal(t, status.OK, cEngineDestroy(e).Code)
		free()
		require.Equal(t, base, lib.handles.Len(), "a handle outlived its engine")
	})
	return w
}

// bytes is buf[off:off+n] (C memory).
func (w *columnsWorld) bytes(off, n uint64) []byte { return bytesAt(w.buf+uintptr(off), n) }

// requireIdle checks that no batch, request or extra handle is left.
func (w *columnsWorld) requireIdle(t *testing.T) {
	t.Helper()
	s, r := cStats(w.e, 0)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Zero(t, s.Batches, "batches")
	require.Zero(t, s.RequestsInFlight, "requests in flight")
	require.Equal(t, uint64(1), s.Regions, "regions")
	require.Equal(t, w.handles, lib.handles.Len(), "handles")
}

// cWords puts v in C memory (freed at the test's end) and returns its address.
func cWords(t *testing.T, v []uint64) uintptr {
	t.Helper()
	p, free := cMalloc(8 * max(len(v), 1))
	t.Cleanup(free)
	raw := make([]byte, 0, 8*len(v))
	for _, x := range v {
		raw = binary.LittleEndian.AppendUint64(raw, x)
	}
	if len(raw) > 0 {
		require.NoError(t, writeFrom(p, raw, "test"))
	}
	return p
}

// plan is a column batch: request i moves lens[i] bytes between
// buf+local[i] and buf+remote[i] (offsets into the world's buffer).
type plan struct{ local, remote, lens []uint64 }

// columns puts the plan in C memory as absolute addresses.
func (w *columnsWorld) columns(t *testing.T, op uint32, p plan) cColumns {
	abs := func(offs []uint64) []uint64 {
		out := make([]uint64, len(offs))
		for i, o := range offs {
			out[i] = uint64(w.buf) + o
		}
		return out
	}
	return cColumns{Op: op, Segment: w.seg, Local: cWords(t, abs(p.local)), Remote: cWords(t, abs(p.remote)),
		Lengths: cWords(t, p.lens), N: uint64(len(p.lens))}
}

// stridePlan: n requests of 1..64 bytes, the i-th at local+64i and
// remote+64i. n above 256 crosses a chunk of the columns' reading.
func stridePlan(n int, local, remote uint64) plan {
	var p plan
	for i := 0; i < n; i++ {
		p.local = append(p.local, local+uint64(64*i))
		p.remote = append(p.remote, remote+uint64(64*i))
		p.lens = append(p.lens, uint64(1+(i*37)%64))
	}
	return p
}

// requireMoved checks that each request of p copied its bytes from src
// (offsets p.from) to dst (offsets p.to), and that the rest of each
// 64-byte slot at the destination is still zero.
func (w *columnsWorld) requireMoved(t *testing.T, from, to, lens []uint64) {
	t.Helper()
	for i := range lens {
		require.True(t, bytes.Equal(w.bytes(from[i], lens[i]), w.bytes(to[i], lens[i])), "request %d: wrong bytes", i)
		if tail := 64 - lens[i]; tail > 0 {
			require.Equal(t, make([]byte, tail), w.bytes(to[i]+lens[i], tail), "request %d wrote past its end", i)
		}
	}
}

// readStatuses decodes n tent_request_status at p: (status, bytes).
func readStatuses(t *testing.T, p uintptr, n int) (codes []status.Code, moved []uint64) {
	t.Helper()
	raw := bytesAt(p, uint64(n*capitest.SizeofRequestStatus))
	for i := 0; i < n; i++ {
		q := raw[i*capitest.SizeofRequestStatus:]
		codes = append(codes, status.Code(int32(binary.LittleEndian.Uint32(q))))
		moved = append(moved, binary.LittleEndian.Uint64(q[8:]))
	}
	return codes, moved
}

// The columns move the bytes they name, both ways, synchronously and as a
// batch the caller waits for, and leave nothing behind.
func TestTransferColumnsMovesBytes(t *testing.T) {
	w := newColumnsWorld(t)
	const n = 300
	src := w.bytes(0, 1<<15)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	clear(w.bytes(1<<15, 1<<16))

	// Write [0, 32K) to [32K, 64K), synchronously.
	p := stridePlan(n, 0, 1<<15)
	sts, freeSts := cMalloc(n * capitest.SizeofRequestStatus)
	defer freeSts()
	r := cColumnsSyncRaw(w.e, w.columns(t, opWrite, p), sts)
	require.Equal(t, status.OK, r.Code, r.Msg)
	codes, moved := readStatuses(t, sts, n)
	for i := range codes {
		require.Equal(t, status.OK, codes[i], "request %d", i)
		require.Equal(t, p.lens[i], moved[i], "request %d's bytes", i)
	}
	w.requireMoved(t, p.local, p.remote, p.lens)
	w.requireIdle(t)

	// Read [32K, 64K) back into [64K, 96K) as a batch.
	q := stridePlan(n, 1<<16, 1<<15)
	out, freeOut := cMalloc(8)
	defer freeOut()
	r = cColumnsRaw(w.e, w.columns(t, opRead, q), out)
	require.Contains(t, []status.Code{status.OK, status.Pending}, r.Code, r.Msg)
	b, err := readValue[uint64](out, "test")
	require.NoError(t, err)
	require.NotZero(t, b)
	require.Equal(t, status.OK, cBatchWait(b, 10000).Code)
	r = cBatchStatusRaw(b, sts, n)
	require.Equal(t, status.OK, r.Code, r.Msg)
	codes, moved = readStatuses(t, sts, n)
	for i := range codes {
		require.Equal(t, status.OK, codes[i], "request %d", i)
		require.Equal(t, q.lens[i], moved[i], "request %d's bytes", i)
	}
	require.Equal(t, status.OK, cBatchDestroy(b).Code)
	w.requireMoved(t, q.remote, q.local, q.lens)
	w.requireMoved(t, p.local, q.local, q.lens) // the round trip: the source's bytes
	w.requireIdle(t)

	// The sync call with NULL statuses_out moves the bytes too.
	clear(w.bytes(1<<15, 1<<15))
	r = cColumnsSyncRaw(w.e, w.columns(t, opWrite, p), 0)
	require.Equal(t, status.OK, r.Code, r.Msg)
	w.requireMoved(t, p.local, p.remote, p.lens)
	w.requireIdle(t)
}

// columnsCase is one bad call: how it changes a good one, and what it
// must fail with.
type columnsCase struct {
	name string
	edit func(t *testing.T, w *columnsWorld, c *cColumns)
	code status.Code
	msg  string
}

// columnsCases: foreignSeg is a segment handle of another engine.
func columnsCases(t *testing.T, foreignSeg uint64) []columnsCase {
	rwp, bad := badPages(t)
	setWord := func(p uintptr, i int, v uint64) {
		require.NoError(t, writeValue(p+uintptr(8*i), v, "test"))
	}
	// A one-word column at the end of the read-write page: its second
	// word lies in the PROT_NONE page.
	edge := func(w *columnsWorld, v uint64) uintptr {
		p := rwp + 4096 - 8
		setWord(p, 0, v)
		return p
	}
	cases := []columnsCase{
		{"n = 0", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.N = 0 }, status.InvalidArgument, "n is 0"},
		{"n = TENT_MAX_BATCH + 1", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.N = maxBatch + 1 },
			status.InvalidArgument, "TENT_MAX_BATCH"},
		{"n = 2^40", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.N = 1 << 40 }, status.InvalidArgument, "TENT_MAX_BATCH"},
		{"n = 2^63 + 1", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.N = 1<<63 + 1 }, status.InvalidArgument, "TENT_MAX_BATCH"},
		{"n = SIZE_MAX", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.N = ^uint64(0) }, status.InvalidArgument, "TENT_MAX_BATCH"},
		{"opcode 2", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Op = 2 }, status.InvalidArgument, "unknown opcode 2"},
		{"opcode 2^32-1", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Op = ^uint32(0) }, status.InvalidArgument, "unknown opcode"},
		{"NULL local_addrs", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Local = 0 }, status.InvalidArgument, "local_addrs is NULL"},
		{"NULL remote_addrs", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Remote = 0 }, status.InvalidArgument, "remote_addrs is NULL"},
		{"NULL lengths", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Lengths = 0 }, status.InvalidArgument, "lengths is NULL"},
		{"NULL segment", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Segment = 0 }, status.InvalidHandle, ""},
		{"a region as the segment", func(_ *testing.T, w *columnsWorld, c *cColumns) { c.Segment = w.reg }, status.InvalidHandle, ""},
		{"a made-up segment", func(_ *testing.T, w *columnsWorld, c *cColumns) { c.Segment = w.seg + 1000 }, status.InvalidHandle, ""},
		{"a closed segment", func(t *testing.T, w *columnsWorld, c *cColumns) {
			name, _, _ := cEngineName(w.e, 2048)
			s, r := cSegmentOpen(w.e, name)
			require.Equal(t, status.OK, r.Code, r.Msg)
			require.Equal(t, status.OK, cSegmentClose(w.e, s).Code)
			c.Segment = s
		}, status.InvalidHandle, ""},
		{"another engine's segment", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Segment = foreignSeg },
			status.InvalidHandle, ""},
		{"length 0", func(t *testing.T, _ *columnsWorld, c *cColumns) { setWord(c.Lengths, 5, 0) },
			status.InvalidArgument, "request 5: zero length"},
		{"local address 0", func(t *testing.T, _ *columnsWorld, c *cColumns) { setWord(c.Local, 3, 0) },
			status.InvalidArgument, "request 3: null local address"},
		{"local memory not registered", func(t *testing.T, _ *columnsWorld, c *cColumns) {
			setWord(c.Local, 2, uint64(rwp))
		}, status.NotRegistered, "request 2"},
		{"local range past its region", func(t *testing.T, w *columnsWorld, c *cColumns) {
			setWord(c.Local, 7, uint64(w.buf)+columnsBufLen-8)
			setWord(c.Lengths, 7, 64)
		}, 0, "request 7"},
		{"remote address + length overflows", func(t *testing.T, _ *columnsWorld, c *cColumns) {
			setWord(c.Remote, 1, ^uint64(0)-8)
		}, status.InvalidArgument, "request 1: remote address"},
		{"local_addrs ends at PROT_NONE", func(t *testing.T, w *columnsWorld, c *cColumns) {
			c.Local, c.N = edge(w, uint64(w.buf)), 2
		}, status.InvalidArgument, "local_addrs"},
		{"lengths ends at PROT_NONE", func(t *testing.T, w *columnsWorld, c *cColumns) {
			c.Lengths, c.N = edge(w, 64), 2
		}, status.InvalidArgument, "lengths"},
		{"opts PROT_NONE", func(_ *testing.T, _ *columnsWorld, c *cColumns) { c.Opts = bad["PROT_NONE"] },
			status.InvalidArgument, "opts"},
	}
	for name, p := range bad {
		if name == "read-only" {
			continue // readable: zeros, which fail as addresses and lengths do
		}
		for _, col := range []string{"local_addrs", "remote_addrs", "lengths"} {
			cases = append(cases, columnsCase{fmt.Sprintf("%s %s", col, name), func(_ *testing.T, _ *columnsWorld, c *cColumns) {
				*map[string]*uintptr{"local_addrs": &c.Local, "remote_addrs": &c.Remote, "lengths": &c.Lengths}[col] = p
			}, status.InvalidArgument, col})
		}
	}
	return cases
}

// Every bad argument fails the call with its code and a message, before
// anything moves, with no batch made (batch_out set to NULL) and nothing
// left behind.
func TestTransferColumnsBadInput(t *testing.T) {
	// The other engine first, so that it outlives the world's handle checks.
	o, r := cEngineCreate(&cOptions{Transports: strp("local")})
	require.Equal(t, status.OK, r.Code, r.Msg)
	t.Cleanup(func() { require.Equal(t, status.OK, cEngineDestroy(o).Code) })
	oname, _, _ := cEngineName(o, 2048)
	foreignSeg, r := cSegmentOpen(o, oname)
	require.Equal(t, status.OK, r.Code, r.Msg)
	w := newColumnsWorld(t)
	src := w.bytes(0, 1<<15)
	for i := range src {
		src[i] = 7
	}
	out, freeOut := cMalloc(8)
	defer freeOut()
	sts, freeSts := cMalloc(16 * capitest.SizeofRequestStatus)
	defer freeSts()
	for _, tc := range columnsCases(t, foreignSeg) {
		for _, sync := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sync=%v", tc.name, sync), func(t *testing.T) {
				clear(w.bytes(1<<15, 1<<15))
				c := w.columns(t, opWrite, stridePlan(16, 0, 1<<15))
				tc.edit(t, w, &c)
				var r result
				if sync {
					r = cColumnsSyncRaw(w.e, c, sts)
				} else {
					require.NoError(t, writeValue(out, uint64(0xdead), "test"))
					r = cColumnsRaw(w.e, c, out)
					b, err := readValue[uint64](out, "test")
					require.NoError(t, err)
					require.Zero(t, b, "batch_out must be NULL when the call fails")
				}
				if tc.code != 0 {
					requireFail(t, tc.code, r)
				} else {
					require.NotEqual(t, status.OK, r.Code)
					require.NotEmpty(t, r.Msg)
				}
				require.Contains(t, r.Msg, tc.msg)
				require.Equal(t, make([]byte, 1<<15), w.bytes(1<<15, 1<<15), "a failed call moved data")
				w.requireIdle(t)
			})
		}
	}
}

// A request the target refuses (a remote range outside every region) is
// the request's outcome: the sync call returns it with the statuses
// written; the batch call makes a batch that reports it.
func TestTransferColumnsRemoteRefused(t *testing.T) {
	w := newColumnsWorld(t)
	p := stridePlan(4, 0, 1<<15)
	c := w.columns(t, opWrite, p)
	require.NoError(t, writeValue(c.Remote+16, uint64(w.buf)+columnsBufLen-8, "test"))
	sts, freeSts := cMalloc(4 * capitest.SizeofRequestStatus)
	defer freeSts()
	r := cColumnsSyncRaw(w.e, c, sts)
	require.NotEqual(t, status.OK, r.Code)
	require.NotEmpty(t, r.Msg)
	codes, _ := readStatuses(t, sts, 4)
	require.Equal(t, r.Code, codes[2], "the call returns the failed request's status")
	w.requireIdle(t)

	out, freeOut := cMalloc(8)
	defer freeOut()
	r = cColumnsRaw(w.e, c, out)
	b, err := readValue[uint64](out, "test")
	require.NoError(t, err)
	require.NotZero(t, b, "the batch was made: %v %s", r.Code, r.Msg)
	cBatchWait(b, 10000)
	r = cBatchStatusRaw(b, sts, 4)
	require.Equal(t, codes[2], r.Code, r.Msg)
	require.Equal(t, status.OK, cBatchDestroy(b).Code)
	w.requireIdle(t)
}

// Out-parameters are checked before anything moves: a bad batch_out or
// statuses_out fails with nothing made.
func TestTransferColumnsBadOut(t *testing.T) {
	w := newColumnsWorld(t)
	_, bad := badPages(t)
	bad["NULL"] = 0
	for name, p := range bad {
		t.Run(name, func(t *testing.T) {
			clear(w.bytes(1<<15, 1<<15))
			w.bytes(0, 1)[0] = 9
			c := w.columns(t, opWrite, stridePlan(1, 0, 1<<15))
			r := cColumnsRaw(w.e, c, p)
			requireFail(t, status.InvalidArgument, r)
			require.Contains(t, r.Msg, "batch_out")
			if p != 0 {
				r = cColumnsSyncRaw(w.e, c, p)
				requireFail(t, status.InvalidArgument, r)
				require.Contains(t, r.Msg, "statuses_out")
			}
			require.Zero(t, w.bytes(1<<15, 1)[0], "a failed call moved data")
			w.requireIdle(t)
		})
	}
}

// A stale engine handle, or an id that is no engine, is INVALID_HANDLE.
func TestTransferColumnsStaleEngine(t *testing.T) {
	w := newColumnsWorld(t)
	c := w.columns(t, opWrite, stridePlan(1, 0, 1<<15))
	gone, r := cEngineCreate(&cOptions{Transports: strp("local")})
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, status.OK, cEngineDestroy(gone).Code)
	out, freeOut := cMalloc(8)
	defer freeOut()
	for _, id := range []uint64{0, gone, w.reg, w.seg} {
		requireFail(t, status.InvalidHandle, cColumnsRaw(id, c, out))
		requireFail(t, status.InvalidHandle, cColumnsSyncRaw(id, c, 0))
	}
	w.requireIdle(t)
}

// A panic inside either export is TENT_ERR_INTERNAL with the stack, and
// the engine keeps working.
func TestTransferColumnsPanicBecomesInternal(t *testing.T) {
	w := newColumnsWorld(t)
	c := w.columns(t, opWrite, stridePlan(1, 0, 1<<15))
	out, freeOut := cMalloc(8)
	defer freeOut()
	bogus := lib.handles.Add(handles.Engine, 0, notAnEngine{})
	defer lib.handles.Remove(handles.Engine, bogus) //nolint:errcheck // test cleanup
	for name, f := range map[string]func() result{
		"tentgo_transfer_columns":      func() result { return cColumnsRaw(bogus, c, out) },
		"tentgo_transfer_columns_sync": func() result { return cColumnsSyncRaw(bogus, c, 0) },
	} {
		r := f()
		requireFail(t, status.Internal, r)
		require.Contains(t, r.Msg, "panic: interface conversion")
		require.Contains(t, r.Msg, "goroutine ", "the stack is in the message")
		require.Contains(t, r.Msg, name)
	}
	require.Equal(t, status.OK, cColumnsSyncRaw(w.e, c, 0).Code, "the engine still works after the panics")
}

// FuzzTransferColumns drives tent_transfer_columns_sync with columns of
// arbitrary words (addresses below 1 MiB are offsets into the registered
// buffer), any opcode and a segment that is the open one, a made-up
// handle or the fuzzed value: the answer is a documented code with a
// message, never INTERNAL or a crash, every status written is a known
// code, and nothing is left behind.
func FuzzTransferColumns(f *testing.F) {
	e, r := cEngineCreate(&cOptions{Transports: strp("local")})
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	f.Cleanup(func() { cEngineDestroy(e) })
	buf, free := cMalloc(1 << 16)
	f.Cleanup(free)
	reg, r := cRegister(e, buf, 1<<16, strp("cpu"), rw, true)
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	name, _, _ := cEngineName(e, 2048)
	seg, r := cSegmentOpen(e, name)
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	f.Cleanup(func() { cSegmentClose(e, seg); cUnregister(e, reg) })
	// Each request is three words: local, remote, length.
	words := func(v ...uint64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
		return b
	}
	f.Add(words(0, 4096, 64), uint32(opWrite), uint8(0), uint64(0), uint8(1))
	f.Add(words(8192, 0, 4096, 0, 12288, 16), uint32(opRead), uint8(0), uint64(0), uint8(2))
	f.Add(words(0, 0, 1), uint32(2), uint8(0), uint64(0), uint8(1))
	f.Add(words(0, 0, 0), uint32(opWrite), uint8(0), uint64(0), uint8(1))
	f.Add(words(^uint64(0)-8, ^uint64(0)-8, 64), uint32(opWrite), uint8(0), uint64(0), uint8(1))
	f.Add(words(0, 1<<16-8, 64), uint32(opRead), uint8(0), uint64(0), uint8(1))
	f.Add(words(0, 4096, 64), uint32(opWrite), uint8(2), uint64(12345), uint8(1))
	f.Add([]byte{1, 2, 3}, uint32(opWrite), uint8(1), uint64(0), uint8(3))
	allowed := map[status.Code]bool{status.OK: true, status.InvalidArgument: true, status.InvalidHandle: true,
		status.NotRegistered: true, status.OutOfRange: true, status.PermissionDenied: true, status.Overlap: true}
	f.Fuzz(func(t *testing.T, raw []byte, op uint32, segMode uint8, segValue uint64, n uint8) {
		if n == 0 || n > 8 {
			n = 1
		}
		in := make([]byte, 24*int(n))
		copy(in, raw)
		cols := [3][]uint64{}
		for i := 0; i < int(n); i++ {
			for k := range cols {
				v := binary.LittleEndian.Uint64(in[24*i+8*k:])
				if k < 2 && v < 1<<20 {
					v += uint64(buf)
				}
				cols[k] = append(cols[k], v)
			}
		}
		c := cColumns{Op: op, Local: cWords(t, cols[0]), Remote: cWords(t, cols[1]), Lengths: cWords(t, cols[2]),
			N: uint64(n)}
		switch segMode % 3 {
		case 0:
			c.Segment = seg
		case 1:
			c.Segment = seg + uint64(segMode)
		default:
			c.Segment = segValue
		}
		sts, freeSts := cMalloc(int(n) * capitest.SizeofRequestStatus)
		defer freeSts()
		stsBytes := bytesAt(sts, uint64(int(n)*capitest.SizeofRequestStatus))
		for i := range stsBytes {
			stsBytes[i] = 0xee
		}
		got := cColumnsSyncRaw(e, c, sts)
		if !allowed[got.Code] {
			t.Fatalf("transfer_columns_sync = %v: %s", got.Code, got.Msg)
		}
		if got.Code != status.OK && got.Msg == "" {
			t.Fatal("failure without a message")
		}
		if stsBytes[0] != 0xee { // written: the requests were submitted
			codes, _ := readStatuses(t, sts, int(n))
			for i, c := range codes {
				if _, known := status.Lookup(c); !known || c == status.Pending || c == status.Internal {
					t.Fatalf("request %d finished with status %d", i, c)
				}
			}
		}
		if s, _ := cStats(e, 0); s.Batches != 0 || s.RequestsInFlight != 0 || s.Regions != 1 {
			t.Fatalf("state left behind: %+v", s)
		}
	})
}
