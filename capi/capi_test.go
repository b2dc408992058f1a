package main

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

const rw = 3 // TENT_REMOTE_READ | TENT_REMOTE_WRITE

// fakes records every fake transport the "fake" factory made, so tests can
// inject faults into the one inside an engine created through C.
var (
	fakesMu   sync.Mutex
	fakes     []*coretest.Fake
	fakeFault func(*coretest.Fake) // applied to the next fakes made
)

func setFakeFault(f func(*coretest.Fake)) {
	fakesMu.Lock()
	fakeFault = f
	fakesMu.Unlock()
}

func lastFake() *coretest.Fake {
	fakesMu.Lock()
	defer fakesMu.Unlock()
	return fakes[len(fakes)-1]
}

func TestMain(m *testing.M) {
	// The tests' library offers a fault-injecting fake beside the
	// built-in transports, driven through the C path.
	fake := core.TransportSpec{Name: "fake", ID: 100, Rank: 100, New: func() core.Transport {
		f := coretest.NewFake("fake")
		fakesMu.Lock()
		if fakeFault != nil {
			fakeFault(f)
		}
		fakes = append(fakes, f)
		fakesMu.Unlock()
		return f
	}}
	lib = newLibrary(func(tcpStreams uint32) []core.TransportSpec {
		return append(builtinTransports(tcpStreams), fake)
	})
	code := m.Run()
	if n := lib.handles.Len(); code == 0 && n != 0 {
		fmt.Fprintf(os.Stderr, "leak: %d handles are still in the table after the tests\n", n)
		code = 1
	}
	os.Exit(code)
}

// newEngine creates an engine through C with the fake transport and checks
// at cleanup that destroying it releases every handle.
func newEngine(t *testing.T) (uint64, *coretest.Fake) {
	t.Helper()
	e, r := cEngineCreate(&cOptions{Transports: strp("fake"), UnregisterTimeoutMs: 200})
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Empty(t, r.Msg)
	f := lastFake()
	t.Cleanup(func() {
		// Destroy may already have happened in the test: OK or INVALID_HANDLE.
		r := cEngineDestroy(e)
		require.Contains(t, []status.Code{status.OK, status.InvalidHandle}, r.Code, r.Msg)
		require.Zero(t, lib.handles.CountChildren(e), "handles of the engine outlived it")
		_, err := lib.handles.Get(handles.Engine, e)
		require.Error(t, err)
		require.Empty(t, f.Misuse())
		require.Zero(t, f.Registered())
	})
	return e, f
}

// requireStats checks the engine's counts through tent_engine_stats.
func requireStats(t *testing.T, e uint64, regions, bytes uint64) {
	t.Helper()
	s, r := cStats(e, 0)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, regions, s.Regions, "regions")
	require.Equal(t, bytes, s.RegisteredBytes, "registered bytes")
	require.Zero(t, s.Reservations, "reservation leaked")
	require.Equal(t, regions, s.Handles, "handles")
}

// requireFail checks a failure: its code and a non-empty message.
func requireFail(t *testing.T, want status.Code, r result) {
	t.Helper()
	require.Equal(t, want, r.Code, "message: %s", r.Msg)
	require.NotEmpty(t, r.Msg, "failure without a message")
}

func TestStatusStrMatchesTable(t *testing.T) {
	for _, e := range status.Table {
		require.Equal(t, e.Text, cStatusStr(e.Code), e.Name)
	}
	known := map[status.Code]bool{}
	for _, e := range status.Table {
		known[e.Code] = true
	}
	for c := status.Code(-200); c <= 200; c++ {
		if !known[c] {
			require.Equal(t, "unknown status", cStatusStr(c), "code %d", c)
		}
	}
	require.Equal(t, "unknown status", cStatusStr(-1<<31))
	require.Equal(t, "unknown status", cStatusStr(1<<31-1))
}

var defineRe = regexp.MustCompile(`(?m)^#define\s+(TENT_\w+)\s+\(?(-?\w+?)u?\)?\s*(?:/\*.*)?$`)

// headerDefines returns the header's simple numeric #defines.
func headerDefines(t *testing.T) map[string]int64 {
	t.Helper()
	src, err := os.ReadFile("../include/tent.h")
	require.NoError(t, err)
	out := map[string]int64{}
	for _, m := range defineRe.FindAllStringSubmatch(string(src), -1) {
		if v, err := strconv.ParseInt(m[2], 0, 64); err == nil {
			out[m[1]] = v
		}
	}
	return out
}

func TestHeaderStatusMacrosMatchTable(t *testing.T) {
	defs := headerDefines(t)
	inHeader := map[string]int64{}
	for name, v := range defs {
		if name == "TENT_OK" || name == "TENT_PENDING" || strings.HasPrefix(name, "TENT_ERR_") {
			inHeader[name] = v
		}
	}
	require.NotEmpty(t, inHeader)
	inTable := map[string]int64{}
	for _, e := range status.Table {
		inTable["TENT_"+e.Name] = int64(e.Code)
	}
	require.Equal(t, inTable, inHeader, "include/tent.h status macros and status.Table differ")
}

func TestVersion(t *testing.T) {
	defs := headerDefines(t)
	v, abi, s := cVersion()
	maj, min, pat := defs["TENT_VERSION_MAJOR"], defs["TENT_VERSION_MINOR"], defs["TENT_VERSION_PATCH"]
	require.Equal(t, uint32(maj<<16|min<<8|pat), v)
	require.Equal(t, uint32(defs["TENT_ABI_VERSION"]), abi)
	require.Equal(t, fmt.Sprintf("%d.%d.%d", maj, min, pat), s)
}

func TestTransportNames(t *testing.T) {
	defs := headerDefines(t)
	for name, v := range defs {
		if strings.HasPrefix(name, "TENT_TRANSPORT_") {
			require.Equal(t, strings.ToLower(strings.TrimPrefix(name, "TENT_TRANSPORT_")), cTransportName(uint32(v)))
		}
	}
	require.Equal(t, "unknown", cTransportName(99))
}

func TestEngineOptionsMapping(t *testing.T) {
	o, err := mapOptions(nil)
	require.NoError(t, err)
	available := o.Available
	o.Available = nil
	require.Equal(t, core.Options{}, o, "NULL options are the core's defaults")
	names := make([]string, len(available))
	for i, s := range available {
		names[i] = s.Name
	}
	require.Subset(t, names, []string{"local", "cuda", "shm", "tcp"}, "NULL options offer every built-in transport")

	o, err = mapOptions(&cOptions{
		Name: strp("eng"), ListenAddr: strp("127.0.0.1:0"), Metadata: strp("etcd://h1:2379,h2:2379"),
		Prefix: strp("/p"), Transports: strp(" local, shm ,tcp"), Secret: []byte("s3cret\x00x"),
		TimeoutMs: 1500, UnregisterTimeoutMs: 20, TCPStreams: 8,
	})
	require.NoError(t, err)
	require.Equal(t, "eng", o.Name)
	require.Equal(t, "127.0.0.1:0", o.ListenAddr)
	require.Equal(t, "etcd://h1:2379,h2:2379", o.Metadata)
	require.Equal(t, "/p", o.MetadataPrefix)
	require.Equal(t, []string{"local", "shm", "tcp"}, o.Transports)
	require.Equal(t, []byte("s3cret\x00x"), o.Secret, "secret bytes copied, NUL included")
	require.Equal(t, "1.5s", o.DefaultTimeout.String())
	require.Equal(t, "20ms", o.UnregisterTimeout.String())
	i := slices.IndexFunc(o.Available, func(s core.TransportSpec) bool { return s.Name == tcp.Name })
	require.GreaterOrEqual(t, i, 0, "tcp is available")
	tr, ok := o.Available[i].New().(*tcp.Transport)
	require.True(t, ok)
	require.Equal(t, 8, tr.Options().Streams, "tcp_streams reaches the tcp transport's options")

	u64 := func(v uint64) *uint64 { return &v }
	bad := []struct {
		name string
		o    cOptions
		code status.Code
	}{
		{"size too small", cOptions{Size: 8}, status.InvalidArgument},
		{"size one short", cOptions{Size: uint32(sizeofOptions) - 1}, status.InvalidArgument},
		{"size garbage", cOptions{Size: 1 << 20}, status.InvalidArgument},
		{"reserved0", cOptions{Reserved0: 1}, status.InvalidArgument},
		{"reserved1", cOptions{Reserved1: 7}, status.InvalidArgument},
		{"empty name", cOptions{Name: strp("")}, status.InvalidArgument},
		{"empty listen_addr", cOptions{ListenAddr: strp("")}, status.InvalidArgument},
		{"bad metadata", cOptions{Metadata: strp("zk://x")}, status.InvalidArgument},
		{"etcd without hosts", cOptions{Metadata: strp("etcd://")}, status.InvalidArgument},
		{"empty transports", cOptions{Transports: strp("")}, status.InvalidArgument},
		{"blank transports", cOptions{Transports: strp("  ")}, status.InvalidArgument},
		{"empty transport entry", cOptions{Transports: strp("fake,,x")}, status.InvalidArgument},
		{"trailing comma", cOptions{Transports: strp("fake,")}, status.InvalidArgument},
		{"NULL secret with length", cOptions{NullSecret: true, Secret: []byte("abc")}, status.InvalidArgument},
		{"secret with zero length", cOptions{Secret: []byte("abc"), SecretLen: u64(0)}, status.InvalidArgument},
		{"secret too long", cOptions{Secret: make([]byte, maxSecretLen+1)}, status.InvalidArgument},
		{"timeout overflows", cOptions{TimeoutMs: 1 << 62}, status.InvalidArgument},
		{"unregister timeout overflows", cOptions{UnregisterTimeoutMs: ^uint64(0)}, status.InvalidArgument},
		{"too many tcp streams", cOptions{TCPStreams: maxTCPStreams + 1}, status.InvalidArgument},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			if o.Secret != nil && o.Secret[0] == 0 {
				o.Secret[0] = 1
			}
			_, err := mapOptions(&o)
			require.Error(t, err)
			require.Equal(t, tc.code, status.CodeOf(err), err.Error())

			base := lib.handles.Len()
			_, r := cEngineCreate(&o)
			requireFail(t, tc.code, r)
			require.Equal(t, base, lib.handles.Len())
		})
	}
}

func TestEngineCreate(t *testing.T) {
	base := lib.handles.Len()
	_, r := cEngineCreateOut(nil, true)
	requireFail(t, status.InvalidArgument, r)

	e, r := cEngineCreate(nil)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, base+1, lib.handles.Len())
	require.Equal(t, status.OK, cEngineDestroy(e).Code)

	// Transports the core does not know, or lists twice.
	_, r = cEngineCreate(&cOptions{Transports: strp("fake,nosuch")})
	requireFail(t, status.NotFound, r)
	_, r = cEngineCreate(&cOptions{Transports: strp("fake, fake")})
	requireFail(t, status.InvalidArgument, r)

	// A newer caller's larger struct: fine while the unknown tail is zero.
	require.Equal(t, status.OK, cEngineCreateWithTail(uint32(sizeofOptions)+16, -1, 0).Code)
	requireFail(t, status.InvalidArgument, cEngineCreateWithTail(uint32(sizeofOptions)+16, int(sizeofOptions)+3, 1))
	require.Equal(t, base, lib.handles.Len())

	// A transport that fails (or panics) to install fails the create.
	for _, fault := range []func(*coretest.Fake){
		func(f *coretest.Fake) { f.FailAt(coretest.MethodInstall, 1, coretest.ErrInjected) },
		func(f *coretest.Fake) { f.PanicAt(coretest.MethodInstall, 1) },
	} {
		setFakeFault(fault)
		_, r = cEngineCreate(&cOptions{Transports: strp("fake")})
		setFakeFault(nil)
		require.Contains(t, []status.Code{status.TransportError, status.Internal}, r.Code, r.Msg)
		require.NotEmpty(t, r.Msg)
		require.Equal(t, base, lib.handles.Len())
	}
}

func TestEngineNameAndBuffers(t *testing.T) {
	e, r := cEngineCreate(&cOptions{Name: strp("node-a"), Transports: strp("fake")})
	require.Equal(t, status.OK, r.Code, r.Msg)
	defer cEngineDestroy(e)

	s, n, r := cEngineName(e, 64)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, "node-a", s)
	require.EqualValues(t, 6, n)

	// Size query: NULL buffer, cap 0.
	_, n, r = cEngineName(e, 0)
	requireFail(t, status.BufferTooSmall, r)
	require.EqualValues(t, 6, n)
	// Exactly the length: no room for the NUL.
	_, n, r = cEngineName(e, 6)
	requireFail(t, status.BufferTooSmall, r)
	require.EqualValues(t, 6, n)
	s, _, r = cEngineName(e, 7)
	require.Equal(t, status.OK, r.Code)
	require.Equal(t, "node-a", s)
	// NULL buffer with a capacity.
	_, n, r = cEngineName(e, -10)
	requireFail(t, status.InvalidArgument, r)
	require.EqualValues(t, 12345, n, "len_out untouched on INVALID_ARGUMENT")

	_, _, r = cEngineName(0, 64)
	requireFail(t, status.InvalidHandle, r)

	// Without a name, the listener's address.
	e2, _ := newEngine(t)
	s, _, r = cEngineName(e2, 64)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Regexp(t, `^127\.0\.0\.1:[0-9]+$`, s)
}

func TestStatsJSONAndTopology(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(4096)
	defer free()
	_, r := cRegister(e, buf, 4096, nil, rw, true)
	require.Equal(t, status.OK, r.Code, r.Msg)

	js, n, r := cStatsJSON(e, 4096)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.EqualValues(t, len(js), n)
	var got engineStats
	require.NoError(t, json.Unmarshal([]byte(js), &got))
	require.EqualValues(t, 1, got.Regions)
	require.EqualValues(t, 4096, got.RegisteredBytes)
	require.EqualValues(t, 1, got.Handles)
	require.EqualValues(t, lib.handles.Len(), got.ProcessHandles)
	require.Contains(t, got.Transports, "fake")
	require.EqualValues(t, 1, got.Transports["fake"]["regions"])
	var raw struct {
		Listeners map[string]map[string]any `json:"listeners"`
	}
	require.NoError(t, json.Unmarshal([]byte(js), &raw))
	require.Contains(t, raw.Listeners, "engine")
	for _, k := range []string{"accepted", "accept_errors", "last_accept_error", "unauthenticated", "authenticated",
		"handshake_failures", "handshake_timeouts", "evicted", "peer_rejected", "live", "refused"} {
		require.Contains(t, raw.Listeners["engine"], k)
	}

	_, need, r := cStatsJSON(e, 0)
	requireFail(t, status.BufferTooSmall, r)
	require.EqualValues(t, len(js), need)

	topo, _, r := cTopologyJSON(4096)
	require.Equal(t, status.OK, r.Code, r.Msg)
	var tp map[string]any
	require.NoError(t, json.Unmarshal([]byte(topo), &tp))
	require.Equal(t, []any{}, tp["gpus"])
	require.NotEmpty(t, tp["reason"])
	_, _, r = cTopologyJSON(3)
	requireFail(t, status.BufferTooSmall, r)
}

func TestStatsStructSize(t *testing.T) {
	e, _ := newEngine(t)
	s, r := cStats(e, 8)
	requireFail(t, status.InvalidArgument, r)
	require.EqualValues(t, 777, s.Regions, "out untouched on failure")
	_, r = cStats(e, 100000)
	requireFail(t, status.InvalidArgument, r)
	_, r = cStats(0, 0)
	requireFail(t, status.InvalidHandle, r)
	s, r = cStats(e, 0)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Zero(t, s.Regions)
	require.EqualValues(t, lib.handles.Len(), s.ProcessHandles)
}

func TestRegisterMisuse(t *testing.T) {
	e, _ := newEngine(t)
	e2, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	reg, r := cRegister(e, buf, 4096, strp("cpu"), rw, true)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Empty(t, r.Msg, "last error is empty after a success")
	base := lib.handles.Len()

	tests := []struct {
		name string
		call func() result
		code status.Code
	}{
		{"NULL engine", func() result { _, r := cRegister(0, buf+8192, 16, nil, rw, true); return r }, status.InvalidHandle},
		{"unknown engine", func() result { _, r := cRegister(1<<40, buf+8192, 16, nil, rw, true); return r }, status.InvalidHandle},
		{"region as engine", func() result { _, r := cRegister(reg, buf+8192, 16, nil, rw, true); return r }, status.InvalidHandle},
		{"NULL region_out", func() result { _, r := cRegister(e, buf+8192, 16, nil, rw, false); return r }, status.InvalidArgument},
		{"NULL addr", func() result { _, r := cRegister(e, 0, 16, nil, rw, true); return r }, status.InvalidArgument},
		{"zero length", func() result { _, r := cRegister(e, buf+8192, 0, nil, rw, true); return r }, status.InvalidArgument},
		{"overflow", func() result { _, r := cRegister(e, buf+8192, ^uint64(0), nil, rw, true); return r }, status.InvalidArgument},
		{"unknown flags", func() result { _, r := cRegister(e, buf+8192, 16, nil, 0x4, true); return r }, status.InvalidArgument},
		{"empty location", func() result { _, r := cRegister(e, buf+8192, 16, strp(""), rw, true); return r }, status.InvalidArgument},
		{"bad location", func() result { _, r := cRegister(e, buf+8192, 16, strp("tpu:0"), rw, true); return r }, status.InvalidArgument},
		{"bad device", func() result { _, r := cRegister(e, buf+8192, 16, strp("cuda:-1"), rw, true); return r }, status.InvalidArgument},
		{"overlap", func() result { _, r := cRegister(e, buf+4095, 2, nil, rw, true); return r }, status.Overlap},
		{"exact duplicate", func() result { _, r := cRegister(e, buf, 4096, nil, rw, true); return r }, status.AlreadyRegistered},
		{"info: region of another engine", func() result { _, r := cRegionInfo(e2, reg, 0); return r }, status.InvalidHandle},
		{"info: engine as region", func() result { _, r := cRegionInfo(e, e, 0); return r }, status.InvalidHandle},
		{"info: NULL region", func() result { _, r := cRegionInfo(e, 0, 0); return r }, status.InvalidHandle},
		{"info: size too small", func() result { _, r := cRegionInfo(e, reg, 4); return r }, status.InvalidArgument},
		{"unregister: region of another engine", func() result { return cUnregister(e2, reg) }, status.InvalidHandle},
		{"unregister: engine as region", func() result { return cUnregister(e, e2) }, status.InvalidHandle},
		{"unregister: NULL engine", func() result { return cUnregister(0, reg) }, status.InvalidHandle},
		{"uninstall: unknown", func() result { return cUninstall(e, strp("tcp")) }, status.NotFound},
		{"uninstall: empty name", func() result { return cUninstall(e, strp("")) }, status.NotFound},
		{"destroy: region as engine", func() result { return cEngineDestroy(reg) }, status.InvalidHandle},
		{"destroy: unknown", func() result { return cEngineDestroy(1 << 50) }, status.InvalidHandle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireFail(t, tc.code, tc.call())
			requireStats(t, e, 1, 4096)
			requireStats(t, e2, 0, 0)
			require.Equal(t, base, lib.handles.Len())
		})
	}

	info, r := cRegionInfo(e, reg, 0)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Equal(t, regionInfo{Size: 56, Flags: rw, Addr: uint64(buf), Len: 4096, Location: "cpu", Tail: []byte{}}, info)
	// A newer caller's larger struct is filled up to what this library
	// knows, and the rest is zeroed: its fields read "not set".
	info, r = cRegionInfo(e, reg, 200)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.EqualValues(t, 200, info.Size)
	require.Equal(t, "cpu", info.Location)
	require.Equal(t, make([]byte, 200-56), info.Tail)

	// Unregister, twice, and a NULL region.
	require.Equal(t, status.OK, cUnregister(e, 0).Code, "NULL region is a no-op")
	require.Equal(t, status.OK, cUnregister(e, reg).Code)
	requireFail(t, status.InvalidHandle, cUnregister(e, reg))
	_, r = cRegionInfo(e, reg, 0)
	requireFail(t, status.InvalidHandle, r)
	requireStats(t, e, 0, 0)
	require.Equal(t, base-1, lib.handles.Len())

	// The same memory registers again, with a new, different handle.
	reg2, r := cRegister(e, buf, 4096, nil, rw, true)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.NotEqual(t, reg, reg2, "handles are never reused")
	info, _ = cRegionInfo(e, reg2, 0)
	require.Equal(t, "cpu", info.Location, "NULL location detects host memory")
}

func TestBatches(t *testing.T) {
	e, f := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	a := func(off uintptr) uintptr { return buf + off }

	_, r := cRegisterBatch(e, nil, nil, rw)
	requireFail(t, status.InvalidArgument, r)
	_, r = cRegisterBatch(e, []uintptr{a(0), a(0)}, []uint64{64, 64}, rw)
	requireFail(t, status.InvalidArgument, r)
	_, r = cRegisterBatch(e, []uintptr{a(0), a(32)}, []uint64{64, 64}, rw)
	requireFail(t, status.InvalidArgument, r)
	_, r = cRegisterBatch(e, []uintptr{a(0), 0}, []uint64{64, 64}, rw)
	requireFail(t, status.InvalidArgument, r)
	require.Contains(t, r.Msg, "entry 1")
	requireFail(t, status.InvalidArgument, cRegisterBatchRaw(e, 0, 3, false))
	requireFail(t, status.InvalidArgument, cRegisterBatchRaw(e, buf, 1<<62, true))
	requireStats(t, e, 0, 0)

	ids, r := cRegisterBatch(e, []uintptr{a(0), a(64), a(4096)}, []uint64{64, 64, 4096}, rw)
	require.Equal(t, status.OK, r.Code, r.Msg)
	require.Len(t, ids, 3)
	requireStats(t, e, 3, 4224)

	// All or none: one overlap fails the whole batch.
	_, r = cRegisterBatch(e, []uintptr{a(20000), a(4100)}, []uint64{64, 8}, rw)
	requireFail(t, status.Overlap, r)
	requireStats(t, e, 3, 4224)
	// A transport failure rolls the batch back.
	f.FailAt(coretest.MethodRegister, f.Calls(coretest.MethodRegister)+1, coretest.ErrInjected)
	_, r = cRegisterBatch(e, []uintptr{a(20000), a(30000)}, []uint64{64, 64}, rw)
	requireFail(t, status.TransportError, r)
	requireStats(t, e, 3, 4224)
	// A transport panic too: the core turns it into INTERNAL with a stack.
	f.PanicAt(coretest.MethodRegister, f.Calls(coretest.MethodRegister)+1)
	_, r = cRegister(e, a(20000), 64, nil, rw, true)
	requireFail(t, status.Internal, r)
	require.Contains(t, r.Msg, "goroutine")
	requireStats(t, e, 3, 4224)

	requireFail(t, status.InvalidArgument, cUnregisterBatch(e, nil))
	requireFail(t, status.InvalidArgument, cUnregisterBatch(e, []uint64{ids[0], ids[1], ids[0]}))
	requireFail(t, status.InvalidHandle, cUnregisterBatch(e, []uint64{ids[0], 0}))
	requireFail(t, status.InvalidHandle, cUnregisterBatch(e, []uint64{ids[0], e}))
	requireFail(t, status.InvalidHandle, cUnregisterBatch(e, []uint64{ids[0], 1 << 40}))
	requireFail(t, status.InvalidArgument, cUnregisterBatchRaw(e, 0, 2))
	requireFail(t, status.InvalidArgument, cUnregisterBatchRaw(e, buf, 1<<61))
	requireStats(t, e, 3, 4224)

	require.Equal(t, status.OK, cUnregisterBatch(e, ids[:2]).Code)
	requireStats(t, e, 1, 4096)
	requireFail(t, status.InvalidHandle, cUnregisterBatch(e, ids[1:])) // a stale entry fails the batch
	requireStats(t, e, 1, 4096)
	require.Equal(t, status.OK, cUnregisterBatch(e, ids[2:]).Code)
	requireStats(t, e, 0, 0)
}

func TestDestroyInvalidatesChildren(t *testing.T) {
	base := lib.handles.Len()
	e, r := cEngineCreate(&cOptions{Transports: strp("fake")})
	require.Equal(t, status.OK, r.Code, r.Msg)
	f := lastFake()
	buf, free := cMalloc(1 << 16)
	defer free()
	var regs []uint64
	for i := uintptr(0); i < 8; i++ {
		id, r := cRegister(e, buf+i*1024, 1024, nil, rw, true)
		require.Equal(t, status.OK, r.Code, r.Msg)
		regs = append(regs, id)
	}
	require.Equal(t, base+9, lib.handles.Len())
	require.Equal(t, status.OK, cEngineDestroy(e).Code)
	require.Equal(t, base, lib.handles.Len())
	requireFail(t, status.InvalidHandle, cEngineDestroy(e))
	requireFail(t, status.InvalidHandle, cUnregister(e, regs[0]))
	_, r = cRegionInfo(e, regs[0], 0)
	requireFail(t, status.InvalidHandle, r)
	require.Zero(t, f.Registered())
	require.Empty(t, f.Misuse())
	require.Equal(t, 1, f.Calls(coretest.MethodUninstall))

	// Regions of a destroyed engine are stale for a new engine too.
	e2, _ := newEngine(t)
	requireFail(t, status.InvalidHandle, cUnregister(e2, regs[1]))
	require.Equal(t, status.OK, cEngineDestroy(0).Code, "destroy(NULL) is a no-op")
}

func TestUninstall(t *testing.T) {
	e, f := newEngine(t)
	require.Equal(t, status.OK, cUninstall(e, strp("fake")).Code)
	requireFail(t, status.NotFound, cUninstall(e, strp("fake")))
	require.Equal(t, status.OK, cUninstall(e, nil).Code, "uninstalling all of none")
	require.Equal(t, 1, f.Calls(coretest.MethodUninstall))
	requireFail(t, status.InvalidHandle, cUninstall(0, nil))
}

// tent_engine_transports lists the installed transports in the order
// asked for, in the format the transports option takes, and follows
// uninstalls.
func TestEngineTransports(t *testing.T) {
	for _, asked := range []string{"fake,local", "local,fake"} {
		e, r := cEngineCreate(&cOptions{Transports: strp(asked)})
		require.Equal(t, status.OK, r.Code, r.Msg)
		s, n, r := cEngineTransports(e, 64)
		require.Equal(t, status.OK, r.Code, r.Msg)
		require.Equal(t, asked, s)
		require.EqualValues(t, len(asked), n)
		_, n, r = cEngineTransports(e, 0)
		requireFail(t, status.BufferTooSmall, r)
		require.EqualValues(t, len(asked), n)

		e2, r := cEngineCreate(&cOptions{Transports: strp(s)})
		require.Equal(t, status.OK, r.Code, "the list is a valid transports option: %s", r.Msg)
		s2, _, _ := cEngineTransports(e2, 64)
		require.Equal(t, s, s2)
		require.Equal(t, status.OK, cEngineDestroy(e2).Code)

		require.Equal(t, status.OK, cUninstall(e, strp("fake")).Code)
		s, _, r = cEngineTransports(e, 64)
		require.Equal(t, status.OK, r.Code, r.Msg)
		require.Equal(t, "local", s)
		require.Equal(t, status.OK, cUninstall(e, nil).Code)
		s, n, r = cEngineTransports(e, 64)
		require.Equal(t, status.OK, r.Code, r.Msg)
		require.Equal(t, "", s)
		require.Zero(t, n)
		require.Equal(t, status.OK, cEngineDestroy(e).Code)
		_, _, r = cEngineTransports(e, 64)
		requireFail(t, status.InvalidHandle, r)
	}
}

// exportCalls calls every export once with arguments that would succeed.
func exportCalls(e, reg uint64, buf uintptr) map[string]func() result {
	return map[string]func() result{
		"engine_create":     func() result { _, r := cEngineCreate(nil); return r },
		"engine_destroy":    func() result { return cEngineDestroy(e) },
		"engine_name":       func() result { _, _, r := cEngineName(e, 64); return r },
		"register":          func() result { _, r := cRegister(e, buf+8192, 16, nil, rw, true); return r },
		"register_batch":    func() result { _, r := cRegisterBatch(e, []uintptr{buf + 8192}, []uint64{16}, rw); return r },
		"unregister":        func() result { return cUnregister(e, reg) },
		"unregister_batch":  func() result { return cUnregisterBatch(e, []uint64{reg}) },
		"region_get_info":   func() result { _, r := cRegionInfo(e, reg, 0); return r },
		"uninstall":         func() result { return cUninstall(e, nil) },
		"engine_stats":      func() result { _, r := cStats(e, 0); return r },
		"engine_stats_json": func() result { _, _, r := cStatsJSON(e, 4096); return r },
		"engine_transports": func() result { _, _, r := cEngineTransports(e, 64); return r },
		"topology_json":     func() result { _, _, r := cTopologyJSON(4096); return r },
	}
}

// notAnEngine, put in the handle table under the engine kind, makes the
// engine lookup of every export that takes an engine panic: the tests
// reach each export's panic recovery through it, with no hook in the
// library.
type notAnEngine struct{}

// A panic inside an export becomes TENT_ERR_INTERNAL with the stack in the
// message, and the engine keeps working.
func TestPanicBecomesInternal(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	reg, r := cRegister(e, buf, 4096, nil, rw, true)
	require.Equal(t, status.OK, r.Code, r.Msg)
	base := lib.handles.Len()

	for name := range exportCalls(0, 0, 0) {
		if name == "engine_create" || name == "topology_json" {
			continue // no engine to look up: TestEveryExportRecoversFirst covers them
		}
		t.Run(name, func(t *testing.T) {
			bogus := lib.handles.Add(handles.Engine, 0, notAnEngine{})
			defer lib.handles.Remove(handles.Engine, bogus) //nolint:errcheck // engine_destroy removes it first
			r := exportCalls(bogus, reg, buf)[name]()
			requireFail(t, status.Internal, r)
			require.Contains(t, r.Msg, "panic: interface conversion")
			require.Contains(t, r.Msg, "goroutine ", "the stack is in the message")
			require.Contains(t, r.Msg, "tentgo_"+name)
		})
	}
	requireStats(t, e, 1, 4096)
	require.Equal(t, base, lib.handles.Len())
	_, r = cRegionInfo(e, reg, 0)
	require.Equal(t, status.OK, r.Code, "the engine still works after the panics")
}

// isExport tells whether fd carries cgo's //export directive.
func isExport(fd *ast.FuncDecl) bool {
	if fd.Doc == nil {
		return false
	}
	for _, c := range fd.Doc.List {
		if c.Text == "//export "+fd.Name.Name {
			return true
		}
	}
	return false
}

// Every export defers recoverStatus as its first statement, so neither a
// panic nor a fault on a caller's pointer ever unwinds into C; and every
// export shim.c calls is checked.
func TestEveryExportRecoversFirst(t *testing.T) {
	const want = "defer recoverStatus(&st, debug.SetPanicOnFault(true))"
	// tent_log_get_level cannot report a status: it recovers to TENT_LOG_OFF.
	const ownRecovery = "tentgo_log_get_level"
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !isExport(fd) {
				continue
			}
			seen[fd.Name.Name] = true
			if fd.Name.Name == ownRecovery {
				continue
			}
			require.NotEmpty(t, fd.Body.List, fd.Name.Name)
			var first strings.Builder
			require.NoError(t, printer.Fprint(&first, fset, fd.Body.List[0]))
			require.Equal(t, want, first.String(), "%s (%s) must start with the recovery", fd.Name.Name, name)
		}
	}
	shim, err := os.ReadFile("shim.c")
	require.NoError(t, err)
	calls := regexp.MustCompile(`return (tentgo_\w+)\(`).FindAllStringSubmatch(string(shim), -1)
	require.NotEmpty(t, calls)
	for _, c := range calls {
		require.True(t, seen[c[1]], "shim.c calls %s, which is not an //export checked here", c[1])
	}
}

func TestBadPointersFailCleanly(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	page, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	require.NoError(t, err)
	defer syscall.Munmap(page)
	bad := uintptr(unsafeAddr(page))

	r := cRegisterRawLoc(e, buf, 64, bad)
	requireFail(t, status.InvalidArgument, r)
	require.Contains(t, r.Msg, "invalid memory")
	requireFail(t, status.InvalidArgument, cRegisterBatchRaw(e, bad, 2, false))
	requireFail(t, status.InvalidArgument, cUnregisterBatchRaw(e, bad, 2))
	requireStats(t, e, 0, 0)
	_, r = cRegister(e, buf, 64, nil, rw, true)
	require.Equal(t, status.OK, r.Code, "the engine still works after the faults")
}

func TestLastErrorBuffer(t *testing.T) {
	big := strings.Repeat("x", 200000)
	got := cSetErrorAndRead(big)
	require.Len(t, got, 64*1024, "truncated to TENTSHIM_MAX_ERROR")
	require.Equal(t, "short", cSetErrorAndRead("short"))
	// A success clears it (on the same thread: call locks it).
	e, r := cEngineCreate(nil)
	require.Equal(t, status.OK, r.Code)
	require.Empty(t, r.Msg)
	requireFail(t, status.InvalidHandle, cEngineDestroy(1<<45))
	r = cEngineDestroy(e)
	require.Equal(t, status.OK, r.Code)
	require.Empty(t, r.Msg)
}

func TestConcurrentUnregisterOneWinner(t *testing.T) {
	e, _ := newEngine(t)
	buf, free := cMalloc(1 << 16)
	defer free()
	for round := 0; round < 50; round++ {
		reg, r := cRegister(e, buf, 4096, nil, rw, true)
		require.Equal(t, status.OK, r.Code, r.Msg)
		var wg sync.WaitGroup
		codes := make([]status.Code, 4)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i] = cUnregister(e, reg).Code
			}()
		}
		wg.Wait()
		oks := 0
		for _, c := range codes {
			if c == status.OK {
				oks++
			} else {
				require.Contains(t, []status.Code{status.InvalidHandle, status.Busy}, c)
			}
		}
		require.Equal(t, 1, oks, "exactly one unregister wins: %v", codes)
		requireStats(t, e, 0, 0)
	}
}

func TestDestroyRacingRegistrations(t *testing.T) {
	base := lib.handles.Len()
	buf, free := cMalloc(1 << 20)
	defer free()
	for round := 0; round < 20; round++ {
		e, r := cEngineCreate(&cOptions{Transports: strp("fake")})
		require.Equal(t, status.OK, r.Code, r.Msg)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					off := uintptr(g*50+i) * 1024
					_, r := cRegister(e, buf+off, 1024, nil, rw, true)
					if r.Code != status.OK && r.Code != status.InvalidHandle && r.Code != status.Closed {
						t.Errorf("register during destroy: %v %s", r.Code, r.Msg)
					}
				}
			}()
		}
		r = cEngineDestroy(e)
		require.Equal(t, status.OK, r.Code, r.Msg)
		wg.Wait()
		require.Equal(t, base, lib.handles.Len(), "a handle outlived its engine")
	}
}
