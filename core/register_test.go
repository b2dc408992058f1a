package core_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/status"
)

const rw = core.PermRemoteRead | core.PermRemoteWrite

// newEngine returns an engine with the given fakes installed and a cleanup
// that checks the fakes saw no misuse.
func newEngine(t *testing.T, fakes ...*coretest.Fake) *core.Engine {
	t.Helper()
	e, err := core.New(core.Options{Transports: []string{}, UnregisterTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	for _, f := range fakes {
		require.NoError(t, e.Install(f))
	}
	t.Cleanup(func() {
		_ = e.Close()
		for _, f := range fakes {
			require.Empty(t, f.Misuse(), f.Name())
			require.Zero(t, f.Registered(), "%s still holds regions after close", f.Name())
		}
	})
	return e
}

func requireClean(t *testing.T, e *core.Engine, regions int) {
	t.Helper()
	require.NoError(t, e.CheckIndex())
	st := e.Stats()
	require.Equal(t, regions, st.Regions)
	require.Zero(t, st.Reservations, "reservation leaked")
}

func TestRegisterBadInput(t *testing.T) {
	e := newEngine(t, coretest.NewFake("a"))
	_, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x1000}, rw)
	require.NoError(t, err)

	tests := []struct {
		name  string
		descs []core.RegionDesc
		perm  core.Perm
		code  status.Code
	}{
		{"null address", []core.RegionDesc{{Addr: 0, Len: 16}}, rw, status.InvalidArgument},
		{"zero length", []core.RegionDesc{{Addr: 0x9000, Len: 0}}, rw, status.InvalidArgument},
		{"overflow", []core.RegionDesc{{Addr: ^uint64(0) - 10, Len: 11}}, rw, status.InvalidArgument},
		{"unknown flags", []core.RegionDesc{{Addr: 0x9000, Len: 16}}, 0x80, status.InvalidArgument},
		{"bad location", []core.RegionDesc{{Addr: 0x9000, Len: 16, Location: "tpu:0"}}, rw, status.InvalidArgument},
		{"bad device", []core.RegionDesc{{Addr: 0x9000, Len: 16, Location: "cuda:x"}}, rw, status.InvalidArgument},
		{"negative device", []core.RegionDesc{{Addr: 0x9000, Len: 16, Location: "cpu:-1"}}, rw, status.InvalidArgument},
		{"empty batch", nil, rw, status.InvalidArgument},
		{"duplicate in batch", []core.RegionDesc{{Addr: 0x9000, Len: 16}, {Addr: 0x9000, Len: 16}}, rw, status.InvalidArgument},
		{"overlap in batch", []core.RegionDesc{{Addr: 0x9000, Len: 16}, {Addr: 0x9008, Len: 16}}, rw, status.InvalidArgument},
		{"exact duplicate", []core.RegionDesc{{Addr: 0x1000, Len: 0x1000}}, rw, status.AlreadyRegistered},
		{"overlap start", []core.RegionDesc{{Addr: 0x800, Len: 0x801}}, rw, status.Overlap},
		{"overlap end", []core.RegionDesc{{Addr: 0x1fff, Len: 2}}, rw, status.Overlap},
		{"inside", []core.RegionDesc{{Addr: 0x1100, Len: 1}}, rw, status.Overlap},
		{"covering", []core.RegionDesc{{Addr: 0x100, Len: 0x10000}}, rw, status.Overlap},
		{"batch with one overlap", []core.RegionDesc{{Addr: 0x9000, Len: 16}, {Addr: 0x1000, Len: 8}}, rw, status.Overlap},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.RegisterBatch(tc.descs, tc.perm)
			require.Error(t, err)
			require.Equal(t, tc.code, status.CodeOf(err), err.Error())
			requireClean(t, e, 1)
		})
	}

	t.Run("adjacent is fine", func(t *testing.T) {
		rs, err := e.RegisterBatch([]core.RegionDesc{{Addr: 0x800, Len: 0x800}, {Addr: 0x2000, Len: 0x10}}, rw)
		require.NoError(t, err)
		require.NoError(t, e.UnregisterBatch(rs))
		requireClean(t, e, 1)
	})
}

func TestLocations(t *testing.T) {
	e := newEngine(t)
	for _, tc := range []struct{ in, want string }{
		{"", "cpu"}, {"cpu", "cpu"}, {"cpu:0", "cpu:0"},
	} {
		r, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 8, Location: tc.in}, rw)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, r.Loc.String())
		require.NoError(t, e.Unregister(r))
	}
	// A location naming a device is checked against the devices present:
	// this test has no CUDA support, and no machine has NUMA node 65535.
	for _, tc := range []struct {
		loc  string
		want status.Code
	}{
		{"cuda", status.Unsupported}, {"cuda:0", status.Unsupported}, {"cuda:99", status.Unsupported},
		{"cpu:65535", status.InvalidArgument},
	} {
		_, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 8, Location: tc.loc}, rw)
		require.Equal(t, tc.want, status.CodeOf(err), "%s: %v", tc.loc, err)
		_, err = e.RegisterBatch([]core.RegionDesc{{Addr: 0x1000, Len: 8}, {Addr: 0x2000, Len: 8, Location: tc.loc}}, rw)
		require.Equal(t, tc.want, status.CodeOf(err), "batch %s: %v", tc.loc, err)
		requireClean(t, e, 0)
	}
	_, err := e.Alloc(4096, "cpu:65535", rw)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err), err)
	for _, bad := range []string{"cpu:", "cpu:01", "cuda:99999999", "CPU", "cpu:1:2", " cpu"} {
		_, err := core.ParseLocation(bad)
		require.ErrorIs(t, err, status.ErrInvalidArgument, bad)
	}
}

func TestUnregisterErrors(t *testing.T) {
	e := newEngine(t, coretest.NewFake("a"))
	other := newEngine(t)
	r, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x10}, rw)
	require.NoError(t, err)
	foreign, err := other.Register(core.RegionDesc{Addr: 0x1000, Len: 0x10}, rw)
	require.NoError(t, err)

	require.ErrorIs(t, e.UnregisterBatch(nil), status.ErrInvalidArgument)
	require.ErrorIs(t, e.Unregister(foreign), status.ErrInvalidHandle)
	require.ErrorIs(t, e.UnregisterBatch([]*core.Region{r, r}), status.ErrInvalidArgument)
	requireClean(t, e, 1)
	require.NoError(t, e.Unregister(r))
	require.ErrorIs(t, e.Unregister(r), status.ErrNotRegistered)
	requireClean(t, e, 0)
}

// The seed scenario: while a registration is inside a (blocked) transport,
// an overlapping registration must be rejected, not pass the check too.
func TestConcurrentOverlapRejectedWhileInFlight(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := map[bool]string{false: "single", true: "batch"}[batch]
		t.Run(name, func(t *testing.T) {
			fake := coretest.NewFake("blocking")
			e := newEngine(t, fake)
			block := fake.BlockAt(coretest.MethodRegister, 1)
			defer block.Release()

			first := make(chan error, 1)
			go func() {
				descs := []core.RegionDesc{{Addr: 0x10000, Len: 0x1000}}
				if batch {
					descs = append(descs, core.RegionDesc{Addr: 0x20000, Len: 0x1000})
				}
				_, err := e.RegisterBatch(descs, rw)
				first <- err
			}()
			<-block.Entered()
			require.Equal(t, 1+boolInt(batch), e.Stats().Reservations)

			overlapping := []core.RegionDesc{{Addr: 0x10800, Len: 0x1000}}
			if batch {
				overlapping = []core.RegionDesc{{Addr: 0x30000, Len: 0x10}, {Addr: 0x20fff, Len: 2}}
			}
			_, err := e.RegisterBatch(overlapping, rw)
			require.ErrorIs(t, err, status.ErrOverlap)
			_, err = e.Register(core.RegionDesc{Addr: 0x10000, Len: 0x1000}, rw)
			require.ErrorIs(t, err, status.ErrBusy, "identical in-flight registration")
			require.Equal(t, 1, fake.Calls(coretest.MethodRegister), "the rejected calls must not reach the transport")

			block.Release()
			require.NoError(t, <-first)
			requireClean(t, e, 1+boolInt(batch))
			_, err = e.Register(core.RegionDesc{Addr: 0x10000, Len: 0x1000}, rw)
			require.ErrorIs(t, err, status.ErrAlreadyRegistered)
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestFailedRegistrationRollsBack(t *testing.T) {
	for _, mode := range []string{"fail", "panic"} {
		for _, batch := range []bool{false, true} {
			t.Run(mode+map[bool]string{false: "/single", true: "/batch"}[batch], func(t *testing.T) {
				a, b, c := coretest.NewFake("a"), coretest.NewFake("b"), coretest.NewFake("c")
				e := newEngine(t, a, b, c)
				if mode == "fail" {
					b.FailAt(coretest.MethodRegister, 1, coretest.ErrInjected)
				} else {
					b.PanicAt(coretest.MethodRegister, 1)
				}
				descs := []core.RegionDesc{{Addr: 0x10000, Len: 0x1000}}
				if batch {
					descs = append(descs, core.RegionDesc{Addr: 0x40000, Len: 0x1000})
				}
				_, err := e.RegisterBatch(descs, rw)
				require.Error(t, err)
				if mode == "fail" {
					require.ErrorIs(t, err, status.ErrTransport)
				} else {
					require.ErrorIs(t, err, status.ErrInternal)
					require.Contains(t, err.Error(), "injected panic")
				}
				requireClean(t, e, 0)
				require.Equal(t, 1, a.Calls(coretest.MethodUnregister), "a succeeded, so it is rolled back")
				require.Zero(t, b.Calls(coretest.MethodUnregister), "b failed and keeps nothing")
				require.Zero(t, c.Calls(coretest.MethodRegister), "c is never reached")
				require.Zero(t, a.Registered()+b.Registered()+c.Registered())

				// The reservation is gone: the same memory registers now.
				rs, err := e.RegisterBatch(descs, rw)
				require.NoError(t, err)
				require.Equal(t, len(descs), c.Registered())
				require.NoError(t, e.UnregisterBatch(rs))
				requireClean(t, e, 0)
			})
		}
	}
}

func TestRollbackPanicStillReleases(t *testing.T) {
	a, b := coretest.NewFake("a"), coretest.NewFake("b")
	e := newEngine(t, a, b)
	b.FailAt(coretest.MethodRegister, 1, coretest.ErrInjected)
	a.PanicAt(coretest.MethodUnregister, 1)
	_, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x10}, rw)
	require.ErrorIs(t, err, status.ErrTransport)
	requireClean(t, e, 0)
}

func TestUnregisterWaitsForTransfers(t *testing.T) {
	e := newEngine(t, coretest.NewFake("a"))
	r, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x100}, rw)
	require.NoError(t, err)

	held, err := e.Acquire(0x1010, 0x10, core.AccessLocal)
	require.NoError(t, err)
	require.Same(t, r, held)

	// Still in use when the deadline passes: busy, and still registered.
	require.ErrorIs(t, e.Unregister(r), status.ErrBusy)
	requireClean(t, e, 1)
	again, err := e.Acquire(0x1000, 0x100, core.AccessRemoteRead)
	require.NoError(t, err, "a busy unregister leaves the region usable")
	e.Release(again)

	// Released while unregister waits: it completes.
	done := make(chan error, 1)
	go func() { done <- e.Unregister(r) }()
	e.Release(held)
	require.NoError(t, <-done)
	requireClean(t, e, 0)
	_, err = e.Acquire(0x1010, 0x10, core.AccessLocal)
	require.ErrorIs(t, err, status.ErrNotRegistered)
}

func TestAcquireChecks(t *testing.T) {
	e := newEngine(t)
	ro, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x100}, core.PermRemoteRead)
	require.NoError(t, err)
	_, err = e.Register(core.RegionDesc{Addr: 0x1100, Len: 0x100}, core.PermRemoteWrite)
	require.NoError(t, err)

	tests := []struct {
		name   string
		addr   uint64
		n      uint64
		access core.Access
		code   status.Code
	}{
		{"inside read", 0x1000, 0x100, core.AccessRemoteRead, status.OK},
		{"write denied", 0x1000, 0x10, core.AccessRemoteWrite, status.PermissionDenied},
		{"read denied", 0x1100, 0x10, core.AccessRemoteRead, status.PermissionDenied},
		{"local ignores perms", 0x1100, 0x10, core.AccessLocal, status.OK},
		{"spans two regions", 0x10f0, 0x20, core.AccessLocal, status.OutOfRange},
		{"before", 0x800, 0x10, core.AccessLocal, status.NotRegistered},
		{"overhangs", 0x11f0, 0x20, core.AccessLocal, status.OutOfRange},
		{"zero length", 0x1000, 0, core.AccessLocal, status.InvalidArgument},
		{"wraps", ^uint64(0), 2, core.AccessLocal, status.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.Acquire(tc.addr, tc.n, tc.access)
			require.Equal(t, tc.code, status.CodeOf(err), "%v", err)
			if err == nil {
				e.Release(r)
			}
		})
	}
	require.NoError(t, e.Unregister(ro))
}

func TestUninstallWaitsForCallsInside(t *testing.T) {
	fake := coretest.NewFake("a")
	e := newEngine(t, fake)
	block := fake.BlockAt(coretest.MethodRegister, 1)
	defer block.Release()
	reg := make(chan error, 1)
	go func() {
		_, err := e.Register(core.RegionDesc{Addr: 0x1000, Len: 0x10}, rw)
		reg <- err
	}()
	<-block.Entered()
	un := make(chan error, 1)
	go func() { un <- e.Uninstall("a") }()
	// Uninstall cannot have reached the transport: the call inside holds it.
	require.Zero(t, fake.Calls(coretest.MethodUninstall))
	block.Release()
	require.NoError(t, <-reg)
	require.NoError(t, <-un)
	require.Equal(t, 1, fake.Calls(coretest.MethodUninstall))
	require.Zero(t, fake.Registered(), "uninstall released the transport's state")
	require.ErrorIs(t, e.Uninstall("a"), status.ErrNotFound)

	// Registration goes on without the transport.
	_, err := e.Register(core.RegionDesc{Addr: 0x2000, Len: 0x10}, rw)
	require.NoError(t, err)
	require.Equal(t, 1, fake.Calls(coretest.MethodRegister))
	requireClean(t, e, 2)
}

func TestCloseReleasesEverything(t *testing.T) {
	a, b := coretest.NewFake("a"), coretest.NewFake("b")
	e, err := core.New(core.Options{Transports: []string{}})
	require.NoError(t, err)
	require.NoError(t, e.Install(a))
	require.NoError(t, e.Install(b))
	for i := uint64(0); i < 10; i++ {
		_, err := e.Register(core.RegionDesc{Addr: 0x1000 * (i + 1), Len: 0x100}, rw)
		require.NoError(t, err)
	}
	require.NoError(t, e.Close())
	require.Zero(t, a.Registered()+b.Registered())
	require.Equal(t, 1, a.Calls(coretest.MethodUninstall))
	require.ErrorIs(t, e.Close(), status.ErrClosed)
	_, err = e.Register(core.RegionDesc{Addr: 0x1000, Len: 1}, rw)
	require.ErrorIs(t, err, status.ErrClosed)
	require.ErrorIs(t, e.Uninstall(""), status.ErrClosed)
	requireClean(t, e, 0)
	require.Empty(t, a.Misuse())
}

func TestInstallFailureLeavesNothing(t *testing.T) {
	available := []core.TransportSpec{
		{Name: "test-ok", ID: 101, New: func() core.Transport { return coretest.NewFake("test-ok") }},
		{Name: "test-bad", ID: 102, New: func() core.Transport {
			f := coretest.NewFake("test-bad")
			f.FailAt(coretest.MethodInstall, 1, coretest.ErrInjected)
			return f
		}},
	}
	_, err := core.New(core.Options{Available: available, Transports: []string{"test-ok", "test-bad"}})
	require.ErrorIs(t, err, status.ErrTransport)
	_, err = core.New(core.Options{Available: available, Transports: []string{"nope"}})
	require.ErrorIs(t, err, status.ErrNotFound)
	_, err = core.New(core.Options{Available: available, Transports: []string{"test-ok", "test-ok"}})
	require.ErrorIs(t, err, status.ErrInvalidArgument)
	e, err := core.New(core.Options{Available: available, Transports: []string{"test-ok"}})
	require.NoError(t, err)
	require.Len(t, e.Transports(), 1)
	require.NoError(t, e.Close())
}

// Many goroutines register and unregister random, often overlapping
// intervals. Whatever interleaving happens, committed regions never overlap
// and no reservation outlives its call.
func TestRegisterStress(t *testing.T) {
	fake := coretest.NewFake("a")
	e := newEngine(t, fake)
	const workers, ops = 8, 3000
	var wg sync.WaitGroup
	var checkMu sync.Mutex
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := seed*0x9e3779b97f4a7c15 + 1
			next := func(n uint64) uint64 {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				return rng % n
			}
			var mine []*core.Region
			for i := 0; i < ops; i++ {
				switch next(4) {
				case 0, 1:
					d := core.RegionDesc{Addr: 0x1000 + next(1<<16), Len: 1 + next(512)}
					r, err := e.Register(d, rw)
					if err == nil {
						mine = append(mine, r)
					} else if c := status.CodeOf(err); c != status.Overlap && c != status.AlreadyRegistered && c != status.Busy {
						t.Errorf("register: %v", err)
						return
					}
				case 2:
					var descs []core.RegionDesc
					for j := uint64(0); j < 1+next(4); j++ {
						descs = append(descs, core.RegionDesc{Addr: 0x1000 + next(1<<16), Len: 1 + next(256)})
					}
					rs, err := e.RegisterBatch(descs, rw)
					if err == nil {
						mine = append(mine, rs...)
					}
				case 3:
					if len(mine) > 0 {
						k := int(next(uint64(len(mine))))
						if err := e.Unregister(mine[k]); err != nil {
							t.Errorf("unregister: %v", err)
							return
						}
						mine = append(mine[:k], mine[k+1:]...)
					}
				}
				if i%500 == 0 {
					checkMu.Lock()
					if err := e.CheckIndex(); err != nil {
						t.Errorf("checkpoint: %v", err)
					}
					checkMu.Unlock()
				}
			}
			for _, r := range mine {
				if err := e.Unregister(r); err != nil {
					t.Errorf("final unregister: %v", err)
				}
			}
		}(uint64(w + 1))
	}
	wg.Wait()
	requireClean(t, e, 0)
	require.Zero(t, fake.Registered())
}
