// Package plugin_test proves that a transport plugs into core without
// core naming it: the toy transport below lives outside core, declares its
// own id, rank and channel kind in a core.TransportSpec, and moves data
// between two engines over the engine's listener.
package plugin_test

import (
	"bytes"
	"crypto/rand"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/local"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

const (
	toyName = "toy"
	toyID   = 42
	toyKind = 200
	// toyRank puts the toy first: with every transport available, the
	// engine prefers it even over local.
	toyRank = 5
)

func toySpec(made *atomic.Int64) core.TransportSpec {
	return core.TransportSpec{Name: toyName, ID: toyID, Rank: toyRank, Kinds: []uint8{toyKind},
		New: func() core.Transport { made.Add(1); return &toy{} }}
}

// Frames of the toy protocol: one request per connection.
const (
	frameWrite uint8 = 1 // C->S: u64 addr, bytes payload
	frameRead  uint8 = 2 // C->S: u64 addr, u64 len
	frameOK    uint8 = 3 // S->C: bytes payload (empty for a write)
	frameErr   uint8 = 4 // S->C: u32 code, str message
)

// toy moves each request over a connection of its own channel kind; the
// target checks every request with Engine.Acquire, as real transports do.
type toy struct {
	e        *core.Engine
	unhandle func()
	wg       sync.WaitGroup
	moved    atomic.Int64
}

func (t *toy) Name() string                          { return toyName }
func (t *toy) RegisterMemory([]*core.Region) error   { return nil }
func (t *toy) UnregisterMemory([]*core.Region) error { return nil }
func (t *toy) Stats() map[string]int64               { return map[string]int64{"bytes": t.moved.Load()} }

func (t *toy) Install(e *core.Engine) error {
	un, err := e.HandleConn(toyKind, t.serve)
	if err != nil {
		return err
	}
	t.e, t.unhandle = e, un
	return nil
}

func (t *toy) Uninstall() error {
	t.unhandle()
	t.wg.Wait()
	return nil
}

func (t *toy) Endpoints() []wire.Endpoint {
	return []wire.Endpoint{{Transport: toyName, Addr: t.e.ListenAddr()}}
}

func toyAddr(d *wire.SegmentDesc) string {
	for _, ep := range d.Endpoints {
		if ep.Transport == toyName {
			return ep.Addr
		}
	}
	return ""
}

func (t *toy) Eligible(r *core.Request) bool {
	return r.Desc != nil && toyAddr(r.Desc) != "" && !r.LocalRegion.Loc.IsCUDA()
}

func (t *toy) Submit(reqs []*core.Request) {
	for _, r := range reqs {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			r.Done(t.move(r))
		}()
	}
}

func (t *toy) move(r *core.Request) (uint64, error) {
	c, err := t.e.Dial(toyAddr(r.Desc), toyKind, r.Deadline)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(r.Deadline)
	local := host.Bytes(r.Local, r.Len)
	enc := wire.NewEncoder(nil)
	enc.U64(r.Remote)
	typ := frameWrite
	if r.Op == core.OpWrite {
		enc.Bytes(local)
	} else {
		typ = frameRead
		enc.U64(r.Len)
	}
	if err := wire.WriteFrame(c, typ, enc.Out()); err != nil {
		return 0, err
	}
	typ, payload, err := wire.ReadFrame(c, uint32(r.Len)+64, nil)
	if err != nil {
		return 0, err
	}
	d := wire.NewDecoder(payload)
	if typ == frameErr {
		code := status.Code(int32(d.U32()))
		return 0, status.Errorf(code, "toy target: %s", d.String(1<<10))
	}
	data := d.Bytes(uint32(r.Len))
	if err := d.Finish(); err != nil {
		return 0, err
	}
	if r.Op == core.OpRead {
		copy(local, data)
	}
	t.moved.Add(int64(r.Len))
	return r.Len, nil
}

// serve is the target side of one connection.
func (t *toy) serve(c net.Conn, _ string) {
	t.wg.Add(1)
	defer t.wg.Done()
	typ, payload, err := wire.ReadFrame(c, 1<<24, nil)
	if err != nil {
		return
	}
	d := wire.NewDecoder(payload)
	addr := d.U64()
	var data []byte
	var n uint64
	access := core.AccessRemoteRead
	if typ == frameWrite {
		data = d.Bytes(1 << 24)
		n, access = uint64(len(data)), core.AccessRemoteWrite
	} else {
		n = d.U64()
	}
	if d.Finish() != nil {
		return
	}
	region, err := t.e.Acquire(addr, n, access)
	if err != nil {
		enc := wire.NewEncoder(nil)
		enc.U32(uint32(int32(status.CodeOf(err))))
		enc.String(err.Error())
		_ = wire.WriteFrame(c, frameErr, enc.Out())
		return
	}
	enc := wire.NewEncoder(nil)
	if typ == frameWrite {
		copy(host.Bytes(addr, n), data)
		enc.Bytes(nil)
	} else {
		enc.Bytes(host.Bytes(addr, n))
	}
	t.e.Release(region)
	_ = wire.WriteFrame(c, frameOK, enc.Out())
}

func register(t *testing.T, e *core.Engine, n int, perm core.Perm) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	_, err := e.Register(core.RegionDesc{Addr: host.Addr(b), Len: uint64(n)}, perm)
	require.NoError(t, err)
	return b
}

func transfer(t *testing.T, e *core.Engine, req core.TransferRequest) (status.Code, core.RequestStatus) {
	t.Helper()
	b, err := e.Submit([]core.TransferRequest{req}, core.TransferOptions{})
	require.NoError(t, err)
	defer e.ReleaseBatch(b)
	code, _ := b.Wait(10 * time.Second)
	st := make([]core.RequestStatus, 1)
	b.Status(st)
	return code, st[0]
}

// The toy transport, declared only by its spec, is installed in rank order
// before the built-in ones, serves both directions over its own channel
// kind, reports its own id, and the target still refuses what its
// registrations do not permit.
func TestToyTransportMovesData(t *testing.T) {
	var made atomic.Int64
	available := []core.TransportSpec{local.Spec(), tcp.Spec(tcp.Options{}), toySpec(&made)}
	a, err := core.New(core.Options{Available: available})
	require.NoError(t, err)
	defer a.Close()
	b, err := core.New(core.Options{Available: available})
	require.NoError(t, err)
	defer b.Close()
	require.EqualValues(t, 2, made.Load(), "each engine made its own toy")
	var names []string
	for _, tr := range a.Transports() {
		names = append(names, tr.Name())
	}
	require.Equal(t, []string{toyName, local.Name, tcp.Name}, names, "installed in rank order")
	require.Equal(t, []string{toyName, local.Name, tcp.Name}, a.Available())
	require.EqualValues(t, toyID, a.TransportID(toyName))

	const n = 64 << 10
	src := register(t, a, n, 0)
	dst := register(t, b, n, core.PermRemoteRead|core.PermRemoteWrite)
	readOnly := register(t, b, n, core.PermRemoteRead)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)

	code, st := transfer(t, a, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: host.Addr(dst), Len: n})
	require.Equal(t, status.OK, code)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: toyID, Bytes: n}, st)
	require.True(t, bytes.Equal(src, dst), "written through the toy")

	back := register(t, a, n, 0)
	code, st = transfer(t, a, core.TransferRequest{Op: core.OpRead, Local: host.Addr(back), Segment: seg,
		Remote: host.Addr(readOnly), Len: n})
	require.Equal(t, status.OK, code)
	require.EqualValues(t, toyID, st.Transport)
	require.True(t, bytes.Equal(back, readOnly), "read through the toy")

	before := bytes.Clone(readOnly)
	code, st = transfer(t, a, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: host.Addr(readOnly), Len: n})
	require.Equal(t, status.PermissionDenied, code, "the initiator refuses a write to read-only memory")
	require.Equal(t, core.TransportNone, st.Transport, "before any transport sees it")
	// Sent anyway, straight to the target's toy, the target refuses it.
	c, err := a.Dial(b.ListenAddr(), toyKind, time.Now().Add(10*time.Second))
	require.NoError(t, err)
	defer c.Close()
	enc := wire.NewEncoder(nil)
	enc.U64(host.Addr(readOnly))
	enc.Bytes(src)
	require.NoError(t, wire.WriteFrame(c, frameWrite, enc.Out()))
	typ, payload, err := wire.ReadFrame(c, 1<<10, nil)
	require.NoError(t, err)
	require.Equal(t, frameErr, typ)
	reply := wire.NewDecoder(payload)
	require.Equal(t, status.PermissionDenied, status.Code(int32(reply.U32())))
	require.Equal(t, before, readOnly)
	require.EqualValues(t, 2*n, a.Stats().Transports[toyName]["bytes"])
}

// Collisions between specs are errors when the engine is built, and a
// transport cannot take a channel kind no spec declares.
func TestSpecCollisionsFailAtBuild(t *testing.T) {
	var made atomic.Int64
	toy := toySpec(&made)
	with := func(change func(*core.TransportSpec)) []core.TransportSpec {
		s := toy
		change(&s)
		return []core.TransportSpec{tcp.Spec(tcp.Options{}), s}
	}
	cases := map[string][]core.TransportSpec{
		"tcp's channel kind":      with(func(s *core.TransportSpec) { s.Kinds = []uint8{tcp.KindData} }),
		"core's channel kind":     with(func(s *core.TransportSpec) { s.Kinds = []uint8{core.KindControl} }),
		"channel kind 0":          with(func(s *core.TransportSpec) { s.Kinds = []uint8{0} }),
		"tcp's id":                with(func(s *core.TransportSpec) { s.ID = tcp.ID }),
		"no id":                   with(func(s *core.TransportSpec) { s.ID = core.TransportNone }),
		"tcp's name":              with(func(s *core.TransportSpec) { s.Name = tcp.Name }),
		"no name":                 with(func(s *core.TransportSpec) { s.Name = "" }),
		"no constructor":          with(func(s *core.TransportSpec) { s.New = nil }),
		"one kind declared twice": with(func(s *core.TransportSpec) { s.Kinds = []uint8{toyKind, toyKind} }),
	}
	for name, specs := range cases {
		_, err := core.New(core.Options{Available: specs, Transports: []string{}})
		require.ErrorIs(t, err, status.ErrInvalidArgument, name)
		t.Logf("%s: %v", name, err)
	}
	require.Zero(t, made.Load(), "no transport is made for an engine that is refused")

	// Declared without its kind, the toy cannot serve on the listener:
	// the engine refuses to build rather than route it connections.
	undeclared := with(func(s *core.TransportSpec) { s.Kinds = nil })
	_, err := core.New(core.Options{Available: undeclared})
	require.ErrorIs(t, err, status.ErrInvalidArgument)
	require.ErrorContains(t, err, "channel kind 200")
}
