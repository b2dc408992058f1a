//go:build linux

package shm

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/testenv"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// The peer frees its allocation and allocates a new one (often at the same
// address): nothing is read through the old mapping, which is unmapped —
// on the target's revoke, or, when revokes are lost, by the descriptor
// check before the next lease.
func TestMappingCacheInvalidation(t *testing.T) {
	for _, mode := range []string{"revoke", "descriptor-check"} {
		t.Run(mode, func(t *testing.T) {
			const size = 1 << 20
			peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw, Alloc: true})
			e, tr := newEngine(t, core.Options{})
			if mode == "descriptor-check" {
				tr.hooks.ignoreRevoke.Store(true)
			}
			seg := openSeg(t, e, peer.Name)
			local := localBuf(t, e, size)
			read := func(addr uint64) {
				t.Helper()
				code, st, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local),
					Segment: seg, Remote: addr, Len: size}}, core.TransferOptions{})
				require.Equal(t, status.OK, code, "%v", err)
				require.Equal(t, ID, st[0].Transport)
			}
			old := peer.Buffers[0].Addr
			read(old)
			require.Equal(t, peertest.Pattern(0, size), local)
			require.EqualValues(t, 1, tr.Stats()["mappings"])
			mapped := tr.Stats()["bytes_mapped"]

			ans, err := peer.Cmd("realloc 0 77")
			require.NoError(t, err)
			var addr, id uint64
			_, err = fmt.Sscan(ans, &addr, &id)
			require.NoError(t, err)
			t.Logf("old allocation at %#x, new one (id %d) at %#x; same address: %v", old, id, addr, addr == old)
			want := peertest.Pattern(77, size)
			if mode == "revoke" {
				require.Eventually(t, func() bool { return tr.Stats()["mappings"] == 0 }, 5*time.Second, time.Millisecond,
					"the revoke unmaps the freed allocation")
				require.EqualValues(t, 1, tr.Stats()["revoked"])
				read(addr)
				require.Equal(t, want, local)
			} else {
				// The pushed descriptor change reaches the initiator
				// asynchronously; every read is right meanwhile, and the
				// old mapping goes at the first lease after it.
				require.Eventually(t, func() bool {
					read(addr)
					require.Equal(t, want, local)
					return tr.Stats()["invalidated"] == 1
				}, 5*time.Second, 10*time.Millisecond)
				require.Zero(t, tr.Stats()["revoked"])
			}
			require.EqualValues(t, 1, tr.Stats()["mappings"], "only the new allocation is mapped")
			require.Greater(t, tr.Stats()["bytes_mapped"], mapped, "read through the new mapping")

			// Writes land in the new allocation too.
			copy(local, peertest.Pattern(5, size))
			code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local),
				Segment: seg, Remote: addr, Len: size}}, core.TransferOptions{})
			require.Equal(t, status.OK, code, "%v", err)
			require.Equal(t, peertest.Sum(local), sum(t, peer, 0))
		})
	}
}

// When the kernel refuses process_vm, the request is served by the next
// transport (tcp) with the RETRIED flag; the peer's memfd allocation still
// goes through shm, and later batches skip shm for process_vm memory.
func TestFallbackWhenProcessVMRefused(t *testing.T) {
	hook := func(core.Op) error { return unix.EPERM }
	const size = 1 << 20
	peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw}, peertest.Buffer{Size: size, Perm: rw, Alloc: true},
		peertest.Buffer{Size: size, Perm: core.PermRemoteRead, Alloc: true})
	e, tr := newEngine(t, core.Options{}, "tcp")
	tr.hooks.processVM.Store(&hook)
	seg := openSeg(t, e, peer.Name)
	local := localBuf(t, e, 2*size)
	code, st, err := run(t, e, []core.TransferRequest{
		{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[0].Addr, Len: size},
		{Op: core.OpWrite, Local: host.Addr(local) + size, Segment: seg, Remote: peer.Buffers[1].Addr, Len: size},
	}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size, Flags: core.FlagRetried}, st[0])
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: ID, Bytes: size}, st[1])
	require.Equal(t, peertest.Sum(local[:size]), sum(t, peer, 0))
	require.Equal(t, peertest.Sum(local[size:]), sum(t, peer, 1))
	require.EqualValues(t, 1, tr.Stats()["fallbacks"])

	// The refusal is remembered: tcp directly, no retry.
	clear(local)
	code, st, err = run(t, e, []core.TransferRequest{
		{Op: core.OpRead, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[0].Addr, Len: size},
	}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size}, st[0])
	require.Equal(t, sum(t, peer, 0), peertest.Sum(local[:size]))
	require.EqualValues(t, 1, tr.Stats()["fallbacks"])

	// So does a read-only allocation: it never gets a memfd, so it is
	// process_vm memory too.
	code, st, err = run(t, e, []core.TransferRequest{
		{Op: core.OpRead, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[2].Addr, Len: size},
	}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, core.RequestStatus{Code: status.OK, Transport: tcp.ID, Bytes: size}, st[0])
	require.Equal(t, peertest.Pattern(2, size), local[:size])
	require.EqualValues(t, 1, tr.Stats()["fallbacks"])
}

// kill -9 of the peer while batches run: every request ends by its
// deadline (never a hang), the transport lets go of everything it had for
// that peer, and a peer restarted at the same address is reached with
// fresh state on the next batches.
func TestPeerKilledMidBatch(t *testing.T) {
	const size = 8 << 20
	addr := testenv.ServerAddr(t) // restarted at the same address
	cfg := peertest.Config{Transports: []string{"shm"}, ListenAddr: addr, Buffers: []peertest.Buffer{
		{Size: size, Perm: rw}, {Size: size, Perm: rw, Alloc: true}}}
	peer := peertest.Start(t, cfg)
	const timeout = 3 * time.Second
	e, tr := newEngine(t, core.Options{DefaultTimeout: timeout})
	seg := openSeg(t, e, addr)
	local := localBuf(t, e, 2*size)
	batch := func(w uint64) []core.TransferRequest {
		var reqs []core.TransferRequest
		for i := uint64(0); i < 64; i++ {
			reqs = append(reqs, core.TransferRequest{Op: core.Op(i % 2), Local: host.Addr(local) + w*size + i*(size/64),
				Segment: seg, Remote: peer.Buffers[(i/2)%2].Addr + i*(size/64), Len: size / 64})
		}
		return reqs
	}
	reqs := batch(0)
	code, _, err := run(t, e, reqs, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)

	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		mu      sync.Mutex
		seen    = map[status.Code]int{}
		slowest time.Duration
		batches atomic.Int64 // ended
	)
	for w := uint64(0); w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := batch(w) // each worker reads into its own local memory
			for !stop.Load() {
				start := time.Now()
				b, err := e.Submit(reqs, core.TransferOptions{})
				if err != nil {
					t.Errorf("submit: %v", err)
					return
				}
				b.Wait(timeout + 2*time.Second)
				st := make([]core.RequestStatus, b.Len())
				_, done, _ := b.Status(st)
				el := time.Since(start)
				e.ReleaseBatch(b)
				mu.Lock()
				if done != b.Len() {
					seen[status.Pending]++
				}
				for _, s := range st {
					seen[s.Code]++
				}
				slowest = max(slowest, el)
				mu.Unlock()
				batches.Add(1)
			}
		}()
	}
	// Both workers are moving data when the peer dies, and go on until
	// their batches have seen it.
	require.Eventually(t, func() bool { return batches.Load() >= 4 }, time.Minute, time.Millisecond)
	peer.Kill()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[status.TransportError]+seen[status.Timeout] > 0
	}, time.Minute, time.Millisecond, "the kill was never noticed")
	stop.Store(true)
	wg.Wait()
	t.Logf("request outcomes: %v; slowest batch %v", seen, slowest)
	for c := range seen {
		require.Contains(t, []status.Code{status.OK, status.TransportError, status.Timeout}, c)
	}
	require.Positive(t, seen[status.TransportError]+seen[status.Timeout], "the kill was noticed")
	require.Less(t, slowest, timeout+time.Second, "every batch ended by its deadline")
	requireIdle(t, tr, true) // connection, mappings, received descriptors: gone

	// Restart at the same address: a new incarnation, reached afresh.
	peer = peertest.Start(t, cfg)
	reqs = batch(0) // its buffers are elsewhere
	require.Eventually(t, func() bool {
		b, err := e.Submit(reqs, core.TransferOptions{})
		require.NoError(t, err)
		defer e.ReleaseBatch(b)
		c, err := b.Wait(timeout + 2*time.Second)
		if c != status.OK {
			t.Logf("after the restart: %v", err)
		}
		return c == status.OK
	}, 10*time.Second, 50*time.Millisecond)
	// Request 1 wrote local[size/64, 2*size/64) to buffer 0 at size/64.
	require.Equal(t, peertest.Sum(local[size/64:2*size/64]), peertestSum(t, peer, 0, size/64, 2*size/64))
	st := tr.Stats()
	require.EqualValues(t, 1, st["connections"])
	require.EqualValues(t, 1, st["mappings"])
}

// peertestSum is the sha256 of [lo, hi) of the peer's buffer i, read back
// through a fresh engine (the peer reports whole buffers only).
func peertestSum(t *testing.T, p *peertest.Peer, i int, lo, hi uint64) string {
	t.Helper()
	e, _ := newEngine(t, core.Options{})
	seg := openSeg(t, e, p.Name)
	buf := localBuf(t, e, int(hi-lo))
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(buf), Segment: seg,
		Remote: p.Buffers[i].Addr + lo, Len: hi - lo}}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	return peertest.Sum(buf)
}

// allCanceled reports whether tr has jobs and Cancel marked every request
// of each.
func allCanceled(tr *Transport) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for j := range tr.jobs {
		for i := range j.cancel {
			if !j.cancel[i].Load() {
				return false
			}
		}
	}
	return len(tr.jobs) > 0
}

// Canceling a batch: requests not yet copied complete with ErrCanceled
// (nothing reaches the peer), whether the job holds its lease or still
// waits for the grant; a grant that arrives for nobody is released.
func TestCancel(t *testing.T) {
	t.Run("holding the lease", func(t *testing.T) {
		const size = 1 << 20
		peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw}, peertest.Buffer{Size: size, Perm: rw, Alloc: true})
		e, tr := newEngine(t, core.Options{})
		seg := openSeg(t, e, peer.Name)
		local := localBuf(t, e, 2*size)
		entered, release := make(chan struct{}, 1), make(chan struct{})
		hook := func() {
			entered <- struct{}{}
			<-release
		}
		tr.hooks.beforeCopy.Store(&hook)
		var reqs []core.TransferRequest
		for i := uint64(0); i < 32; i++ {
			reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(local) + i*(size/16),
				Segment: seg, Remote: peer.Buffers[i%2].Addr + (i/2)*(size/16), Len: size / 16})
		}
		b, err := e.Submit(reqs, core.TransferOptions{})
		require.NoError(t, err)
		<-entered
		tr.hooks.beforeCopy.Store(nil)
		// Cancel waits for the job, which is held before its copy: let it go
		// once Cancel has marked every request, never before.
		canceled := make(chan bool, 1)
		go func() { canceled <- b.Cancel() }()
		require.Eventually(t, func() bool { return allCanceled(tr) }, 10*time.Second, time.Millisecond)
		close(release)
		require.True(t, <-canceled, "the transport let go of every request")
		st := make([]core.RequestStatus, b.Len())
		b.Status(st)
		for i := range st {
			require.Equal(t, status.Canceled, st[i].Code)
		}
		e.ReleaseBatch(b)
		require.Equal(t, peertest.Sum(peertest.Pattern(0, size)), sum(t, peer, 0), "nothing written")
		require.Equal(t, peertest.Sum(peertest.Pattern(1, size)), sum(t, peer, 1), "nothing written")
		require.Zero(t, tr.Stats()["bytes"])
		require.Eventually(t, func() bool {
			st := tr.Stats()
			return st["jobs"] == 0 && st["leases"] == 0 && st["fds"] == 0 && st["goroutines"] == 2 // the accept loop and the reader
		}, 5*time.Second, time.Millisecond)
	})

	t.Run("waiting for the grant", func(t *testing.T) {
		target, ttr := newEngine(t, core.Options{})
		remote := make([]byte, 4096)
		_, err := target.Register(core.RegionDesc{Addr: host.Addr(remote), Len: 4096}, rw)
		require.NoError(t, err)
		e, tr := newEngine(t, core.Options{})
		seg := openSeg(t, e, target.Name())
		local := localBuf(t, e, 4096)
		entered, release := make(chan struct{}, 1), make(chan struct{})
		hook := func() {
			entered <- struct{}{}
			<-release
		}
		ttr.hooks.grant.Store(&hook)
		b, err := e.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg,
			Remote: host.Addr(remote), Len: 4096}}, core.TransferOptions{})
		require.NoError(t, err)
		<-entered
		ttr.hooks.grant.Store(nil)
		require.True(t, b.Cancel())
		e.ReleaseBatch(b)
		close(release) // the grant comes now, for nobody: it is released
		require.Eventually(t, func() bool {
			return tr.Stats()["orphan_grants"] == 1 && ttr.Stats()["leases"] == 0
		}, 5*time.Second, time.Millisecond)
		require.Equal(t, make([]byte, 4096), remote, "nothing written")
	})
}

// Uninstall, then engine Close, while transfers run from other goroutines:
// no crash, every batch ends, and the transport's counts, the process's
// descriptors, mappings and goroutines all return to their baselines.
func TestTeardownWhileTransfersRun(t *testing.T) {
	const size = 8 << 20
	peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw}, peertest.Buffer{Size: size, Perm: rw, Alloc: true})
	local := make([]byte, 2*size) // one half per hammering goroutine
	allowed := []status.Code{status.OK, status.Closed, status.Canceled, status.Unsupported, status.TransportError}

	hammer := func(t *testing.T, e *core.Engine, seg *core.Segment) (stop func() map[status.Code]int) {
		batch := func(w uint64) []core.TransferRequest {
			var reqs []core.TransferRequest
			for i := uint64(0); i < 16; i++ {
				reqs = append(reqs, core.TransferRequest{Op: core.Op(i % 2), Local: host.Addr(local) + w*size + i*(size/16),
					Segment: seg, Remote: peer.Buffers[(i/2)%2].Addr + (i/4)*(size/16), Len: size / 16})
			}
			return reqs
		}
		var (
			wg   sync.WaitGroup
			halt atomic.Bool
			mu   sync.Mutex
			seen = map[status.Code]int{}
		)
		for w := uint64(0); w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				reqs := batch(w)
				for !halt.Load() {
					b, err := e.Submit(reqs, core.TransferOptions{})
					if err != nil {
						require.Contains(t, []status.Code{status.Closed, status.InvalidHandle}, status.CodeOf(err), "%v", err)
						return
					}
					b.Wait(10 * time.Second)
					st := make([]core.RequestStatus, b.Len())
					_, done, _ := b.Status(st)
					e.ReleaseBatch(b)
					mu.Lock()
					if done != b.Len() {
						seen[status.Pending]++
					}
					for _, s := range st {
						seen[s.Code]++
					}
					mu.Unlock()
				}
			}()
		}
		return func() map[status.Code]int {
			halt.Store(true)
			wg.Wait()
			return seen
		}
	}
	check := func(t *testing.T, seen map[status.Code]int) {
		t.Logf("request outcomes: %v", seen)
		require.Positive(t, seen[status.OK])
		for c := range seen {
			require.Contains(t, allowed, c)
		}
	}

	// Round 0 warms up the process (heap, threads, race shadow memory);
	// round 1 is measured.
	for round := 0; round < 2; round++ {
		base0 := counts(t)
		e, err := core.New(core.Options{Available: available(), Transports: []string{}})
		require.NoError(t, err)
		_, err = e.Register(core.RegionDesc{Addr: host.Addr(local), Len: uint64(len(local))}, rw)
		require.NoError(t, err)
		seg := openSeg(t, e, peer.Name)
		base1 := counts(t)

		tr := New()
		require.NoError(t, e.Install(tr))
		stop := hammer(t, e, seg)
		require.Eventually(t, func() bool { return tr.Stats()["bytes"] > 4*size }, 10*time.Second, time.Millisecond)
		require.EqualValues(t, 1, tr.Stats()["mappings"], "the peer's allocation is mapped while the transfers run")
		require.Equal(t, base1.memfdMaps+1, counts(t).memfdMaps)
		require.NoError(t, e.Uninstall("shm"))
		check(t, stop())
		requireIdle(t, tr, false)
		if round == 1 {
			requireBaseline(t, base1, "after Uninstall")
		}

		tr = New()
		require.NoError(t, e.Install(tr))
		stop = hammer(t, e, seg)
		require.Eventually(t, func() bool { return tr.Stats()["bytes"] > 4*size }, 10*time.Second, time.Millisecond)
		require.NoError(t, e.Close())
		check(t, stop())
		requireIdle(t, tr, false)
		if round == 1 {
			requireBaseline(t, base0, "after Close")
		}
	}
	// The peer is intact and still serves others.
	e, _ := newEngine(t, core.Options{})
	seg := openSeg(t, e, peer.Name)
	buf := localBuf(t, e, size)
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(buf), Segment: seg,
		Remote: peer.Buffers[1].Addr, Len: size}}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.True(t, bytes.Equal(buf, buf)) // content is whatever the hammer left; the read itself is the check
}

// End to end: the peer unregisters one buffer and frees its allocation;
// writes to the old addresses are refused with NotRegistered (by the
// initiator's refreshed descriptor or by the target's lease check,
// whichever sees it first) and nothing is written.
func TestWriteAfterPeerUnregistered(t *testing.T) {
	const size = 64 << 10
	peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw}, peertest.Buffer{Size: size, Perm: rw, Alloc: true})
	e, tr := newEngine(t, core.Options{})
	seg := openSeg(t, e, peer.Name)
	local := localBuf(t, e, size)
	reqs := []core.TransferRequest{
		{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[0].Addr + 1, Len: size - 1},
		{Op: core.OpWrite, Local: host.Addr(local), Segment: seg, Remote: peer.Buffers[1].Addr + 1, Len: size - 1},
	}
	code, _, err := run(t, e, []core.TransferRequest{reqs[0], reqs[1]}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.EqualValues(t, 1, tr.Stats()["mappings"])
	require.NoError(t, firstErr(peer.Cmd("fill 0 3")))
	_, err = peer.Cmd("unregister 0")
	require.NoError(t, err)
	_, err = peer.Cmd("free 1")
	require.NoError(t, err)
	for _, r := range reqs {
		code, st, err := run(t, e, []core.TransferRequest{r}, core.TransferOptions{})
		require.Equal(t, status.NotRegistered, code, "%v", err)
		require.Equal(t, status.NotRegistered, st[0].Code)
		require.Zero(t, st[0].Flags, "not retried elsewhere")
	}
	require.Equal(t, peertest.Sum(peertest.Pattern(3, size)), sum(t, peer, 0), "nothing written")
	require.Eventually(t, func() bool { return tr.Stats()["mappings"] == 0 }, 5*time.Second, time.Millisecond,
		"the freed allocation is unmapped here too")
}

func firstErr(_ string, err error) error { return err }
