//go:build linux

package shm

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// grantPair is a target engine and an initiator engine of this process,
// each with its own shm transport, over a real socket.
type grantPair struct {
	target *core.Engine
	ttr    *Transport
	e      *core.Engine
	tr     *Transport
	seg    *core.Segment
	local  []byte
}

func newGrantPair(t *testing.T, to core.Options, localSize int) *grantPair {
	t.Helper()
	target, ttr := newEngine(t, to)
	e, tr := newEngine(t, core.Options{})
	return &grantPair{target: target, ttr: ttr, e: e, tr: tr, seg: openSeg(t, e, target.Name()), local: localBuf(t, e, localSize)}
}

// heapRegion registers n bytes of Go heap with the target, filled with fill.
func (p *grantPair) heapRegion(t *testing.T, n int, perm core.Perm, fill byte) ([]byte, *core.Region) {
	t.Helper()
	mem := bytes.Repeat([]byte{fill}, n)
	r, err := p.target.Register(core.RegionDesc{Addr: host.Addr(mem), Len: uint64(n)}, perm)
	require.NoError(t, err)
	t.Cleanup(func() { runtime.KeepAlive(mem) })
	return mem, r
}

// region gives the target n bytes of kind "mapped" (tent_alloc memory,
// a memfd the initiator maps) or "process_vm" (registered Go heap).
func (p *grantPair) region(t *testing.T, kind string, n int) ([]byte, *core.Region) {
	t.Helper()
	if kind != "mapped" {
		return p.heapRegion(t, n, rw, 0)
	}
	r, err := p.target.Alloc(uint64(n), "", rw)
	require.NoError(t, err)
	return host.Bytes(r.Addr, uint64(n)), r
}

// one runs a batch of one request of local[off:off+n] against remote.
func (p *grantPair) one(t *testing.T, op core.Op, off int, remote uint64, n int) (status.Code, error) {
	t.Helper()
	code, _, err := run(t, p.e, []core.TransferRequest{{Op: op, Local: host.Addr(p.local) + uint64(off), Segment: p.seg,
		Remote: remote, Len: uint64(n)}}, core.TransferOptions{})
	return code, err
}

// The second batch into a region is copied under the standing grant the
// first one brought, with no lease; a copy parked under it holds the
// target's Unregister until it ends; then Unregister returns, and the next
// batch on that range fails NotRegistered and never lands in the memory.
func TestGrantRevokeWaitsForCopy(t *testing.T) {
	for _, kind := range []string{"process_vm", "mapped"} {
		t.Run(kind, func(t *testing.T) {
			const n = 64 << 10
			p := newGrantPair(t, core.Options{}, n)
			mem, r := p.region(t, kind, n)
			copy(p.local, peertest.Pattern(1, n))
			code, err := p.one(t, core.OpWrite, 0, r.Addr, n)
			require.Equal(t, status.OK, code, "%v", err)
			require.EqualValues(t, 1, p.tr.Stats()["grant_misses"])
			require.EqualValues(t, 1, p.tr.Stats()["grants_cached"])
			require.EqualValues(t, 1, p.ttr.Stats()["grants"])
			require.Eventually(t, func() bool { return p.ttr.Stats()["leases"] == 0 }, 10*time.Second, time.Millisecond,
				"the first batch's lease is released (asynchronously)")

			// Batch 2: a hit, parked inside its copy.
			entered, release := make(chan struct{}, 1), make(chan struct{})
			var releaseOnce sync.Once
			let := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(let) // a failing check must not leave the copy parked
			hook := func() {
				entered <- struct{}{}
				<-release
			}
			p.tr.hooks.noInline.Store(true) // a job copies: Submit returns with the copy parked
			p.tr.hooks.inCachedCopy.Store(&hook)
			copy(p.local, peertest.Pattern(2, n))
			b, err := p.e.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(p.local), Segment: p.seg,
				Remote: r.Addr, Len: n}}, core.TransferOptions{})
			require.NoError(t, err)
			<-entered
			p.tr.hooks.inCachedCopy.Store(nil)
			require.EqualValues(t, 1, p.tr.Stats()["grant_hits"])
			require.Zero(t, p.ttr.Stats()["leases"], "a hit takes no lease")

			unregistered := make(chan error, 1)
			go func() {
				if kind == "mapped" {
					unregistered <- p.target.Free(r)
				} else {
					unregistered <- p.target.Unregister(r)
				}
			}()
			// The revoke is out: Unregister now waits for the initiator,
			// whose copy holds the grant.
			require.Eventually(t, func() bool { return p.ttr.Stats()["revokes_sent"] == 1 }, 10*time.Second, time.Millisecond)
			require.Eventually(t, func() bool { return p.tr.Stats()["grants_cached"] == 0 }, 10*time.Second, time.Millisecond,
				"the initiator took the grant out of its cache")
			select {
			case err := <-unregistered:
				t.Fatalf("Unregister returned (%v) while a copy under the grant was parked", err)
			default:
			}
			require.Zero(t, p.ttr.Stats()["revokes_acked"])

			let()
			code, werr := b.Wait(10 * time.Second)
			require.Equal(t, status.OK, code, "%v", werr)
			p.e.ReleaseBatch(b)
			require.NoError(t, <-unregistered)
			st := p.ttr.Stats()
			require.EqualValues(t, 1, st["revokes_acked"])
			require.Zero(t, st["revoke_timeouts"])
			require.Zero(t, st["grants"])
			require.EqualValues(t, 1, p.tr.Stats()["grants_revoked"])
			if kind == "process_vm" {
				require.Equal(t, peertest.Pattern(2, n), mem, "the parked copy landed before Unregister returned")
				// Canary after Unregister: nothing may land on it.
				copy(mem, bytes.Repeat([]byte{0xC5}, n))
			}

			copy(p.local, peertest.Pattern(3, n))
			code, err = p.one(t, core.OpWrite, 0, r.Addr, n)
			require.Equal(t, status.NotRegistered, code, "%v", err)
			if kind == "process_vm" {
				require.Equal(t, bytes.Repeat([]byte{0xC5}, n), mem, "nothing written after Unregister")
			}
			require.EqualValues(t, 1, p.tr.Stats()["grant_hits"], "no copy under a revoked grant")
			require.Eventually(t, func() bool { return p.tr.Stats()["mappings"] == 0 }, 10*time.Second, time.Millisecond)
		})
	}
}

// An initiator that never acknowledges a revoke does not hold Unregister
// past UnregisterTimeout: its connection is closed, and its next batch
// reconnects and is checked afresh.
func TestGrantRevokeTimeout(t *testing.T) {
	const n = 4096
	const timeout = 300 * time.Millisecond
	p := newGrantPair(t, core.Options{UnregisterTimeout: timeout}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	other, _ := p.heapRegion(t, n, rw, 0)
	for _, addr := range []uint64{r.Addr, host.Addr(other)} {
		code, err := p.one(t, core.OpWrite, 0, addr, n)
		require.Equal(t, status.OK, code, "%v", err)
	}
	require.EqualValues(t, 2, p.tr.Stats()["grants_cached"])
	p.tr.hooks.swallowRevokeGrant.Store(true)

	start := time.Now()
	require.NoError(t, p.target.Unregister(r))
	took := time.Since(start)
	t.Logf("Unregister with a silent initiator took %v (UnregisterTimeout %v)", took, timeout)
	require.Less(t, took, timeout+5*time.Second, "bounded by UnregisterTimeout, never a hang")
	st := p.ttr.Stats()
	require.EqualValues(t, 1, st["revokes_sent"])
	require.Zero(t, st["revokes_acked"])
	require.EqualValues(t, 1, st["revoke_timeouts"])
	require.Zero(t, st["grants"], "the closed connection's grants are gone")
	require.Eventually(t, func() bool { return p.ttr.Stats()["server_connections"] == 0 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		st := p.tr.Stats()
		return st["client_connections"] == 0 && st["grants_cached"] == 0
	}, 10*time.Second, time.Millisecond, "the initiator saw its connection close and dropped every grant")

	// Afresh: a new connection, a lease (a miss), the target's check.
	p.tr.hooks.swallowRevokeGrant.Store(false)
	copy(mem, bytes.Repeat([]byte{0xC5}, n))
	misses := p.tr.Stats()["grant_misses"]
	code, err := p.one(t, core.OpWrite, 0, r.Addr, n)
	require.Equal(t, status.NotRegistered, code, "%v", err)
	require.Equal(t, bytes.Repeat([]byte{0xC5}, n), mem)
	copy(p.local, peertest.Pattern(4, n))
	code, err = p.one(t, core.OpWrite, 0, host.Addr(other), n)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, peertest.Pattern(4, n), other)
	st = p.tr.Stats()
	require.Greater(t, st["grant_misses"], misses, "the other region was asked for again")
	require.EqualValues(t, 1, st["client_connections"])
	require.EqualValues(t, 1, st["grants_cached"])
}

// holdGrantCmd is a peer command ("holdgrant ENDPOINT ADDR LEN"): an
// initiator that takes a cached WRITE lease on [ADDR, ADDR+LEN) of the
// target, gives the lease back and keeps the connection (and the standing
// grant) without ever answering a revoke, until the process dies. It
// answers "grants=N".
func holdGrantCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 3 {
		return "", fmt.Errorf("usage: holdgrant ENDPOINT ADDR LEN")
	}
	addr, err1 := strconv.ParseUint(args[1], 10, 64)
	n, err2 := strconv.ParseUint(args[2], 10, 64)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("bad address or length")
	}
	nc, err := net.Dial("unix", args[0])
	if err != nil {
		return "", err
	}
	uc := nc.(*net.UnixConn)
	if _, err := wire.ClientHandshake(uc, wire.HandshakeConfig{
		Secret: e.Options().Secret, Deadline: time.Now().Add(10 * time.Second), LocalName: "holder",
	}, kindShm); err != nil {
		uc.Close()
		return "", err
	}
	if _, err := uc.Write(appendLeaseFrame(nil, frameLeaseCached, 1, time.Minute,
		[]*core.Request{{Op: core.OpWrite, Remote: addr, Len: n}})); err != nil {
		uc.Close()
		return "", err
	}
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, payload, err := wire.ReadFrame(uc, maxFrame, nil)
	if err != nil || typ != frameGrantCached {
		uc.Close()
		return "", fmt.Errorf("no cached grant: type %d, %v", typ, err)
	}
	d := wire.NewDecoder(payload)
	var h grantHead
	decodeGrantHead(&d, &h)
	decodeStanding(&d, &h)
	if err := d.Err(); err != nil {
		uc.Close()
		return "", err
	}
	if _, err := uc.Write(appendRelease(nil, 1)); err != nil {
		uc.Close()
		return "", err
	}
	_ = uc.SetReadDeadline(time.Time{})
	go func() { _, _ = io.Copy(io.Discard, uc) }() // holds the connection, reads revokes, never acks
	return fmt.Sprintf("grants=%d", len(h.standing)), nil
}

// A killed initiator holding a standing grant does not delay Unregister:
// its socket closes, and the target stops waiting for it at once.
func TestGrantHolderKilled(t *testing.T) {
	const n = 4096
	const timeout = time.Minute // a wait for the timeout would be glaring
	target, ttr := newEngine(t, core.Options{UnregisterTimeout: timeout})
	mem := make([]byte, n)
	r, err := target.Register(core.RegionDesc{Addr: host.Addr(mem), Len: n}, rw)
	require.NoError(t, err)
	peer := startPeer(t)
	ans, err := peer.Cmd("holdgrant %s %d %d", ttr.addr, r.Addr, n)
	require.NoError(t, err)
	require.Equal(t, "grants=1", ans)
	require.EqualValues(t, 1, ttr.Stats()["grants"])
	require.Eventually(t, func() bool { return ttr.Stats()["leases"] == 0 }, 10*time.Second, time.Millisecond)

	peer.Kill()
	start := time.Now()
	require.NoError(t, target.Unregister(r))
	took := time.Since(start)
	t.Logf("Unregister after the holder was killed took %v", took)
	st := ttr.Stats()
	require.Zero(t, st["revoke_timeouts"], "ended by the connection's death, not by the timeout")
	require.Zero(t, st["grants"])
	require.Less(t, took, timeout/2)
	runtime.KeepAlive(mem)
}

// A standing grant covers exactly what the region allows and what was
// asked: a read grant never lets a write through, including a write right
// after a read, and the target announces nothing more.
func TestGrantPermissionExact(t *testing.T) {
	const n = 4096
	t.Run("read-only region", func(t *testing.T) {
		p := newGrantPair(t, core.Options{}, 2*n)
		mem, r := p.heapRegion(t, n, core.PermRemoteRead, 0x11)
		for round := 0; round < 2; round++ {
			clear(p.local)
			code, err := p.one(t, core.OpRead, 0, r.Addr, n)
			require.Equal(t, status.OK, code, "%v", err)
			require.Equal(t, mem, p.local[:n])
			copy(p.local[n:], peertest.Pattern(int64(round), n))
			code, err = p.one(t, core.OpWrite, n, r.Addr, n)
			require.Equal(t, status.PermissionDenied, code, "%v", err)
			require.Equal(t, bytes.Repeat([]byte{0x11}, n), mem, "nothing written")
		}
		// A batch of a read and a write: the write is refused, the read
		// served.
		code, st, _ := run(t, p.e, []core.TransferRequest{
			{Op: core.OpRead, Local: host.Addr(p.local), Segment: p.seg, Remote: r.Addr, Len: n / 2},
			{Op: core.OpWrite, Local: host.Addr(p.local) + n, Segment: p.seg, Remote: r.Addr + n/2, Len: n / 2},
		}, core.TransferOptions{})
		require.NotEqual(t, status.OK, code)
		require.Equal(t, status.OK, st[0].Code)
		require.Equal(t, status.PermissionDenied, st[1].Code)
		require.Equal(t, bytes.Repeat([]byte{0x11}, n), mem, "nothing written")
		s := p.tr.Stats()
		require.EqualValues(t, 1, s["grants_cached"], "one read grant")
		require.Positive(t, s["grant_hits"], "the second read")
		require.Equal(t, []standingDesc{{base: r.Addr, len: n, perm: core.PermRemoteRead}}, cachedGrants(p.tr))
		// The engine refuses those writes from the descriptor before the
		// transport sees them; the cache refuses them on its own too.
		c := onlyConn(t, p.tr)
		under := make([]*standing, 1)
		require.False(t, c.holdGrants([]*core.Request{{Op: core.OpWrite, Remote: r.Addr, Len: n}}, under))
		require.False(t, c.holdGrants([]*core.Request{{Op: core.OpRead, Remote: r.Addr, Len: 1},
			{Op: core.OpWrite, Remote: r.Addr + 1, Len: 1}}, make([]*standing, 2)))
		require.True(t, c.holdGrants([]*core.Request{{Op: core.OpRead, Remote: r.Addr, Len: n}}, under))
		c.putGrants(under)
		// The per-batch lookup allocates nothing.
		batch := []*core.Request{{Op: core.OpRead, Remote: r.Addr, Len: 64}, {Op: core.OpRead, Remote: r.Addr + 64, Len: 64}}
		two := make([]*standing, 2)
		require.Zero(t, testing.AllocsPerRun(100, func() {
			if !c.holdGrants(batch, two) {
				panic("miss")
			}
			c.putGrants(two)
		}))
	})

	t.Run("read-write region, asked to read", func(t *testing.T) {
		p := newGrantPair(t, core.Options{}, n)
		_, r := p.heapRegion(t, n, rw, 0)
		code, err := p.one(t, core.OpRead, 0, r.Addr+8, 64)
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, []standingDesc{{base: r.Addr, len: n, perm: core.PermRemoteRead}}, cachedGrants(p.tr))
		code, err = p.one(t, core.OpWrite, 0, r.Addr, n)
		require.Equal(t, status.OK, code, "%v", err)
		require.Equal(t, []standingDesc{{base: r.Addr, len: n, perm: core.PermRemoteRead}, {base: r.Addr, len: n, perm: core.PermRemoteWrite}},
			cachedGrants(p.tr), "a write grant beside the read one")
		require.EqualValues(t, 2, p.ttr.Stats()["grants"])
		hits := p.tr.Stats()["grant_hits"]
		for _, op := range []core.Op{core.OpRead, core.OpWrite} {
			code, err = p.one(t, op, 0, r.Addr, n)
			require.Equal(t, status.OK, code, "%v", err)
		}
		require.Equal(t, hits+2, p.tr.Stats()["grant_hits"])
		// Past the region's end: a miss, refused by the target.
		code, err = p.one(t, core.OpRead, 0, r.Addr+n-8, 16)
		require.NotEqual(t, status.OK, code, "%v", err)
		require.Equal(t, hits+2, p.tr.Stats()["grant_hits"])
	})

	t.Run("on the wire", func(t *testing.T) {
		target, ttr := newEngine(t, core.Options{})
		ro := make([]byte, n)
		rr, err := target.Register(core.RegionDesc{Addr: host.Addr(ro), Len: n}, core.PermRemoteRead)
		require.NoError(t, err)
		wo := make([]byte, n)
		rw2, err := target.Register(core.RegionDesc{Addr: host.Addr(wo), Len: n}, core.PermRemoteWrite)
		require.NoError(t, err)
		rc, err := dialRaw(t, ttr.addr, nil)
		require.NoError(t, err)
		h, ents := rc.leaseCached(t, 1,
			leaseEntry{Op: core.OpRead, Addr: rr.Addr + 100, Len: 10},
			leaseEntry{Op: core.OpWrite, Addr: rr.Addr, Len: 10}, // refused
			leaseEntry{Op: core.OpWrite, Addr: rw2.Addr + 1, Len: 1},
			leaseEntry{Op: core.OpRead, Addr: rw2.Addr, Len: 10},   // refused
			leaseEntry{Op: core.OpRead, Addr: rr.Addr, Len: 2 * n}, // refused: out of range
		)
		require.Equal(t, []status.Code{status.OK, status.PermissionDenied, status.OK, status.PermissionDenied, status.OutOfRange},
			[]status.Code{ents[0].code, ents[1].code, ents[2].code, ents[3].code, ents[4].code})
		for i := range h.standing {
			h.standing[i].id = 0
		}
		require.Equal(t, []standingDesc{{base: rr.Addr, len: n, perm: core.PermRemoteRead},
			{base: rw2.Addr, len: n, perm: core.PermRemoteWrite}}, h.standing)
		rc.release(t, 1)
		// Asking again for what is held brings no new grant.
		h, _ = rc.leaseCached(t, 2, leaseEntry{Op: core.OpRead, Addr: rr.Addr, Len: n})
		require.Empty(t, h.standing)
		rc.release(t, 2)
		require.EqualValues(t, 2, ttr.Stats()["grants"])
		runtime.KeepAlive(ro)
		runtime.KeepAlive(wo)
	})
}

// onlyConn is tr's one client connection.
func onlyConn(t *testing.T, tr *Transport) *conn {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Len(t, tr.conns, 1)
	for c := range tr.conns {
		return c
	}
	return nil
}

// cachedGrants lists tr's standing grants (ids cleared), in lookup order.
func cachedGrants(tr *Transport) []standingDesc {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []standingDesc
	for c := range tr.conns {
		c.gmu.Lock()
		for _, g := range c.grants {
			d := g.standingDesc
			d.id = 0
			out = append(out, d)
		}
		c.gmu.Unlock()
	}
	return out
}

// leaseCached sends a LEASE_CACHED for ents and returns the cached grant.
func (rc *rawClient) leaseCached(t testing.TB, id uint64, ents ...leaseEntry) (grantHead, []grantEntry) {
	t.Helper()
	reqs := make([]*core.Request, len(ents))
	for i, en := range ents {
		reqs[i] = &core.Request{Op: en.Op, Remote: en.Addr, Len: en.Len}
	}
	_, err := rc.c.Write(appendLeaseFrame(nil, frameLeaseCached, id, time.Minute, reqs))
	require.NoError(t, err)
	typ, payload := rc.read(t)
	require.Equal(t, frameGrantCached, typ)
	d := wire.NewDecoder(payload)
	var h grantHead
	decodeGrantHead(&d, &h)
	decodeStanding(&d, &h)
	require.NoError(t, d.Err())
	fds, err := rc.fr.Take(len(h.fds))
	require.NoError(t, err)
	rc.fr.Close(fds)
	out := make([]grantEntry, len(ents))
	require.NoError(t, decodeGrantEntries(payload[d.Offset():], out))
	require.Equal(t, id, h.id)
	return h, out
}

// Many goroutines move and check data while another unregisters and
// registers the target's regions in a loop: every byte read back is the
// byte written whenever the region stayed registered in between, nothing
// lands in a region after its Unregister returned (a canary written then
// stays intact), and every count returns to zero.
func TestGrantStress(t *testing.T) {
	const (
		slots   = 3
		workers = 4
		piece   = 4096
		reqs    = 4 // per batch
		span    = workers * reqs * piece
		cycles  = 200
	)
	p := newGrantPair(t, core.Options{}, 2*workers*reqs*piece)
	type slot struct {
		mem   []byte
		reg   *core.Region // the registrar's
		epoch atomic.Int64 // odd from before Unregister to after Register
	}
	var ss [slots]*slot
	for i := range ss {
		ss[i] = &slot{mem: make([]byte, span)}
		r, err := p.target.Register(core.RegionDesc{Addr: host.Addr(ss[i].mem), Len: span}, rw)
		require.NoError(t, err)
		ss[i].reg = r
	}
	var (
		stop      atomic.Bool
		batches   atomic.Int64
		checked   atomic.Int64
		mu        sync.Mutex
		outcomes  = map[status.Code]int{}
		wg        sync.WaitGroup
		failures  atomic.Int64
		firstFail atomic.Pointer[string]
	)
	report := func(format string, a ...any) {
		if failures.Add(1) == 1 {
			s := fmt.Sprintf(format, a...)
			firstFail.Store(&s)
		}
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := p.local[w*reqs*piece : (w+1)*reqs*piece]
			in := p.local[(workers+w)*reqs*piece : (workers+w+1)*reqs*piece]
			for round := 0; !stop.Load(); round++ {
				s := ss[round%slots]
				base := host.Addr(s.mem) + uint64(w*reqs*piece)
				copy(out, peertest.Pattern(int64(w*1000+round), uint64(len(out))))
				ep := s.epoch.Load()
				mk := func(op core.Op, buf []byte) []core.TransferRequest {
					var rs []core.TransferRequest
					for k := 0; k < reqs; k++ {
						rs = append(rs, core.TransferRequest{Op: op, Local: host.Addr(buf) + uint64(k*piece), Segment: p.seg,
							Remote: base + uint64(k*piece), Len: piece})
					}
					return rs
				}
				wc, wst, _ := run(t, p.e, mk(core.OpWrite, out), core.TransferOptions{})
				clear(in)
				rc, rst, _ := run(t, p.e, mk(core.OpRead, in), core.TransferOptions{})
				batches.Add(2)
				mu.Lock()
				for _, st := range append(wst, rst...) {
					outcomes[st.Code]++
					if st.Code != status.OK && st.Code != status.NotRegistered {
						report("request ended with %v", st.Code)
					}
				}
				mu.Unlock()
				if wc == status.OK && rc == status.OK && ep%2 == 0 && s.epoch.Load() == ep {
					if !bytes.Equal(in, out) {
						report("worker %d round %d: read back differs from what was written", w, round)
					}
					checked.Add(int64(len(in)))
				}
			}
		}()
	}

	canary := bytes.Repeat([]byte{0xC5}, span)
	for c := 0; c < cycles && failures.Load() == 0; c++ {
		s := ss[c%slots]
		s.epoch.Add(1)
		require.NoError(t, p.target.Unregister(s.reg))
		copy(s.mem, canary)
		// Let the workers run at this slot's hole: they go round the slots.
		seen := batches.Load()
		require.Eventually(t, func() bool { return batches.Load() >= seen+2*slots }, time.Minute, time.Millisecond)
		if !bytes.Equal(s.mem, canary) {
			report("cycle %d: memory written after Unregister returned", c)
		}
		r, err := p.target.Register(core.RegionDesc{Addr: host.Addr(s.mem), Len: span}, rw)
		require.NoError(t, err)
		s.reg = r
		s.epoch.Add(1)
	}
	stop.Store(true)
	wg.Wait()
	if f := firstFail.Load(); f != nil {
		t.Fatalf("%d failures; first: %s", failures.Load(), *f)
	}
	st := p.tr.Stats()
	t.Logf("outcomes %v, %d bytes checked, initiator stats: hits %d misses %d revoked %d; target: revokes %d/%d acked, %d timeouts",
		outcomes, checked.Load(), st["grant_hits"], st["grant_misses"], st["grants_revoked"],
		p.ttr.Stats()["revokes_acked"], p.ttr.Stats()["revokes_sent"], p.ttr.Stats()["revoke_timeouts"])
	require.Positive(t, checked.Load())
	require.Positive(t, st["grant_hits"])
	require.Positive(t, st["grants_revoked"])
	require.Zero(t, p.ttr.Stats()["revoke_timeouts"])

	// Unregistering everything takes every grant back.
	for _, s := range ss {
		require.NoError(t, p.target.Unregister(s.reg))
	}
	require.Zero(t, p.ttr.Stats()["grants"])
	require.Zero(t, p.tr.Stats()["grants_cached"])
	require.Zero(t, p.ttr.Stats()["leases"])
	require.NoError(t, p.e.Uninstall("shm"))
	require.NoError(t, p.target.Uninstall("shm"))
	requireIdle(t, p.tr, false)
	requireIdle(t, p.ttr, false)
	for _, s := range ss {
		runtime.KeepAlive(s.mem)
	}
}

// The target's Uninstall takes its standing grants back like Unregister:
// it waits for a copy parked under one, and the initiator acknowledges.
func TestGrantRevokedOnUninstall(t *testing.T) {
	const n = 4096
	p := newGrantPair(t, core.Options{}, n)
	mem, r := p.heapRegion(t, n, rw, 0)
	code, err := p.one(t, core.OpWrite, 0, r.Addr, n)
	require.Equal(t, status.OK, code, "%v", err)
	require.EqualValues(t, 1, p.ttr.Stats()["grants"])

	entered, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(let)
	hook := func() {
		entered <- struct{}{}
		<-release
	}
	p.tr.hooks.noInline.Store(true) // a job copies: Submit returns with the copy parked
	p.tr.hooks.inCachedCopy.Store(&hook)
	copy(p.local, peertest.Pattern(6, n))
	b, err := p.e.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(p.local), Segment: p.seg,
		Remote: r.Addr, Len: n}}, core.TransferOptions{})
	require.NoError(t, err)
	<-entered
	p.tr.hooks.inCachedCopy.Store(nil)

	uninstalled := make(chan error, 1)
	go func() { uninstalled <- p.target.Uninstall("shm") }()
	require.Eventually(t, func() bool { return p.ttr.Stats()["revokes_sent"] == 1 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-uninstalled:
		t.Fatalf("Uninstall returned (%v) while a copy under a grant was parked", err)
	default:
	}
	let()
	code, werr := b.Wait(10 * time.Second)
	require.Equal(t, status.OK, code, "%v", werr)
	p.e.ReleaseBatch(b)
	require.NoError(t, <-uninstalled)
	require.Equal(t, peertest.Pattern(6, n), mem)
	st := p.ttr.Stats()
	require.EqualValues(t, 1, st["revokes_acked"])
	require.Zero(t, st["revoke_timeouts"])
	requireIdle(t, p.ttr, false)
	require.Eventually(t, func() bool { return p.tr.Stats()["grants_cached"] == 0 }, 10*time.Second, time.Millisecond)
}
