package etcd

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/transport/tcp"
	"github.com/tent-dev/tent/wire"
)

// newbufCmd is the peers' "newbuf SIZE SEED": allocate a new remotely
// accessible region (a new address, never in an earlier descriptor), fill
// it with Pattern(SEED), answer its address. The region lives until the
// peer exits.
func newbufCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 2 {
		return "", fmt.Errorf("usage: newbuf SIZE SEED")
	}
	size, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return "", err
	}
	seed, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		return "", err
	}
	r, err := e.Alloc(size, "cpu", rw)
	if err != nil {
		return "", err
	}
	copy(host.Bytes(r.Addr, size), peertest.Pattern(seed, size))
	return strconv.FormatUint(r.Addr, 10), nil
}

// sumatCmd is the peers' "sumat ADDR LEN": the checksum of its memory.
func sumatCmd(_ *core.Engine, args []string) (string, error) {
	if len(args) != 2 {
		return "", fmt.Errorf("usage: sumat ADDR LEN")
	}
	addr, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return "", err
	}
	n, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil {
		return "", err
	}
	return peertest.Sum(host.Bytes(addr, n)), nil
}

// The publication contract: when Register, RegisterBatch, Unregister,
// Alloc, Free, Install or engine creation returns, etcd holds a
// descriptor that reflects it, read straight from etcd with no waiting;
// a batch costs one write.
func TestRegistrationIsInEtcdOnReturn(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	// No transport at first, to install one below.
	e, err := core.New(core.Options{Name: "pub", Available: available(), Transports: []string{}, Metadata: "etcd://" + srv.clientAddr + "?ttl=2", Directory: openSpy})
	require.NoError(t, err)
	defer e.Close()
	sp := spyOf(t, e)
	stored := func() *wire.SegmentDesc {
		t.Helper()
		d := storedDesc(t, cli, "pub")
		require.NotNil(t, d, "no entry in etcd")
		require.Equal(t, e.Incarnation(), d.Incarnation)
		return d
	}
	require.Empty(t, stored().Regions)

	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	defer runtime.KeepAlive(bufs)
	r0, err := e.Register(core.RegionDesc{Addr: host.Addr(bufs[0]), Len: 4096}, rw)
	require.NoError(t, err)
	d := stored()
	require.Equal(t, e.Generation(), d.Generation)
	require.True(t, hasRegion(d, r0.Addr), "Register returned before etcd held the region")

	writes := sp.d.writes.Load()
	descs := make([]core.RegionDesc, 0, len(bufs)-1)
	for _, b := range bufs[1:] {
		descs = append(descs, core.RegionDesc{Addr: host.Addr(b), Len: 4096})
	}
	batch, err := e.RegisterBatch(descs, rw)
	require.NoError(t, err)
	require.Equal(t, writes+1, sp.d.writes.Load(), "a batch of %d costs one write", len(descs))
	d = stored()
	require.Len(t, d.Regions, len(bufs))
	for _, r := range batch {
		require.True(t, hasRegion(d, r.Addr))
	}

	require.NoError(t, e.UnregisterBatch(batch[:3]))
	d = stored()
	require.Len(t, d.Regions, len(bufs)-3)
	require.False(t, hasRegion(d, batch[0].Addr), "UnregisterBatch returned before etcd dropped the region")
	require.NoError(t, e.Unregister(r0))
	require.False(t, hasRegion(stored(), r0.Addr))

	a, err := e.Alloc(1<<16, "cpu", rw)
	require.NoError(t, err)
	require.True(t, hasRegion(stored(), a.Addr), "Alloc returned before etcd held the region")
	require.NoError(t, e.Free(a))
	require.False(t, hasRegion(stored(), a.Addr))

	require.Len(t, stored().Endpoints, 1, "only the control endpoint before a transport is installed")
	require.NoError(t, e.Install(tcp.New(tcp.Options{})))
	d = stored()
	require.Equal(t, e.Generation(), d.Generation)
	require.True(t, hasEndpoint(d, "tcp"), "Install returned before etcd listed the transport: %+v", d.Endpoints)
	require.NoError(t, e.Uninstall("tcp"))
	require.False(t, hasEndpoint(stored(), "tcp"))

	st := e.Stats().Metadata
	require.EqualValues(t, 1, st["published"])
	require.EqualValues(t, e.Generation(), st["published_generation"])
	require.EqualValues(t, 0, st["behind"])
	require.EqualValues(t, 0, st["publish_timeouts"])
	require.Equal(t, sp.d.writes.Load(), st["writes"])
}

func hasEndpoint(d *wire.SegmentDesc, transport string) bool {
	for _, ep := range d.Endpoints {
		if ep.Transport == transport {
			return true
		}
	}
	return false
}

// Concurrent registrations join the write in flight or the next one: with
// etcd frozen, ten registrations wait on one write, and at most two writes
// serve them all.
func TestConcurrentRegistrationsShareWrites(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	// A long TTL and timeout: etcd is frozen for a while, and neither the
	// lease nor the waiters may give up meanwhile.
	e, _ := newEngine(t, srv, "burst", core.Options{
		Metadata: "etcd://" + srv.clientAddr + "?ttl=30&dial_timeout=30", DefaultTimeout: 30 * time.Second})
	sp := spyOf(t, e)
	const n = 10
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	defer runtime.KeepAlive(bufs)
	gen0, writes0 := e.Generation(), sp.d.writes.Load()

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	regs := make([]*core.Region, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			regs[i], errs[i] = e.Register(core.RegionDesc{Addr: host.Addr(bufs[i]), Len: 4096}, rw)
		}()
	}
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	// Every registration is committed and its descriptor handed over; none
	// can return while etcd is frozen.
	require.Eventually(t, func() bool { return e.Generation() == gen0+n && sp.wantGen() == gen0+n },
		20*time.Second, time.Millisecond)
	select {
	case <-returned:
		t.Fatal("registrations returned while etcd could not confirm them")
	default:
	}
	srv.Resume()
	resumed = true
	<-returned
	for i := range regs {
		require.NoError(t, errs[i])
	}
	w := sp.d.writes.Load() - writes0
	t.Logf("%d concurrent registrations: %d writes", n, w)
	require.GreaterOrEqual(t, w, int64(1))
	require.LessOrEqual(t, w, int64(2), "the waiters must share the write in flight and the next one")
	d := storedDesc(t, cli, "burst")
	require.Equal(t, gen0+n, d.Generation)
	for _, r := range regs {
		require.True(t, hasRegion(d, r.Addr))
	}
	require.Zero(t, sp.d.timeouts.Load())
}

// etcd unreachable when registering: the call succeeds after the
// engine's wait for etcd (bounded, never hanging), the region is usable
// at once by a peer that already has the segment open, later calls do not
// wait again, the stats say the entry is behind, and once etcd answers the
// entry catches up and the contract holds again.
func TestRegisterWhileEtcdIsDown(t *testing.T) {
	srv := startEtcd(t)
	cli := srv.client()
	defer cli.Close()
	const wait = time.Second
	target, _ := newEngine(t, srv, "lonely-target", core.Options{
		Metadata: "etcd://" + srv.clientAddr + "?ttl=10&dial_timeout=1"})
	sp := spyOf(t, target)
	peer := startPeer(t, srv, "initiator")
	// The peer opens the target (its descriptor comes over the control link
	// and is watched in etcd) before etcd goes away.
	cmd(t, peer, "xfer write lonely-target %d %d %d", peer.Buffers[0].Addr, target.Regions()[0].Addr, 4096)

	srv.Stop()
	bufs := [][]byte{make([]byte, bufSize), make([]byte, bufSize), make([]byte, bufSize)}
	defer runtime.KeepAlive(bufs)
	start := time.Now()
	r1, err := target.Register(core.RegionDesc{Addr: host.Addr(bufs[0]), Len: bufSize}, rw)
	took := time.Since(start)
	require.NoError(t, err, "a registration stands when etcd is away")
	require.EqualValues(t, 1, sp.d.timeouts.Load(), "the registration waited for etcd and gave up")
	require.Less(t, took, wait+2*time.Second, "the wait for etcd is bounded by the engine's etcd timeout")
	t.Logf("register without etcd: returned after %v", took.Round(time.Millisecond))
	st := target.Stats().Metadata
	require.EqualValues(t, 1, st["behind"])
	require.Less(t, st["published_generation"], int64(target.Generation()))

	r2, err := target.Register(core.RegionDesc{Addr: host.Addr(bufs[1]), Len: bufSize}, rw)
	require.NoError(t, err)
	require.EqualValues(t, 1, sp.d.timeouts.Load(), "while behind, a registration does not wait again")

	// The peer uses the new region at once: the target tells it over the
	// control link, no etcd needed.
	cmd(t, peer, "fill 0 77")
	cmd(t, peer, "xfer write lonely-target %d %d %d", peer.Buffers[0].Addr, r2.Addr, bufSize)
	require.Equal(t, peertest.Sum(peertest.Pattern(77, bufSize)), peertest.Sum(bufs[1]))

	srv.Start()
	// The background publisher catches up once etcd answers.
	require.Eventually(t, func() bool {
		d := storedDesc(t, cli, "lonely-target")
		return d != nil && hasRegion(d, r1.Addr) && hasRegion(d, r2.Addr)
	}, 20*time.Second, 20*time.Millisecond, "the entry never caught up")
	require.Eventually(t, func() bool { return target.Stats().Metadata["behind"] == 0 },
		20*time.Second, 20*time.Millisecond)
	// And registrations are published on return again.
	r3, err := target.Register(core.RegionDesc{Addr: host.Addr(bufs[2]), Len: bufSize}, rw)
	require.NoError(t, err)
	require.True(t, hasRegion(storedDesc(t, cli, "lonely-target"), r3.Addr))
	require.EqualValues(t, 1, sp.d.timeouts.Load())
}

// Register, then tell the peer over a side channel, and the peer writes
// at once: with etcd and with p2p metadata, into regions the peer's open
// segment (opened before the registration) has never seen. With etcd, the
// entry read straight from etcd holds the region as soon as the
// registration returned.
func TestRegisterThenTell(t *testing.T) {
	const rounds = 20
	const size = 64 << 10
	for _, mode := range []string{"etcd", "p2p"} {
		t.Run(mode, func(t *testing.T) {
			var srv *etcdServer
			var cli *clientv3.Client
			var initiator *core.Engine
			var buf []byte
			var target *peertest.Peer
			if mode == "etcd" {
				srv = startEtcd(t)
				cli = srv.client()
				defer cli.Close()
				target = startPeer(t, srv, "teller")
				initiator, buf = newEngine(t, srv, "listener", core.Options{})
			} else {
				target = startPeerWith(t, "p2p", "")
				var err error
				initiator, err = core.New(core.Options{Available: available(), Transports: []string{"tcp"}, DefaultTimeout: 10 * time.Second})
				require.NoError(t, err)
				defer initiator.Close()
				buf = make([]byte, bufSize)
				_, err = initiator.Register(core.RegionDesc{Addr: host.Addr(buf), Len: bufSize}, rw)
				require.NoError(t, err)
				defer runtime.KeepAlive(buf)
			}
			// Opened before any of the regions below exist.
			seg, err := initiator.OpenSegment(target.Name)
			require.NoError(t, err)
			gen0 := seg.Peer().Desc().Generation

			// The side channel: the target's stdout, read by this process.
			tell := make(chan uint64, rounds)
			go func() {
				defer close(tell)
				for i := 0; i < rounds; i++ {
					out, err := target.Cmd("newbuf %d %d", size, 5000+i)
					if err != nil {
						t.Errorf("newbuf: %v", err)
						return
					}
					addr, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
					if err != nil {
						t.Errorf("newbuf answered %q", out)
						return
					}
					tell <- addr
				}
			}()
			i := 0
			for addr := range tell {
				if cli != nil {
					d := storedDesc(t, cli, "teller")
					require.True(t, hasRegion(d, addr), "round %d: etcd lacks the region when Alloc returned", i)
				}
				// Read what the target put there, then write over it.
				require.NoError(t, transfer(initiator, seg, core.OpRead, host.Addr(buf), addr, size), "round %d", i)
				require.Equal(t, peertest.Sum(peertest.Pattern(int64(5000+i), size)), peertest.Sum(buf[:size]), "round %d", i)
				copy(buf[:size], peertest.Pattern(int64(9000+i), size))
				require.NoError(t, transfer(initiator, seg, core.OpWrite, host.Addr(buf), addr, size), "round %d", i)
				got, err := target.Cmd("sumat %d %d", addr, size)
				require.NoError(t, err)
				require.Equal(t, peertest.Sum(buf[:size]), got, "round %d", i)
				i++
			}
			require.Equal(t, rounds, i)
			require.Greater(t, seg.Peer().Desc().Generation, gen0, "the segment's descriptor was refreshed")
		})
	}
}
