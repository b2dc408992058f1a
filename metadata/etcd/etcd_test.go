package etcd

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/testenv"
	"github.com/tent-dev/tent/logsink"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

const (
	rw      = core.PermRemoteRead | core.PermRemoteWrite
	bufSize = 1 << 20
	ttl     = 2 * time.Second // "ttl=2" in the tests' URLs
)

// available is what the tests' engines may install: tcp.
func available() []core.TransportSpec { return []core.TransportSpec{tcp.Spec(tcp.Options{})} }

func TestMain(m *testing.M) {
	peertest.Commands["xfer"] = xferCmd
	peertest.Commands["newbuf"] = newbufCmd
	peertest.Commands["sumat"] = sumatCmd
	peertest.Directory = Open
	peertest.Main(available()...)
	os.Exit(m.Run())
}

// xferCmd is the peers' "xfer OP SEGMENT LOCAL REMOTE LEN": one transfer
// to a peer found by name, answering "ok" or the error with its code.
var peerSegs sync.Map // name → *core.Segment, in the peer process

func xferCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 5 {
		return "", fmt.Errorf("usage: xfer read|write SEGMENT LOCAL REMOTE LEN")
	}
	op := core.OpWrite
	if args[0] == "read" {
		op = core.OpRead
	}
	var seg *core.Segment
	if s, ok := peerSegs.Load(args[1]); ok {
		seg = s.(*core.Segment)
	} else {
		s, err := e.OpenSegment(args[1])
		if err != nil {
			return "", fmt.Errorf("%v: %w", status.CodeOf(err), err)
		}
		peerSegs.Store(args[1], s)
		seg = s
	}
	var n [3]uint64
	for i := range n {
		v, err := strconv.ParseUint(args[2+i], 10, 64)
		if err != nil {
			return "", err
		}
		n[i] = v
	}
	return "ok", transfer(e, seg, op, n[0], n[1], n[2])
}

func transfer(e *core.Engine, seg *core.Segment, op core.Op, local, remote, n uint64) error {
	b, err := e.Submit([]core.TransferRequest{{Op: op, Local: local, Segment: seg, Remote: remote, Len: n}},
		core.TransferOptions{Timeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("%v: %w", status.CodeOf(err), err)
	}
	defer e.ReleaseBatch(b)
	<-b.Done()
	if code, err := b.Wait(0); code != status.OK {
		return fmt.Errorf("%v: %w", code, err)
	}
	return nil
}

// spy wraps the real directory of an in-process engine (openSpy)
// and counts the invalidations its watches deliver, per peer name.
type spy struct {
	d      *Directory
	mu     sync.Mutex
	counts map[string]int
}

var spies sync.Map // engine name → *spy

// openSpy is the DirectoryFactory of the tests' in-process engines: the
// real directory, with its invalidations counted.
func openSpy(e *core.Engine) (core.Directory, error) {
	s := &spy{counts: map[string]int{}}
	d, err := open(e.Options().Metadata, e, func(name string) {
		s.mu.Lock()
		s.counts[name]++
		s.mu.Unlock()
		e.InvalidatePeer(name)
	})
	if err != nil {
		return nil, err
	}
	s.d = d
	spies.Store(e.Name(), s)
	return d, nil
}

func spyOf(t testing.TB, e *core.Engine) *spy {
	s, ok := spies.Load(e.Name())
	require.True(t, ok)
	return s.(*spy)
}

func (s *spy) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[name]
}

// wantGen is the newest generation handed to the publisher.
func (s *spy) wantGen() uint64 {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.wantGen
}

// leaseOf is the lease the directory's key is attached to (0: given up).
func leaseOf(d *Directory) clientv3.LeaseID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lease
}

// hasRegion reports whether d lists a region starting at addr.
func hasRegion(d *wire.SegmentDesc, addr uint64) bool {
	for _, r := range d.Regions {
		if r.Addr == addr {
			return true
		}
	}
	return false
}

// watchedGen is the generation the watch last saw for name (0: none).
func (s *spy) watchedGen(name string) uint64 {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if w := s.d.watches[name]; w != nil && w.desc != nil {
		return w.desc.Generation
	}
	return 0
}

// newEngine is an in-process engine on the spy directory with a buffer.
func newEngine(t testing.TB, srv *etcdServer, name string, o core.Options) (*core.Engine, []byte) {
	t.Helper()
	o.Name = name
	o.Available = available()
	o.Transports = []string{"tcp"}
	if o.Directory == nil {
		o.Directory = openSpy
	}
	if o.Metadata == "" {
		o.Metadata = "etcd://" + srv.clientAddr + "?ttl=2"
	}
	if o.DefaultTimeout == 0 {
		o.DefaultTimeout = 5 * time.Second
	}
	e, err := core.New(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	buf := make([]byte, bufSize)
	copy(buf, peertest.Pattern(1000, bufSize))
	_, err = e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: bufSize}, rw)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(buf) })
	return e, buf
}

// startPeer runs an engine named name in another process, with two
// buffers (0: Go heap, 1: engine allocation), both remotely accessible.
// It returns once the peer has registered both, which (the publication
// contract) means etcd holds a descriptor listing them.
func startPeer(t testing.TB, srv *etcdServer, name string) *peertest.Peer {
	t.Helper()
	return startPeerWith(t, srv.URL("ttl=2"), name)
}

// startPeerWith is startPeer with any metadata URL ("" or "p2p" for p2p
// metadata, where the peer's name is its address).
func startPeerWith(t testing.TB, metadata, name string) *peertest.Peer {
	t.Helper()
	return peertest.Start(t, peertest.Config{Transports: []string{"tcp"}, Name: name, Metadata: metadata,
		Buffers: []peertest.Buffer{{Size: bufSize, Perm: rw}, {Size: bufSize, Perm: rw, Alloc: true}}})
}

func key(name string) string { return DefaultPrefix + "/segments/" + name }

// getKV returns the stored entry of key, or nil.
func getKV(t testing.TB, cli *clientv3.Client, k string) *mvccpb.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

func storedDesc(t testing.TB, cli *clientv3.Client, name string) *wire.SegmentDesc {
	t.Helper()
	kv := getKV(t, cli, key(name))
	if kv == nil {
		return nil
	}
	d, err := wire.UnmarshalSegmentDesc(kv.Value)
	require.NoError(t, err)
	return d
}

func cmd(t testing.TB, p *peertest.Peer, format string, args ...any) string {
	t.Helper()
	out, err := p.Cmd(format, args...)
	require.NoError(t, err, format, args)
	return out
}

// Three engines in three processes find each other by name through etcd
// and move data over TCP in a ring, both ways; checksums match.
func TestThreeEnginesDiscoverEachOther(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	names := []string{"node-a", "node-b", "node-c"}
	peers := make([]*peertest.Peer, 3)
	for i, n := range names {
		peers[i] = startPeer(t, srv, n)
		require.Equal(t, n, peers[i].Name)
	}
	for i, n := range names {
		kv := getKV(t, cli, key(n))
		require.NotNil(t, kv, "no key for %s", n)
		require.NotZero(t, kv.Lease, "the entry must be attached to a lease")
		d, err := wire.UnmarshalSegmentDesc(kv.Value)
		require.NoError(t, err)
		require.Equal(t, n, d.Name)
		require.EqualValues(t, peers[i].PID, d.PID)
		require.Len(t, d.Regions, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ttlResp, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		cancel()
		require.NoError(t, err)
		require.EqualValues(t, 2, ttlResp.GrantedTTL)
	}
	for i, p := range peers {
		cmd(t, p, "fill 0 %d", 100+i)
	}
	// Ring WRITE: peer i's buffer 0 into buffer 1 of peer i+1.
	for i, p := range peers {
		next := peers[(i+1)%3]
		cmd(t, p, "xfer write %s %d %d %d", names[(i+1)%3], p.Buffers[0].Addr, next.Buffers[1].Addr, bufSize)
	}
	for i := range peers {
		prev := (i + 2) % 3
		require.Equal(t, peertest.Sum(peertest.Pattern(int64(100+prev), bufSize)), cmd(t, peers[i], "sum 1"),
			"%s buffer 1 should hold %s's buffer 0", names[i], names[prev])
	}
	// Ring READ the other way: peer i reads buffer 0 of peer i-1 into its buffer 1.
	for i, p := range peers {
		cmd(t, p, "fill 0 %d", 200+i)
	}
	for i, p := range peers {
		prev := (i + 2) % 3
		cmd(t, p, "xfer read %s %d %d %d", names[prev], p.Buffers[1].Addr, peers[prev].Buffers[0].Addr, bufSize)
		require.Equal(t, peertest.Sum(peertest.Pattern(int64(200+prev), bufSize)), cmd(t, p, "sum 1"))
	}
	// An in-process engine reaches all three by name too.
	e, buf := newEngine(t, srv, "node-t", core.Options{})
	for i, n := range names {
		seg, err := e.OpenSegment(n)
		require.NoError(t, err)
		require.Nil(t, seg.Peer().Local())
		require.EqualValues(t, peers[i].PID, seg.Peer().Desc().PID)
		require.NoError(t, transfer(e, seg, core.OpWrite, host.Addr(buf), peers[i].Buffers[0].Addr, bufSize))
		require.Equal(t, peertest.Sum(buf), cmd(t, peers[i], "sum 0"))
	}
	_, err := e.OpenSegment("node-nobody")
	require.Equal(t, status.NotFound, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "not registered")
}

// A peer's registration change reaches the initiator through the watch:
// the next transfer uses the new descriptor without reopening the segment.
func TestWatchSeesReRegisteredRegion(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	peer := startPeer(t, srv, "target")
	e, buf := newEngine(t, srv, "initiator", core.Options{})
	sp := spyOf(t, e)
	seg, err := e.OpenSegment("target")
	require.NoError(t, err)
	require.NoError(t, transfer(e, seg, core.OpWrite, host.Addr(buf), peer.Buffers[1].Addr, bufSize))
	gen0 := seg.Peer().Desc().Generation
	seen := sp.count("target")

	// The peer frees buffer 1 and allocates it again (often at the same
	// address, as a new allocation).
	f := strings.Fields(cmd(t, peer, "realloc 1 7"))
	newAddr, err := strconv.ParseUint(f[0], 10, 64)
	require.NoError(t, err)
	// Free and Alloc returned: etcd already holds the new descriptor.
	d := storedDesc(t, cli, "target")
	require.NotNil(t, d)
	require.GreaterOrEqual(t, d.Generation, gen0+2, "the peer's new descriptor was not in etcd when Alloc returned")
	require.True(t, hasRegion(d, newAddr), "the new allocation is missing from etcd")
	// The watch delivers the change asynchronously: wait for it to arrive.
	require.Eventually(t, func() bool {
		return sp.count("target") > seen && sp.watchedGen("target") >= gen0+2
	}, 10*time.Second, 10*time.Millisecond, "the watch did not deliver the change")
	// Still the old descriptor in the cache: the watch only marks it stale.
	require.Equal(t, gen0, seg.Peer().Desc().Generation)

	copy(buf, peertest.Pattern(55, bufSize))
	require.NoError(t, transfer(e, seg, core.OpWrite, host.Addr(buf), newAddr, bufSize))
	require.GreaterOrEqual(t, seg.Peer().Desc().Generation, gen0+2)
	require.Equal(t, peertest.Sum(buf), cmd(t, peer, "sum 1"))

	// Unregistered: the refreshed descriptor refuses it before any byte moves.
	seen = sp.count("target")
	cmd(t, peer, "unregister 0")
	require.Eventually(t, func() bool { return sp.count("target") > seen }, 10*time.Second, 10*time.Millisecond)
	err = transfer(e, seg, core.OpWrite, host.Addr(buf), peer.Buffers[0].Addr, 4096)
	require.ErrorContains(t, err, "not registered")
	seen = sp.count("target")
	cmd(t, peer, "register 0")
	require.Eventually(t, func() bool { return sp.count("target") > seen }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, transfer(e, seg, core.OpWrite, host.Addr(buf), peer.Buffers[0].Addr, 4096))
}

// A killed engine's entry stays until its lease expires (and holds the
// name meanwhile); then it is gone, the initiator is told through the
// watch, and a new engine under the same name (a new incarnation) is used
// through the same segment handle.
func TestKilledEngineExpiresAndRestarts(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	// A TTL long enough that the lease surely outlives the name check
	// below: the client renews every ttl/3, so the lease lives at least
	// 2/3 of it after the kill.
	const ttl = 4 * time.Second
	peer := startPeerWith(t, srv.URL("ttl=4"), "worker")
	e, buf := newEngine(t, srv, "driver", core.Options{})
	sp := spyOf(t, e)
	seg, err := e.OpenSegment("worker")
	require.NoError(t, err)
	require.NoError(t, transfer(e, seg, core.OpWrite, host.Addr(buf), peer.Buffers[0].Addr, bufSize))
	inc0 := seg.Peer().Desc().Incarnation

	peer.Kill()
	killed := time.Now()
	require.NotNil(t, getKV(t, cli, key("worker")), "a killed engine cannot delete its entry; its lease does")
	// The name is held until then: a new engine cannot take it.
	_, err = core.New(core.Options{Name: "worker", Available: available(), Transports: []string{"tcp"}, Metadata: srv.URL("ttl=2"), Directory: Open})
	require.Equal(t, status.NameInUse, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "expires in")

	seen := sp.count("worker")
	require.Eventually(t, func() bool { return getKV(t, cli, key("worker")) == nil },
		ttl+10*time.Second, 20*time.Millisecond, "the entry outlived its lease")
	gone := time.Since(killed)
	t.Logf("entry removed %v after the kill (TTL %v)", gone.Round(time.Millisecond), ttl)
	require.GreaterOrEqual(t, gone, ttl/2)
	require.Eventually(t, func() bool { return sp.count("worker") > seen }, 10*time.Second, 10*time.Millisecond)

	start := time.Now()
	err = transfer(e, seg, core.OpWrite, host.Addr(buf), peer.Buffers[0].Addr, 4096)
	require.Equal(t, status.NotFound, status.CodeOf(err), "%v", err)
	require.Less(t, time.Since(start), 5*time.Second, "a vanished peer must fail fast, not at the 10 s timeout")

	again := startPeer(t, srv, "worker")
	copy(buf, peertest.Pattern(9, bufSize))
	require.Eventually(t, func() bool {
		return transfer(e, seg, core.OpWrite, host.Addr(buf), again.Buffers[0].Addr, bufSize) == nil
	}, 5*time.Second, 20*time.Millisecond)
	require.NotEqual(t, inc0, seg.Peer().Desc().Incarnation)
	require.EqualValues(t, again.PID, seg.Peer().Desc().PID)
	require.Equal(t, peertest.Sum(buf), cmd(t, again, "sum 0"))
}

// Two live engines cannot share a name; a clean close frees it at once.
func TestNameCollision(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	peer := startPeer(t, srv, "unique")
	before := getKV(t, cli, key("unique"))

	_, err := core.New(core.Options{Name: "unique", Available: available(), Transports: []string{"tcp"}, Metadata: srv.URL(""), Directory: Open})
	require.Error(t, err)
	require.Equal(t, status.NameInUse, status.CodeOf(err), "%v", err)
	require.ErrorIs(t, err, status.ErrNameInUse)
	require.Contains(t, err.Error(), `segment name "unique" is already in use`)
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d", peer.PID))
	after := getKV(t, cli, key("unique"))
	require.Equal(t, before.ModRevision, after.ModRevision, "the live engine's entry was overwritten")
	require.Equal(t, before.Value, after.Value)

	// A clean stop deletes the entry and revokes the lease at once.
	require.NoError(t, peer.Stop())
	require.Nil(t, getKV(t, cli, key("unique")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lr, err := cli.TimeToLive(ctx, clientv3.LeaseID(before.Lease))
	require.NoError(t, err)
	require.EqualValues(t, -1, lr.TTL, "the lease should be revoked")

	e, err := core.New(core.Options{Name: "unique", Available: available(), Transports: []string{"tcp"}, Metadata: srv.URL(""), Directory: Open})
	require.NoError(t, err)
	require.NotNil(t, getKV(t, cli, key("unique")))
	require.NoError(t, e.Close())
	require.Nil(t, getKV(t, cli, key("unique")))
}

// etcd stopped mid-run and restarted with the same data: established
// peers keep transferring, new lookups and new engines fail clearly within
// their deadlines, and afterwards lookups work and every entry is back.
func TestEtcdOutage(t *testing.T) {
	srv := startEtcd(t)
	a := startPeer(t, srv, "svc-a")
	b := startPeer(t, srv, "svc-b")
	e, buf := newEngine(t, srv, "svc-t", core.Options{})
	sp := spyOf(t, e)
	fresh, _ := newEngine(t, srv, "svc-fresh", core.Options{DefaultTimeout: 2 * time.Second})
	spFresh := spyOf(t, fresh)
	segA, err := e.OpenSegment("svc-a")
	require.NoError(t, err)
	segB, err := e.OpenSegment("svc-b")
	require.NoError(t, err)
	write := func(seg *core.Segment, p *peertest.Peer, seed int64) error {
		copy(buf, peertest.Pattern(seed, bufSize))
		if err := transfer(e, seg, core.OpWrite, host.Addr(buf), p.Buffers[0].Addr, bufSize); err != nil {
			return err
		}
		if got := cmd(t, p, "sum 0"); got != peertest.Sum(buf) {
			return fmt.Errorf("checksum mismatch at %s", p.Name)
		}
		return nil
	}
	require.NoError(t, write(segA, a, 1))
	require.NoError(t, write(segB, b, 2))
	cmd(t, a, "xfer write svc-b %d %d %d", a.Buffers[0].Addr, b.Buffers[1].Addr, bufSize)

	srv.Stop()
	down := time.Now()
	require.NoError(t, write(segA, a, 3), "an established peer must keep working without etcd")
	require.NoError(t, write(segB, b, 4))
	cmd(t, a, "xfer write svc-b %d %d %d", a.Buffers[0].Addr, b.Buffers[1].Addr, bufSize)

	start := time.Now()
	_, err = fresh.OpenSegment("svc-a")
	took := time.Since(start)
	require.Error(t, err)
	require.Contains(t, []status.Code{status.Timeout, status.TransportError}, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), srv.clientAddr)
	require.Less(t, took, 4*time.Second, "the lookup must fail within its 2 s deadline")
	t.Logf("lookup without etcd: %v after %v", err, took.Round(time.Millisecond))

	start = time.Now()
	_, err = core.New(core.Options{Name: "svc-new", Available: available(), Transports: []string{"tcp"}, Metadata: srv.URL("dial_timeout=1"), Directory: Open})
	took = time.Since(start)
	require.Contains(t, []status.Code{status.Timeout, status.TransportError}, status.CodeOf(err), "%v", err)
	require.Less(t, took, 3*time.Second)
	t.Logf("engine creation without etcd: %v after %v", err, took.Round(time.Millisecond))

	// The peer changes its registrations while etcd is away: the calls
	// succeed after the peer's wait for etcd (the degraded mode), the
	// initiator is told over the control link, cannot ask etcd, and
	// answers from the watched copy; the data still moves.
	cmd(t, b, "unregister 1")
	cmd(t, b, "register 1")
	require.NoError(t, write(segB, b, 5))
	// Asked directly, the directory answers for a watched name from its
	// copy after a short probe, and fails for a name it never resolved.
	start = time.Now()
	d, err := sp.d.Resolve("svc-b", time.Now().Add(5*time.Second))
	require.NoError(t, err)
	require.Equal(t, "svc-b", d.Name)
	require.Less(t, time.Since(start), fallbackProbe+2*time.Second, "answered from the copy after the probe, not the 5 s deadline")
	_, err = sp.d.Resolve("svc-fresh", time.Now().Add(time.Second))
	require.Equal(t, status.Timeout, status.CodeOf(err), "%v", err)

	// Stay down until the engines here have given their leases up (no
	// renewal within the TTL), so the restart exercises granting anew.
	require.Eventually(t, func() bool { return leaseOf(sp.d) == 0 && leaseOf(spFresh.d) == 0 },
		ttl+10*time.Second, 20*time.Millisecond, "the engines never gave their leases up")
	require.NoError(t, write(segA, a, 6))
	regrants := sp.d.regrants.Load()

	srv.Start()
	t.Logf("etcd was down for %v", time.Since(down).Round(time.Millisecond))
	cli := srv.client()
	defer cli.Close()
	require.Eventually(t, func() bool {
		s, err := fresh.OpenSegment("svc-a")
		return err == nil && s.Peer().Desc().Name == "svc-a"
	}, 10*time.Second, 50*time.Millisecond, "lookups did not recover")
	require.Eventually(t, func() bool {
		for _, n := range []string{"svc-a", "svc-b", "svc-t", "svc-fresh"} {
			kv := getKV(t, cli, key(n))
			if kv == nil || kv.Lease == 0 {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			lr, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			cancel()
			if err != nil || lr.TTL <= 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "entries are not back under live leases")
	// The entry is the peer's latest descriptor (published once etcd was back).
	require.Eventually(t, func() bool {
		d := storedDesc(t, cli, "svc-b")
		return d != nil && d.Generation == segB.Peer().Desc().Generation
	}, 10*time.Second, 50*time.Millisecond)
	t.Logf("leases granted again by the initiator: %d (before the restart: %d); resolves answered from the watched copy: %d",
		sp.d.regrants.Load(), regrants, sp.d.fallbacks.Load())
	require.NoError(t, write(segA, a, 7))
	require.NoError(t, write(segB, b, 8))
	cmd(t, a, "xfer write svc-b %d %d %d", a.Buffers[0].Addr, b.Buffers[1].Addr, bufSize)
}

// Someone revokes the engine's lease (or deletes its key): the engine
// publishes again under a new lease.
func TestRevokedLeaseIsReplaced(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	logs := &logLines{}
	sink := logsink.New(logsink.Debug, nil)
	sink.SetCallback(logs.add)
	e, _ := newEngine(t, srv, "phoenix", core.Options{Logger: sink.Logger()})
	require.True(t, logs.has("etcd session started", "key="+key("phoenix")), "%v", logs.all())
	kv := getKV(t, cli, key("phoenix"))
	require.NotNil(t, kv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := cli.Revoke(ctx, clientv3.LeaseID(kv.Lease))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		now := getKV(t, cli, key("phoenix"))
		return now != nil && now.Lease != 0 && now.Lease != kv.Lease
	}, 10*time.Second, 20*time.Millisecond, "not published again after the lease was revoked")
	require.GreaterOrEqual(t, spyOf(t, e).d.regrants.Load(), int64(1))
	// Revoking deletes the entry too: either is noticed first, the lease
	// loss is logged, and then the restored registration.
	require.Eventually(t, func() bool { return logs.count("etcd registration restored") >= 1 },
		10*time.Second, 20*time.Millisecond, "%v", logs.all())
	require.True(t, logs.has("etcd lease lost"), "%v", logs.all())

	kv = getKV(t, cli, key("phoenix"))
	restored := logs.count("etcd registration restored")
	_, err = cli.Delete(ctx, key("phoenix"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		now := getKV(t, cli, key("phoenix"))
		return now != nil && now.ModRevision > kv.ModRevision
	}, 10*time.Second, 20*time.Millisecond, "not published again after the key was deleted")
	d := storedDesc(t, cli, "phoenix")
	require.Equal(t, e.Incarnation(), d.Incarnation)
	require.Eventually(t, func() bool {
		return logs.has("etcd entry deleted by someone else") && logs.count("etcd registration restored") > restored
	}, 10*time.Second, 20*time.Millisecond, "%v", logs.all())
}

// logLines collects a sink's lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(_ logsink.Level, s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// count is the number of lines containing part.
func (l *logLines) count(part string) int {
	n := 0
	for _, s := range l.all() {
		if strings.Contains(s, part) {
			n++
		}
	}
	return n
}

// has reports whether one line contains every part.
func (l *logLines) has(parts ...string) bool {
next:
	for _, s := range l.all() {
		for _, p := range parts {
			if !strings.Contains(s, p) {
				continue next
			}
		}
		return true
	}
	return false
}

// What is stored under a name is untrusted: malformed, mismatched or
// unknown-version entries are refused with clear errors.
func TestResolveRejectsBadEntries(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	e, _ := newEngine(t, srv, "reader", core.Options{})
	good, err := e.EncodedDescriptor()
	require.NoError(t, err)
	wrongVersion := append([]byte(nil), good...)
	wrongVersion[4] = 99
	cases := []struct {
		name  string
		value []byte
		code  status.Code
		msg   string
	}{
		{"garbage", []byte("not a descriptor"), status.Protocol, "bad descriptor"},
		{"truncated", good[:len(good)/2], status.Protocol, "bad descriptor"},
		{"empty", nil, status.Protocol, "bad descriptor"},
		{"someone-else", good, status.Protocol, `names segment "reader"`},
		{"future", wrongVersion, status.VersionMismatch, "version"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := cli.Put(ctx, key(c.name), string(c.value))
			require.NoError(t, err)
			_, err = e.OpenSegment(c.name)
			require.Equal(t, c.code, status.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), c.msg)
		})
	}
}

// The prefix option places entries; another prefix is another namespace:
// the same name lives in both, and a name published under one prefix is
// not found under another.
func TestPrefix(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	peer := startPeer(t, srv, "outsider") // default prefix
	e1, _ := newEngine(t, srv, "same", core.Options{MetadataPrefix: "/cluster-1/"})
	e2, _ := newEngine(t, srv, "same", core.Options{MetadataPrefix: "/cluster-2"})
	require.Equal(t, e1.Incarnation(), storedDescAt(t, cli, "/cluster-1/segments/same").Incarnation)
	require.Equal(t, e2.Incarnation(), storedDescAt(t, cli, "/cluster-2/segments/same").Incarnation)
	require.Nil(t, getKV(t, cli, key("same")))
	_, err := e1.OpenSegment("outsider")
	require.Equal(t, status.NotFound, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "/cluster-1/segments/outsider")
	// A dead endpoint listed first: the client uses the live one.
	e3, _ := newEngine(t, srv, "insider", core.Options{
		Metadata: "etcd://" + testenv.ServerAddr(t) + "," + srv.clientAddr + "?ttl=2"})
	s, err := e3.OpenSegment("outsider")
	require.NoError(t, err)
	require.EqualValues(t, peer.PID, s.Peer().Desc().PID)
}

func storedDescAt(t testing.TB, cli *clientv3.Client, k string) *wire.SegmentDesc {
	t.Helper()
	kv := getKV(t, cli, k)
	require.NotNil(t, kv, "no key %s", k)
	d, err := wire.UnmarshalSegmentDesc(kv.Value)
	require.NoError(t, err)
	return d
}

// Engines that come and go leave no goroutines behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	srv := startEtcd(t)
	peer := startPeer(t, srv, "stayer")
	settle := func() int {
		runtime.GC()
		return runtime.NumGoroutine()
	}
	base := settle()
	for i := 0; i < 3; i++ {
		e, err := core.New(core.Options{Name: fmt.Sprintf("tmp-%d", i), Available: available(), Transports: []string{"tcp"}, Metadata: srv.URL("ttl=2"), Directory: Open})
		require.NoError(t, err)
		_, err = e.OpenSegment("stayer")
		require.NoError(t, err)
		require.NoError(t, e.Close())
	}
	require.Eventually(t, func() bool { return settle() <= base+2 }, 10*time.Second, 100*time.Millisecond,
		"goroutines: %d before, %d after", base, runtime.NumGoroutine())
	_ = peer
}

// An unreachable etcd fails engine creation within the dial timeout or
// the engine's timeout, whichever is shorter (the default dial timeout is
// 5 s: a 1 s engine timeout must not wait that long).
func TestUnreachableEtcd(t *testing.T) {
	addr := testenv.ServerAddr(t) // nothing listens there
	cases := []struct {
		query   string
		timeout time.Duration // the engine's DefaultTimeout (0: default)
		within  time.Duration // the bound the error reports
	}{
		{"dial_timeout=1", 0, time.Second},
		{"dial_timeout=500ms&ttl=3", 0, 500 * time.Millisecond},
		{"", time.Second, time.Second},
		{"dial_timeout=10", 800 * time.Millisecond, 800 * time.Millisecond},
		{"dial_timeout=0.5", 10 * time.Second, 500 * time.Millisecond},
	}
	for _, c := range cases {
		url := "etcd://" + addr
		if c.query != "" {
			url += "?" + c.query
		}
		start := time.Now()
		_, err := core.New(core.Options{Name: "lonely", Available: available(), Transports: []string{"tcp"}, Metadata: url, Directory: Open, DefaultTimeout: c.timeout})
		took := time.Since(start)
		require.Error(t, err, url)
		require.Equal(t, status.Timeout, status.CodeOf(err), "%s: %v", url, err)
		require.Contains(t, err.Error(), addr)
		require.Contains(t, err.Error(), "within "+c.within.String(), url)
		// A deadline, not a speed: well under the 5 s default dial timeout.
		require.Less(t, took, c.within+2*time.Second, "%s (timeout %v): %v", url, c.timeout, err)
		t.Logf("%s, engine timeout %v: failed after %v", url, c.timeout, took.Round(time.Millisecond))
	}
}
