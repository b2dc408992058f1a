package verbs_test

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// Every entry point's injected failure comes back as an error naming the
// call, the device and the errno, and leaves nothing behind.
func TestInjectedCallFailures(t *testing.T) {
	for _, c := range []struct {
		rule  string
		call  string
		errno syscall.Errno
		run   func(t *testing.T, lib *verbs.Library) error
	}{
		{"ibv_open_device:dev=fake1", "ibv_open_device on fake1", syscall.ENODEV, func(t *testing.T, lib *verbs.Library) error {
			ctx, err := lib.OpenDevice("fake0")
			require.NoError(t, err, "only fake1 fails")
			require.NoError(t, ctx.Close())
			_, err = lib.OpenDevice("fake1")
			return err
		}},
		{"ibv_query_port", "ibv_query_port on fake0", syscall.EIO, func(t *testing.T, lib *verbs.Library) error {
			return withContext(t, lib, func(ctx *verbs.Context) error { _, err := ctx.QueryPort(1); return err })
		}},
		{"ibv_query_gid:errno=19", "ibv_query_gid on fake0", syscall.ENODEV, func(t *testing.T, lib *verbs.Library) error {
			return withContext(t, lib, func(ctx *verbs.Context) error { _, err := ctx.QueryGID(1, 0); return err })
		}},
		{"ibv_alloc_pd", "ibv_alloc_pd on fake0", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			return withContext(t, lib, func(ctx *verbs.Context) error { _, err := ctx.AllocPD(); return err })
		}},
		{"ibv_create_cq", "ibv_create_cq on fake0", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			return withContext(t, lib, func(ctx *verbs.Context) error { _, err := ctx.CreateCQ(8); return err })
		}},
		{"ibv_reg_mr:nth=2", "ibv_reg_mr on fake0", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			return withPD(t, lib, "fake0", func(pd *verbs.PD) error {
				buf := make([]byte, 64)
				mr, err := pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
				require.NoError(t, err, "the first registration succeeds")
				defer mr.Dereg()
				_, err = pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
				return err
			})
		}},
		{"ibv_reg_mr:dev=fake1", "ibv_reg_mr on fake1", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			buf := make([]byte, 64)
			require.NoError(t, withPD(t, lib, "fake0", func(pd *verbs.PD) error {
				mr, err := pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
				require.NoError(t, err)
				return mr.Dereg()
			}))
			return withPD(t, lib, "fake1", func(pd *verbs.PD) error {
				_, err := pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
				return err
			})
		}},
		{"ibv_reg_dmabuf_mr", "ibv_reg_dmabuf_mr on fake0", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			return withPD(t, lib, "fake0", func(pd *verbs.PD) error {
				_, err := pd.RegDmabufMR(0, 4096, 0, 3, verbs.AccessLocalWrite)
				return err
			})
		}},
		{"ibv_create_qp", "ibv_create_qp on fake0", syscall.ENOMEM, func(t *testing.T, lib *verbs.Library) error {
			return withPD(t, lib, "fake0", func(pd *verbs.PD) error {
				cq, err := pd.Context().CreateCQ(8)
				require.NoError(t, err)
				defer cq.Destroy()
				_, err = pd.CreateRCQP(cq, cq, verbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1})
				return err
			})
		}},
		{"ibv_modify_qp:state=RTS", "ibv_modify_qp(RTS) on fake0", syscall.EINVAL, func(t *testing.T, lib *verbs.Library) error {
			e := newEndpoint(t, lib, "fake0")
			defer e.close(t)
			require.NoError(t, e.qp.ToInit(1, verbs.AccessRemoteWrite))
			require.NoError(t, e.qp.ToRTR(verbs.QPAddr{QPN: 0x500, LID: 1}, verbs.MTU4096))
			return e.qp.ToRTS(1)
		}},
		{"ibv_post_send", "ibv_post_send on fake0", syscall.EIO, func(t *testing.T, lib *verbs.Library) error {
			e := newEndpoint(t, lib, "fake0")
			defer e.close(t)
			return e.qp.PostSend([]verbs.SendWR{{Op: verbs.OpWrite}})
		}},
	} {
		t.Run(c.rule, func(t *testing.T) {
			t.Setenv(fakeverbs.FailEnv, c.rule)
			lib, path := openFake(t, "fake0,fake1")
			err := c.run(t, lib)
			require.ErrorIs(t, err, c.errno)
			require.ErrorContains(t, err, c.call)
			requireNoLiveObjects(t, path)
		})
	}
}

func TestInjectedPollFailure(t *testing.T) {
	t.Setenv(fakeverbs.FailEnv, "ibv_poll_cq")
	lib, _ := openFake(t, "fake0")
	e := newEndpoint(t, lib, "fake0")
	defer e.close(t)
	_, err := e.cq.Poll(make([]verbs.Completion, 4))
	require.ErrorContains(t, err, "ibv_poll_cq on fake0")
}

// A destroy call that fails leaves the object alive and usable; the next
// try (the failure gone) releases it.
func TestInjectedDestroyFailures(t *testing.T) {
	for _, rule := range []string{"ibv_destroy_qp", "ibv_destroy_cq", "ibv_dealloc_pd", "ibv_close_device", "ibv_dereg_mr"} {
		t.Run(rule, func(t *testing.T) {
			lib, path := openFake(t, "fake0")
			e := newEndpoint(t, lib, "fake0")
			buf := make([]byte, 64)
			mr, err := e.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
			require.NoError(t, err)
			steps := []struct {
				call string
				f    func() error
			}{
				{"ibv_dereg_mr", mr.Dereg}, {"ibv_destroy_qp", e.qp.Destroy}, {"ibv_destroy_cq", e.cq.Destroy},
				{"ibv_dealloc_pd", e.pd.Dealloc}, {"ibv_close_device", e.ctx.Close},
			}
			for _, s := range steps {
				if s.call == rule {
					require.NoError(t, os.Setenv(fakeverbs.FailEnv, rule))
					err := s.f()
					require.ErrorIs(t, err, syscall.EIO)
					require.ErrorContains(t, err, rule)
					require.NoError(t, os.Unsetenv(fakeverbs.FailEnv))
				}
				require.NoError(t, s.f(), s.call)
			}
			requireNoLiveObjects(t, path)
		})
	}
}

// "cq:error_after=N": the WR after N executed ones completes with an error
// status (a CQ error mid-batch); the QP goes to error and the rest flush.
func TestInjectedCompletionErrorMidBatch(t *testing.T) {
	t.Setenv(fakeverbs.FailEnv, "cq:error_after=3:status=11")
	got := runSignalledWrites(t, 6)
	want := []verbs.WCStatus{verbs.WCSuccess, verbs.WCSuccess, verbs.WCSuccess, verbs.WCRemoteOpError, verbs.WCWRFlushError, verbs.WCWRFlushError}
	require.Equal(t, want, got)
}

// "qp:error_after=N": the QP goes to error under load; the WR after N
// executed ones and all later ones flush.
func TestInjectedQPErrorUnderLoad(t *testing.T) {
	t.Setenv(fakeverbs.FailEnv, "qp:error_after=2")
	got := runSignalledWrites(t, 5)
	want := []verbs.WCStatus{verbs.WCSuccess, verbs.WCSuccess, verbs.WCWRFlushError, verbs.WCWRFlushError, verbs.WCWRFlushError}
	require.Equal(t, want, got)
}

func runSignalledWrites(t *testing.T, n int) []verbs.WCStatus {
	t.Helper()
	lib, path := openFake(t, "fake0")
	a := newEndpoint(t, lib, "fake0")
	b := newEndpoint(t, lib, "fake0")
	a.connect(t, b.addr(t, 1), 1)
	b.connect(t, a.addr(t, 1), 1)
	src, dst := pattern(64, 1), make([]byte, 64)
	lmr, err := a.pd.RegMR(addrOf(src), 64, verbs.AccessLocalWrite)
	require.NoError(t, err)
	rmr, err := b.pd.RegMR(addrOf(dst), 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, LocalAddr: uint64(addrOf(src)), Length: 64, LKey: lmr.LKey(),
			RemoteAddr: uint64(rmr.Addr()), RKey: rmr.RKey(), Signaled: true}
	}
	require.NoError(t, a.qp.PostSend(wrs))
	statuses := make([]verbs.WCStatus, 0, n)
	for i, c := range waitCompletions(t, a.cq, n) {
		require.Equal(t, uint64(i), c.ID, "completions in order")
		statuses = append(statuses, c.Status)
	}
	require.NoError(t, lmr.Dereg())
	require.NoError(t, rmr.Dereg())
	a.close(t)
	b.close(t)
	requireNoLiveObjects(t, path)
	return statuses
}

// The fake takes a dmabuf MR only for an fd of the fake CUDA driver's
// cuMemGetHandleForAddressRange (a memfd whose name gives the range): any
// other fd is EINVAL, a closed one EBADF, and a range outside the dmabuf
// or an iova other than its address EINVAL.
func TestDmabufOnlyFromTheFakeDriver(t *testing.T) {
	lib, path := openFake(t, "fake0")
	require.True(t, lib.HasDmabuf())
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	buf := make([]byte, 2*4096)
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	fd, err := unix.MemfdCreate(fmt.Sprintf("fakecuda-dmabuf:%x:%x", base, 4096), 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, withPD(t, lib, "fake0", func(pd *verbs.PD) error {
		_, err := pd.RegDmabufMR(0, 4096, 0, int(r.Fd()), verbs.AccessLocalWrite)
		require.ErrorIs(t, err, syscall.EINVAL)
		require.ErrorContains(t, err, "ibv_reg_dmabuf_mr on fake0")
		_, err = pd.RegDmabufMR(0, 4096, 0, 1<<20, verbs.AccessLocalWrite)
		require.ErrorIs(t, err, syscall.EBADF)
		_, err = pd.RegDmabufMR(0, 4096, base+8, fd, verbs.AccessLocalWrite)
		require.ErrorIs(t, err, syscall.EINVAL, "iova is not the dmabuf's address")
		_, err = pd.RegDmabufMR(8, 4096, base+8, fd, verbs.AccessLocalWrite)
		require.ErrorIs(t, err, syscall.EINVAL, "past the end of the dmabuf")
		mr, err := pd.RegDmabufMR(0, 4096, base, fd, verbs.AccessLocalWrite)
		require.NoError(t, err)
		require.Equal(t, uintptr(base), mr.Addr())
		return mr.Dereg()
	}))
	runtime.KeepAlive(buf)
	requireNoLiveObjects(t, path)
}

func withContext(t *testing.T, lib *verbs.Library, f func(*verbs.Context) error) error {
	t.Helper()
	ctx, err := lib.OpenDevice("fake0")
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	return f(ctx)
}

func withPD(t *testing.T, lib *verbs.Library, dev string, f func(*verbs.PD) error) error {
	t.Helper()
	ctx, err := lib.OpenDevice(dev)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Dealloc()) }()
	return f(pd)
}
