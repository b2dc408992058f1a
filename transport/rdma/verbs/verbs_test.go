package verbs_test

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/transport/rdma/fakeverbs"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

const (
	verbsWait = 10 * time.Second
	pollTick  = time.Millisecond
)

// The real verbs.h, when installed (libibverbs-dev), must agree with abi.h
// on every size, offset and constant tent relies on: that is what makes the
// binding right for a real NIC, where the fake alone could not tell.
func TestABIMatchesVerbsHeader(t *testing.T) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	probe := exec.Command(cc, "-fsyntax-only", "-x", "c", "-")
	probe.Stdin = strings.NewReader("#include <infiniband/verbs.h>\n")
	if out, err := probe.CombinedOutput(); err != nil {
		t.Skipf("no <infiniband/verbs.h> to check abi.h against (install libibverbs-dev): %s", out)
	}
	out, err := exec.Command(cc, "-fsyntax-only", "-Wall", "-Werror", "testdata/abi_check.c").CombinedOutput()
	require.NoError(t, err, "abi.h differs from verbs.h:\n%s", out)
}

func TestDevicesListed(t *testing.T) {
	lib, path := openFake(t, "fake0,fake1")
	devs, err := lib.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 2)
	require.Equal(t, "fake0", devs[0].Name)
	require.Equal(t, "fake1", devs[1].Name)
	require.NotZero(t, devs[0].GUID)
	require.NotEqual(t, devs[0].GUID, devs[1].GUID)
	require.Equal(t, -1, devs[0].NUMANode, "no sysfs entry: NUMA node unknown")
	require.Empty(t, devs[0].PCIAddress)
	requireNoLiveObjects(t, path)
}

func TestDeviceCountForm(t *testing.T) {
	lib, _ := openFake(t, "2")
	devs, err := lib.Devices()
	require.NoError(t, err)
	require.Equal(t, "fake_0", devs[0].Name)
	require.Equal(t, "fake_1", devs[1].Name)
}

func TestDeviceTopologyFromSysfs(t *testing.T) {
	sysfs := t.TempDir()
	pci := filepath.Join(t.TempDir(), "0000:3b:00.0")
	require.NoError(t, os.MkdirAll(pci, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(pci, "numa_node"), []byte("1\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(sysfs, "fake0"), 0o755))
	require.NoError(t, os.Symlink(pci, filepath.Join(sysfs, "fake0", "device")))
	t.Setenv(fakeverbs.SysfsEnv, sysfs)
	lib, _ := openFake(t, "fake0")
	devs, err := lib.Devices()
	require.NoError(t, err)
	require.Equal(t, 1, devs[0].NUMANode)
	require.Equal(t, "0000:3b:00.0", devs[0].PCIAddress)
}

func TestNoDeviceIsAnError(t *testing.T) {
	lib, _ := openFake(t, "0")
	_, err := lib.Devices()
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	_, err = lib.OpenDevice("fake0")
	require.ErrorIs(t, err, syscall.ENODEV)
	require.ErrorContains(t, err, "ibv_open_device")
}

func TestDeviceListFailure(t *testing.T) {
	t.Setenv(fakeverbs.FailEnv, "ibv_get_device_list")
	lib, _ := openFake(t, "2")
	_, err := lib.Devices()
	require.ErrorContains(t, err, "ibv_get_device_list")
	require.ErrorIs(t, err, syscall.ENOSYS)
}

func TestNoLibraryGivesReason(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	_, err := verbs.Open(missing)
	require.Error(t, err)
	require.Contains(t, err.Error(), missing)
	require.Contains(t, err.Error(), "No such file")
}

func TestEmptyPathUsesEnv(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	t.Setenv(verbs.LibraryEnv, missing)
	_, err := verbs.Open("")
	require.ErrorContains(t, err, missing)
}

func TestLibraryMissingSymbols(t *testing.T) {
	// libc is a real shared object without any verbs symbol.
	_, err := verbs.Open("libc.so.6")
	require.ErrorContains(t, err, "lacks ibv_get_device_list@IBVERBS_1.1")
}

func TestLibraryPathHonoursEnv(t *testing.T) {
	require.Equal(t, verbs.DefaultLibrary, verbs.LibraryPath(func(string) string { return "" }))
	require.Equal(t, "/x/libfake.so", verbs.LibraryPath(func(k string) string {
		if k == verbs.LibraryEnv {
			return "/x/libfake.so"
		}
		return ""
	}))
}

func TestPortAndGID(t *testing.T) {
	lib, _ := openFake(t, "fake0,fake1")
	ctx, err := lib.OpenDevice("fake1")
	require.NoError(t, err)
	defer ctx.Close()
	require.Equal(t, "fake1", ctx.Name())
	port, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, verbs.PortActive, port.State)
	require.Equal(t, verbs.MTU4096, port.ActiveMTU)
	require.Equal(t, verbs.LinkInfiniBand, port.LinkLayer)
	require.Equal(t, uint16(2), port.LID)
	_, err = ctx.QueryPort(2)
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorContains(t, err, "ibv_query_port on fake1")
	gid, err := ctx.QueryGID(1, 0)
	require.NoError(t, err)
	require.Equal(t, byte(0xfe), gid[0])
	require.False(t, gid.IsZero())
	_, err = ctx.QueryGID(1, 5)
	require.ErrorIs(t, err, syscall.EINVAL)
}

func TestRoCELinkLayer(t *testing.T) {
	t.Setenv(fakeverbs.LinkLayerEnv, "ethernet")
	lib, _ := openFake(t, "fake0")
	ctx, err := lib.OpenDevice("fake0")
	require.NoError(t, err)
	defer ctx.Close()
	port, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, verbs.LinkEthernet, port.LinkLayer)
	require.Zero(t, port.LID)
}

// Two QPs of one process, on two devices, connected to each other: a chain
// of writes then reads moves the bytes, and everything is released.
func TestLoopbackWriteReadChain(t *testing.T) {
	lib, path := openFake(t, "fake0,fake1")
	a := newEndpoint(t, lib, "fake0")
	b := newEndpoint(t, lib, "fake1")
	a.connect(t, b.addr(t, 200), 100)
	b.connect(t, a.addr(t, 100), 200)

	const n, size = 8, 4096
	src := pattern(n*size, 7)
	dst := make([]byte, n*size)
	back := make([]byte, n*size)
	srcMR, err := a.pd.RegMR(addrOf(src), uint64(len(src)), verbs.AccessLocalWrite)
	require.NoError(t, err)
	backMR, err := a.pd.RegMR(addrOf(back), uint64(len(back)), verbs.AccessLocalWrite)
	require.NoError(t, err)
	dstMR, err := b.pd.RegMR(addrOf(dst), uint64(len(dst)), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	require.NoError(t, err)
	require.NotEqual(t, dstMR.LKey(), dstMR.RKey())
	require.Equal(t, addrOf(dst), dstMR.Addr())
	require.Equal(t, uint64(len(dst)), dstMR.Len())

	writes := make([]verbs.SendWR, n)
	for i := range writes {
		writes[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, LocalAddr: uint64(addrOf(src)) + uint64(i*size), Length: size,
			LKey: srcMR.LKey(), RemoteAddr: uint64(dstMR.Addr()) + uint64(i*size), RKey: dstMR.RKey(), Signaled: i == n-1}
	}
	require.NoError(t, a.qp.PostSend(writes))
	done := waitCompletions(t, a.cq, 1)
	require.Equal(t, verbs.Completion{ID: n - 1, Status: verbs.WCSuccess, Op: verbs.OpWrite, QPN: a.qp.Num()}, done[0])
	require.Equal(t, sha256.Sum256(src), sha256.Sum256(dst))

	reads := make([]verbs.SendWR, n)
	for i := range reads {
		reads[i] = verbs.SendWR{ID: uint64(100 + i), Op: verbs.OpRead, LocalAddr: uint64(addrOf(back)) + uint64(i*size), Length: size,
			LKey: backMR.LKey(), RemoteAddr: uint64(dstMR.Addr()) + uint64(i*size), RKey: dstMR.RKey(), Signaled: true}
	}
	require.NoError(t, a.qp.PostSend(reads))
	done = waitCompletions(t, a.cq, n)
	for i, c := range done {
		require.Equal(t, verbs.WCSuccess, c.Status, "read %d", i)
		require.Equal(t, verbs.OpRead, c.Op)
		require.Equal(t, uint32(size), c.Bytes)
	}
	require.Equal(t, sha256.Sum256(src), sha256.Sum256(back))

	for _, mr := range []*verbs.MR{srcMR, backMR, dstMR} {
		require.NoError(t, mr.Dereg())
	}
	a.close(t)
	b.close(t)
	requireNoLiveObjects(t, path)
}

// Remote access errors: outside the MR, to a read-only MR written, after
// dereg; each moves the QP to error and later work requests flush.
func TestRemoteAccessErrors(t *testing.T) {
	type access struct {
		name   string
		remote verbs.Access
		op     verbs.Op
		offset uint64
		length uint32
		dereg  bool
	}
	for _, c := range []access{
		{name: "past the end", remote: verbs.AccessLocalWrite | verbs.AccessRemoteWrite, op: verbs.OpWrite, offset: 4000, length: 200},
		{name: "before the start", remote: verbs.AccessLocalWrite | verbs.AccessRemoteWrite, op: verbs.OpWrite, offset: ^uint64(0) - 15, length: 16},
		{name: "read-only written", remote: verbs.AccessRemoteRead, op: verbs.OpWrite, length: 16},
		{name: "write-only read", remote: verbs.AccessLocalWrite | verbs.AccessRemoteWrite, op: verbs.OpRead, length: 16},
		{name: "deregistered", remote: verbs.AccessLocalWrite | verbs.AccessRemoteWrite, op: verbs.OpWrite, length: 16, dereg: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lib, path := openFake(t, "fake0")
			a := newEndpoint(t, lib, "fake0")
			b := newEndpoint(t, lib, "fake0")
			a.connect(t, b.addr(t, 1), 1)
			b.connect(t, a.addr(t, 1), 1)
			local := make([]byte, 4096)
			remote := pattern(4096, 3)
			before := sha256.Sum256(remote)
			lmr, err := a.pd.RegMR(addrOf(local), 4096, verbs.AccessLocalWrite)
			require.NoError(t, err)
			rmr, err := b.pd.RegMR(addrOf(remote), 4096, c.remote)
			require.NoError(t, err)
			if c.dereg {
				require.NoError(t, rmr.Dereg())
			}
			wr := verbs.SendWR{ID: 1, Op: c.op, LocalAddr: uint64(addrOf(local)), Length: c.length, LKey: lmr.LKey(),
				RemoteAddr: uint64(rmr.Addr()) + c.offset, RKey: rmr.RKey()}
			ok := wr
			ok.ID, ok.RemoteAddr, ok.Signaled = 2, uint64(rmr.Addr()), true
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr, ok}))
			done := waitCompletions(t, a.cq, 2)
			require.Equal(t, verbs.WCRemoteAccessError, done[0].Status, "unsignalled errors still complete")
			require.Equal(t, uint64(1), done[0].ID)
			require.Equal(t, verbs.WCWRFlushError, done[1].Status)
			require.Equal(t, before, sha256.Sum256(remote), "nothing reached the remote buffer")
			require.NoError(t, lmr.Dereg())
			if !c.dereg {
				require.NoError(t, rmr.Dereg())
			}
			a.close(t)
			b.close(t)
			requireNoLiveObjects(t, path)
		})
	}
}

// A local buffer outside the local MR is a local protection error.
func TestLocalProtectionError(t *testing.T) {
	lib, _ := openFake(t, "fake0")
	a := newEndpoint(t, lib, "fake0")
	b := newEndpoint(t, lib, "fake0")
	defer a.close(t)
	defer b.close(t)
	a.connect(t, b.addr(t, 1), 1)
	b.connect(t, a.addr(t, 1), 1)
	buf := make([]byte, 8192)
	lmr, err := a.pd.RegMR(addrOf(buf), 4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	defer lmr.Dereg()
	rmr, err := b.pd.RegMR(addrOf(buf), 8192, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	defer rmr.Dereg()
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 9, Op: verbs.OpWrite, LocalAddr: uint64(addrOf(buf)) + 4000, Length: 200,
		LKey: lmr.LKey(), RemoteAddr: uint64(rmr.Addr()), RKey: rmr.RKey(), Signaled: true}}))
	done := waitCompletions(t, a.cq, 1)
	require.Equal(t, verbs.WCLocalProtError, done[0].Status)
}

func TestQPStateMachine(t *testing.T) {
	lib, path := openFake(t, "fake0")
	a := newEndpoint(t, lib, "fake0")
	peer := verbs.QPAddr{QPN: 0x123, LID: 1}
	err := a.qp.ToRTR(peer, verbs.MTU4096)
	require.ErrorIs(t, err, syscall.EINVAL, "RESET → RTR is not a transition")
	require.ErrorContains(t, err, "ibv_modify_qp(RTR) on fake0")
	require.ErrorIs(t, a.qp.ToRTS(1), syscall.EINVAL, "RESET → RTS")
	require.ErrorIs(t, a.qp.PostSend([]verbs.SendWR{{Op: verbs.OpWrite}}), syscall.EINVAL, "posting in RESET")
	require.ErrorIs(t, a.qp.ToInit(2, 0), syscall.EINVAL, "no port 2")
	require.NoError(t, a.qp.ToInit(1, verbs.AccessRemoteWrite))
	require.ErrorIs(t, a.qp.ToRTS(1), syscall.EINVAL, "INIT → RTS")
	err = a.qp.PostSend([]verbs.SendWR{{Op: verbs.OpWrite}})
	require.ErrorIs(t, err, syscall.EINVAL, "posting in INIT")
	require.ErrorContains(t, err, "work request 0 of 1")
	require.NoError(t, a.qp.ToRTR(peer, verbs.MTU4096))
	require.ErrorIs(t, a.qp.ToInit(1, 0), syscall.EINVAL, "RTR → INIT")
	require.NoError(t, a.qp.ToRTS(1))
	require.NoError(t, a.qp.ToError())
	require.ErrorIs(t, a.qp.ToRTS(1), syscall.EINVAL, "ERR → RTS")
	// Posted in ERR: accepted, flushed.
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 5, Op: verbs.OpWrite}}))
	done := waitCompletions(t, a.cq, 1)
	require.Equal(t, verbs.WCWRFlushError, done[0].Status)
	require.ErrorContains(t, a.qp.PostSend([]verbs.SendWR{{Op: 0}}), "unknown op")
	a.close(t)
	requireNoLiveObjects(t, path)
}

// A peer QP that is gone (destroyed) does not answer: retry exceeded.
func TestPeerGoneIsRetryExceeded(t *testing.T) {
	lib, _ := openFake(t, "fake0")
	a := newEndpoint(t, lib, "fake0")
	defer a.close(t)
	b := newEndpoint(t, lib, "fake0")
	a.connect(t, b.addr(t, 1), 1)
	b.connect(t, a.addr(t, 1), 1)
	buf := make([]byte, 64)
	mr, err := a.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	defer mr.Dereg()
	b.close(t)
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpWrite, LocalAddr: uint64(addrOf(buf)), Length: 64, LKey: mr.LKey(),
		RemoteAddr: uint64(addrOf(buf)), RKey: mr.RKey(), Signaled: true}}))
	require.Equal(t, verbs.WCRetryExceeded, waitCompletions(t, a.cq, 1)[0].Status)
}

// More outstanding work requests than the send queue holds are refused;
// polling the completion retires them.
func TestSendQueueDepth(t *testing.T) {
	lib, _ := openFake(t, "fake0")
	a := newEndpoint(t, lib, "fake0")
	b := newEndpoint(t, lib, "fake0")
	defer a.close(t)
	defer b.close(t)
	a.connect(t, b.addr(t, 1), 1)
	b.connect(t, a.addr(t, 1), 1)
	buf := make([]byte, 64)
	mr, err := a.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
	require.NoError(t, err)
	defer mr.Dereg()
	rmr, err := b.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	defer rmr.Dereg()
	wrs := make([]verbs.SendWR, 33)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, LocalAddr: uint64(addrOf(buf)), Length: 8, LKey: mr.LKey(),
			RemoteAddr: uint64(addrOf(buf)), RKey: rmr.RKey(), Signaled: i == 31}
	}
	err = a.qp.PostSend(wrs)
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.ErrorContains(t, err, "work request 32 of 33")
	require.Len(t, waitCompletions(t, a.cq, 1), 1)
	require.NoError(t, a.qp.PostSend(wrs[32:]), "the polled completion retired the first 32")
}

// Destroy, Dereg and Close twice, or use after destroy: an error, no crash;
// parents in use refuse to go.
func TestLifecycleErrors(t *testing.T) {
	lib, path := openFake(t, "fake0")
	e := newEndpoint(t, lib, "fake0")
	buf := make([]byte, 64)
	mr, err := e.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
	require.NoError(t, err)

	require.ErrorContains(t, lib.Close(), "device contexts still open")
	require.ErrorIs(t, e.ctx.Close(), syscall.EBUSY)
	require.ErrorIs(t, e.pd.Dealloc(), syscall.EBUSY)
	require.ErrorIs(t, e.cq.Destroy(), syscall.EBUSY)

	require.NoError(t, mr.Dereg())
	require.ErrorIs(t, mr.Dereg(), verbs.ErrDestroyed)
	require.NoError(t, e.qp.Destroy())
	require.ErrorIs(t, e.qp.Destroy(), verbs.ErrDestroyed)
	require.ErrorIs(t, e.qp.ToInit(1, 0), verbs.ErrDestroyed)
	require.ErrorIs(t, e.qp.PostSend([]verbs.SendWR{{Op: verbs.OpWrite}}), verbs.ErrDestroyed)
	require.NoError(t, e.cq.Destroy())
	require.ErrorIs(t, e.cq.Destroy(), verbs.ErrDestroyed)
	_, err = e.cq.Poll(make([]verbs.Completion, 1))
	require.ErrorIs(t, err, verbs.ErrDestroyed)
	_, err = e.pd.CreateRCQP(e.cq, e.cq, verbs.QPCaps{MaxSendWR: 1, MaxSendSGE: 1})
	require.ErrorIs(t, err, verbs.ErrDestroyed, "a QP on a destroyed CQ")
	require.NoError(t, e.pd.Dealloc())
	require.ErrorIs(t, e.pd.Dealloc(), verbs.ErrDestroyed)
	_, err = e.pd.RegMR(addrOf(buf), 64, verbs.AccessLocalWrite)
	require.ErrorIs(t, err, verbs.ErrDestroyed)
	require.NoError(t, e.ctx.Close())
	require.ErrorIs(t, e.ctx.Close(), verbs.ErrDestroyed)
	_, err = e.ctx.AllocPD()
	require.ErrorIs(t, err, verbs.ErrDestroyed)
	_, err = e.ctx.QueryPort(1)
	require.ErrorIs(t, err, verbs.ErrDestroyed)
	requireNoLiveObjects(t, path)
	require.NoError(t, lib.Close())
	require.ErrorIs(t, lib.Close(), verbs.ErrDestroyed)
	_, err = lib.Devices()
	require.ErrorIs(t, err, verbs.ErrDestroyed)
	_, err = lib.OpenDevice("fake0")
	require.ErrorIs(t, err, verbs.ErrDestroyed)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}
