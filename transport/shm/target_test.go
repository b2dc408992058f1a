//go:build linux

package shm

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func setGrace(t *testing.T, d time.Duration) {
	old := leaseGrace
	leaseGrace = d
	t.Cleanup(func() { leaseGrace = old })
}

// The target decides: a peer with a stale or lying cache (here, a client
// speaking the protocol directly) gets the target's code for every entry
// it may not touch, pins what it may, and receives descriptors only for
// allocations it was granted.
func TestTargetEnforcesLeases(t *testing.T) {
	setGrace(t, 50*time.Millisecond) // before the engine: its goroutines read it
	target, tr := newEngine(t, core.Options{UnregisterTimeout: 300 * time.Millisecond})

	// Three adjacent regions of one buffer: read-write, read-write, read-only.
	heap := make([]byte, 3*4096+64)
	base := (host.Addr(heap) + 63) &^ 63
	reg := func(addr, n uint64, perm core.Perm) *core.Region {
		r, err := target.Register(core.RegionDesc{Addr: addr, Len: n}, perm)
		require.NoError(t, err)
		return r
	}
	r0 := reg(base, 4096, rw)
	r1 := reg(base+4096, 4096, rw)
	rro := reg(base+8192, 4096, core.PermRemoteRead)
	alloc := func(n uint64, perm core.Perm) *core.Region {
		r, err := target.Alloc(n, "cpu", perm)
		require.NoError(t, err)
		copy(host.Bytes(r.Addr, r.Len), bytes.Repeat([]byte{byte(r.Alloc.ID)}, int(r.Len)))
		return r
	}
	a0 := alloc(8192, rw)
	aro := alloc(4096, core.PermRemoteRead)
	awo := alloc(4096, core.PermRemoteWrite)
	staleBuf := make([]byte, 4096)
	stale := reg(host.Addr(staleBuf), 4096, rw)
	require.NoError(t, target.Unregister(stale))
	before := append([]byte(nil), heap...)

	rc, err := dialRaw(t, tr.addr, nil)
	require.NoError(t, err)

	t.Run("refusals", func(t *testing.T) {
		other := make([]byte, 64)
		h, g, fds := rc.lease(t, 1, time.Second,
			leaseEntry{Op: core.OpRead, Addr: stale.Addr, Len: 8},        // unregistered since the cache was filled
			leaseEntry{Op: core.OpWrite, Addr: host.Addr(other), Len: 8}, // never registered
			leaseEntry{Op: core.OpWrite, Addr: r0.Addr + 4090, Len: 16},  // spans r0 and r1
			leaseEntry{Op: core.OpRead, Addr: rro.Addr + 4000, Len: 200}, // runs past the last region
			leaseEntry{Op: core.OpWrite, Addr: rro.Addr, Len: 8},         // read-only region
			leaseEntry{Op: core.OpRead, Addr: awo.Addr, Len: 8},          // write-only allocation
			leaseEntry{Op: core.OpWrite, Addr: aro.Addr, Len: 8},         // read-only allocation
			leaseEntry{Op: core.OpRead, Addr: r0.Addr, Len: 0},           // empty
		)
		want := []status.Code{status.NotRegistered, status.NotRegistered, status.OutOfRange, status.OutOfRange,
			status.PermissionDenied, status.PermissionDenied, status.PermissionDenied, status.InvalidArgument}
		for i, c := range want {
			require.Equal(t, c, g[i].code, "entry %d: %s", i, g[i].msg)
			require.NotEmpty(t, g[i].msg)
		}
		require.Empty(t, h.fds)
		require.Empty(t, fds)
		require.Zero(t, tr.Stats()["leases"], "nothing granted, nothing held")
		require.Equal(t, before, heap, "nothing written")
	})

	t.Run("descriptors only for granted allocations", func(t *testing.T) {
		h, g, fds := rc.lease(t, 2, 10*time.Second,
			leaseEntry{Op: core.OpRead, Addr: a0.Addr + 1, Len: 100},
			leaseEntry{Op: core.OpWrite, Addr: aro.Addr, Len: 8}, // refused: no descriptor for it either
			leaseEntry{Op: core.OpWrite, Addr: awo.Addr, Len: 8}, // granted, but a write-only mapping does not exist
			leaseEntry{Op: core.OpRead, Addr: aro.Addr, Len: 16},
			leaseEntry{Op: core.OpWrite, Addr: a0.Addr + 4096, Len: 8}, // same allocation: one descriptor
		)
		require.Equal(t, []status.Code{status.OK, status.PermissionDenied, status.OK, status.OK, status.OK},
			[]status.Code{g[0].code, g[1].code, g[2].code, g[3].code, g[4].code})
		require.Equal(t, a0.Alloc.ID, g[0].alloc)
		require.Zero(t, g[2].alloc, "write-only memory goes through process_vm")
		require.Zero(t, g[3].alloc, "read-only memory goes through process_vm: a memfd would be writable")
		require.Equal(t, a0.Alloc.ID, g[4].alloc)
		require.Equal(t, []grantFD{
			{alloc: a0.Alloc.ID, base: a0.Addr, size: a0.Alloc.Size, writable: true},
		}, h.fds)
		require.Len(t, fds, 1)
		require.EqualValues(t, 1, tr.Stats()["fds_sent"])
		defer func() {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}()
		// Its size is sealed: the receiver cannot make the target fault.
		require.ErrorIs(t, unix.Ftruncate(fds[0], 0), unix.EPERM)
		require.ErrorIs(t, unix.Ftruncate(fds[0], 1<<20), unix.EPERM)
		// Nor add seals: F_SEAL_FUTURE_WRITE would keep other peers from
		// mapping it writable.
		_, err := unix.FcntlInt(uintptr(fds[0]), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
		require.ErrorIs(t, err, unix.EPERM)
		// The writable one is the target's memory.
		m, err := unix.Mmap(fds[0], 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		require.NoError(t, err)
		m[100] = 0xAB
		require.Equal(t, byte(0xAB), host.Bytes(a0.Addr, 8192)[100])
		require.NoError(t, unix.Munmap(m))

		// The lease pins a0: freeing it waits, then fails Busy.
		require.EqualValues(t, 1, tr.Stats()["leases"])
		require.ErrorIs(t, target.Free(a0), status.ErrBusy)
		rc.release(t, 2)
		require.Eventually(t, func() bool { return tr.Stats()["leases"] == 0 }, 5*time.Second, time.Millisecond)
		require.NoError(t, target.Free(a0))
		// The descriptor's receiver is told to unmap it.
		typ, payload := rc.read(t)
		require.Equal(t, frameRevoke, typ)
		ids, err := decodeRevoke(payload, nil)
		require.NoError(t, err)
		require.Equal(t, []uint64{a0.Alloc.ID}, ids)

		// A stale cache of the freed allocation gets nothing; a granted
		// allocation already sent is named without a second descriptor.
		h, g, fds2 := rc.lease(t, 3, time.Minute,
			leaseEntry{Op: core.OpRead, Addr: a0.Addr, Len: 8}, leaseEntry{Op: core.OpRead, Addr: aro.Addr, Len: 8})
		require.Equal(t, status.NotRegistered, g[0].code)
		require.Equal(t, status.OK, g[1].code)
		require.Zero(t, g[1].alloc)
		require.Empty(t, h.fds)
		require.Empty(t, fds2)
		rc.release(t, 3)
	})

	t.Run("closing the connection releases its leases", func(t *testing.T) {
		rc2, err := dialRaw(t, tr.addr, nil)
		require.NoError(t, err)
		_, g, _ := rc2.lease(t, 1, time.Minute, leaseEntry{Op: core.OpWrite, Addr: r0.Addr, Len: 8})
		require.Equal(t, status.OK, g[0].code)
		require.ErrorIs(t, target.Unregister(r0), status.ErrBusy)
		require.NoError(t, rc2.c.Close())
		require.Eventually(t, func() bool { return tr.Stats()["leases"] == 0 }, 5*time.Second, time.Millisecond)
		require.NoError(t, target.Unregister(r0))
	})

	t.Run("an expired lease is taken back", func(t *testing.T) {
		expired := tr.Stats()["leases_expired"]
		_, g, _ := rc.lease(t, 4, 20*time.Millisecond, leaseEntry{Op: core.OpWrite, Addr: r1.Addr, Len: 8})
		require.Equal(t, status.OK, g[0].code)
		// Never released: ttl plus grace later the target lets go.
		require.Eventually(t, func() bool { return tr.Stats()["leases"] == 0 }, 5*time.Second, time.Millisecond)
		require.Equal(t, expired+1, tr.Stats()["leases_expired"])
		require.NoError(t, target.Unregister(r1))
		rc.release(t, 4) // late: ignored
	})

	t.Run("a lease longer than the target allows is capped", func(t *testing.T) {
		h, g, _ := rc.lease(t, 5, time.Duration(1<<62), leaseEntry{Op: core.OpRead, Addr: rro.Addr, Len: 8})
		require.Equal(t, status.OK, g[0].code)
		require.Equal(t, target.Options().DefaultTimeout, h.ttl)
		rc.release(t, 5)
	})

	t.Run("garbage closes the connection", func(t *testing.T) {
		rc3, err := dialRaw(t, tr.addr, nil)
		require.NoError(t, err)
		_, g, _ := rc3.lease(t, 1, time.Minute, leaseEntry{Op: core.OpRead, Addr: rro.Addr, Len: 8})
		require.Equal(t, status.OK, g[0].code)
		bad := appendLease(nil, 2, time.Second, []*core.Request{{Op: 7, Remote: rro.Addr, Len: 8}})
		_, err = rc3.c.Write(bad)
		require.NoError(t, err)
		_ = rc3.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err = wire.ReadFrame(rc3.fr, maxFrame, nil)
		require.ErrorIs(t, err, status.ErrClosed, "the target hangs up")
		require.Eventually(t, func() bool { return tr.Stats()["leases"] == 0 }, 5*time.Second, time.Millisecond)
	})

	// Everything given out above is back: uninstalling leaves nothing.
	require.NoError(t, target.Uninstall("shm"))
	requireIdle(t, tr, false)

	// Uninstall does not pull memory from under a granted copy: it refuses
	// new leases and waits for the held ones (at most UnregisterTimeout,
	// here longer than any test run, so that the wait ends with the
	// release however slow the machine).
	patient, ptr := newEngine(t, core.Options{UnregisterTimeout: time.Hour})
	ro := make([]byte, 64)
	_, err = patient.Register(core.RegionDesc{Addr: host.Addr(ro), Len: 64}, core.PermRemoteRead)
	require.NoError(t, err)
	prc, err := dialRaw(t, ptr.addr, nil)
	require.NoError(t, err)
	_, g, _ := prc.lease(t, 6, time.Minute, leaseEntry{Op: core.OpRead, Addr: host.Addr(ro), Len: 8})
	require.Equal(t, status.OK, g[0].code)
	done := make(chan time.Time, 1)
	go func() {
		_ = patient.Uninstall("shm")
		done <- time.Now()
	}()
	require.Eventually(t, func() bool { return ptr.closing.Load() }, 10*time.Second, time.Millisecond)
	_, g, _ = prc.lease(t, 7, time.Minute, leaseEntry{Op: core.OpRead, Addr: host.Addr(ro), Len: 8})
	require.Equal(t, status.Closed, g[0].code, "no new leases while shutting down")
	time.Sleep(50 * time.Millisecond) // a chance to return early; any length does
	released := time.Now()
	prc.release(t, 6)
	require.True(t, (<-done).After(released), "Uninstall waited for the release")
	requireIdle(t, ptr, false)

	// A lease that is never released holds Uninstall for UnregisterTimeout.
	target2, tr2 := newEngine(t, core.Options{UnregisterTimeout: 200 * time.Millisecond})
	held := make([]byte, 64)
	_, err = target2.Register(core.RegionDesc{Addr: host.Addr(held), Len: 64}, rw)
	require.NoError(t, err)
	rc2, err := dialRaw(t, tr2.addr, nil)
	require.NoError(t, err)
	_, g, _ = rc2.lease(t, 1, time.Minute, leaseEntry{Op: core.OpWrite, Addr: host.Addr(held), Len: 8})
	require.Equal(t, status.OK, g[0].code)
	start := time.Now()
	require.NoError(t, target2.Uninstall("shm"))
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.Less(t, time.Since(start), 5*time.Second)
	requireIdle(t, tr2, false)
}

func TestAuthentication(t *testing.T) {
	_, tr := newEngine(t, core.Options{Secret: []byte("s3cret")})
	_, err := dialRaw(t, tr.addr, []byte("guess"))
	require.ErrorIs(t, err, status.ErrAuthFailed)
	_, err = dialRaw(t, tr.addr, nil)
	require.ErrorIs(t, err, status.ErrAuthFailed)
	_, err = dialRaw(t, tr.addr, []byte("s3cret"))
	require.NoError(t, err)

	// Through the engine: the same secret works end to end, another fails.
	peer := peertest.Start(t, peertest.Config{Transports: []string{"shm"}, Secret: "s3cret",
		Buffers: []peertest.Buffer{{Size: 4096, Perm: rw}}})
	good, _ := newEngine(t, core.Options{Secret: []byte("s3cret")})
	seg := openSeg(t, good, peer.Name)
	local := localBuf(t, good, 4096)
	code, st, err := run(t, good, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
		Remote: peer.Buffers[0].Addr, Len: 4096}}, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, ID, st[0].Transport)
}
