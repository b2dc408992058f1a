//go:build multihost && linux

package multihost

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/peertest/gpuaccess"
	"github.com/tent-dev/tent/internal/testenv"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/cuda"
	"github.com/tent-dev/tent/transport/shm"
	"github.com/tent-dev/tent/transport/tcp"
)

// available is what the hosts' engines may install.
func available() []core.TransportSpec {
	return []core.TransportSpec{cuda.Spec(), shm.Spec(), tcp.Spec(tcp.Options{})}
}

func TestMain(m *testing.M) {
	peertest.Accessors["cuda"] = gpuaccess.Accessor{}
	// Peers have GPU memory when their process has a (fake) driver, as
	// the C library's engines do.
	peertest.Memory = func() []tmem.Kind {
		if gpu, err := cumem.Open(); err == nil {
			return []tmem.Kind{gpu}
		}
		return nil
	}
	peertest.Commands["xfer"] = xferCmd
	peertest.Commands["stat"] = statCmd
	peertest.Commands["open"] = openCmd
	peertest.Main(available()...)
	os.Exit(m.Run())
}

// xferCmd ("xfer read|write SEGMENT ADDR LEN") moves LEN bytes between a
// fresh local buffer (holding Pattern(77) for a write) and the segment,
// and answers "code=C transport=T flags=F sum=S" (S: the local buffer's
// sum after the transfer).
func xferCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 4 {
		return "", fmt.Errorf("usage: xfer read|write SEGMENT ADDR LEN")
	}
	addr, err1 := strconv.ParseUint(args[2], 10, 64)
	n, err2 := strconv.ParseUint(args[3], 10, 64)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("bad address or length")
	}
	op := core.OpRead
	buf := make([]byte, n)
	if args[0] == "write" {
		op = core.OpWrite
		copy(buf, peertest.Pattern(77, n))
	}
	seg, err := e.OpenSegment(args[1])
	if err != nil {
		return "", err
	}
	defer e.CloseSegment(seg)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: n}, 0)
	if err != nil {
		return "", err
	}
	defer e.Unregister(r)
	b, err := e.Submit([]core.TransferRequest{{Op: op, Local: host.Addr(buf), Segment: seg, Remote: addr, Len: n}},
		core.TransferOptions{Timeout: 10 * time.Second})
	if err != nil {
		return "", err
	}
	defer e.ReleaseBatch(b)
	b.Wait(-1)
	st := make([]core.RequestStatus, 1)
	b.Status(st)
	return fmt.Sprintf("code=%d transport=%d flags=%d sum=%s", st[0].Code, st[0].Transport, st[0].Flags, peertest.Sum(buf)), nil
}

// statCmd ("stat TRANSPORT KEY") answers one transport counter.
func statCmd(e *core.Engine, args []string) (string, error) {
	if len(args) != 2 {
		return "", fmt.Errorf("usage: stat TRANSPORT KEY")
	}
	st, ok := e.Stats().Transports[args[0]]
	if !ok {
		return "", fmt.Errorf("no transport %q", args[0])
	}
	return strconv.FormatInt(st[args[1]], 10), nil
}

// openCmd ("open SEGMENT [SECRET]") opens the segment from a second
// engine of this process with the given secret (none if absent) and
// answers the status code.
func openCmd(_ *core.Engine, args []string) (string, error) {
	if len(args) < 1 || len(args) > 2 {
		return "", fmt.Errorf("usage: open SEGMENT [SECRET]")
	}
	o := core.Options{Available: available(), Transports: []string{"tcp"}}
	if len(args) == 2 {
		o.Secret = []byte(args[1])
	}
	e, err := core.New(o)
	if err != nil {
		return "", err
	}
	defer e.Close()
	seg, err := e.OpenSegment(args[0])
	if err == nil {
		e.CloseSegment(seg)
	}
	return strconv.Itoa(int(status.CodeOf(err))), nil
}

// ---- the network: two namespaces joined by a veth pair ------------------

const (
	addrA = "10.231.0.1"
	addrB = "10.231.0.2"
	// nsPrefix names this package's namespaces: tent-mh-<pid>-a/b.
	nsPrefix = "tent-mh-"
)

// iproute runs iproute2's ip at bin.
type iproute struct{ bin string }

func (r iproute) run(args ...string) error {
	out, err := exec.Command(r.bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sweepStale deletes namespaces a killed earlier run left behind (their
// pid no longer exists).
func (r iproute) sweepStale() {
	out, err := exec.Command(r.bin, "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = r.run("netns", "del", name)
		}
	}
}

// network creates namespaces A and B, joined by a veth pair (A: addrA,
// B: addrB, /24), with loopback up in each; everything is deleted when the
// test ends, whatever happened.
func (r iproute) network(t *testing.T) (nsA, nsB string) {
	t.Helper()
	r.sweepStale()
	pid := os.Getpid()
	nsA, nsB = fmt.Sprintf("%s%d-a", nsPrefix, pid), fmt.Sprintf("%s%d-b", nsPrefix, pid)
	vethA, vethB := fmt.Sprintf("tmh%da", pid), fmt.Sprintf("tmh%db", pid)
	if err := r.run("netns", "add", nsA); err != nil {
		testenv.Skip(t, "cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		// Deleting a namespace deletes the veth end inside it, and with it
		// its peer; a link still in this namespace (a failed move) goes too.
		for _, err := range []error{r.run("netns", "del", nsA), r.run("netns", "del", nsB)} {
			if err != nil && !strings.Contains(err.Error(), "No such file") {
				t.Logf("cleanup: %v", err)
			}
		}
		_ = r.run("link", "del", vethA)
	})
	for _, args := range [][]string{
		{"netns", "add", nsB},
		{"link", "add", vethA, "type", "veth", "peer", "name", vethB},
		{"link", "set", vethA, "netns", nsA},
		{"link", "set", vethB, "netns", nsB},
		{"-n", nsA, "addr", "add", addrA + "/24", "dev", vethA},
		{"-n", nsB, "addr", "add", addrB + "/24", "dev", vethB},
		{"-n", nsA, "link", "set", vethA, "up"},
		{"-n", nsB, "link", "set", vethB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		require.NoError(t, r.run(args...))
	}
	return nsA, nsB
}

// ---- the test -------------------------------------------------------------

const (
	size   = 1 << 20
	gran   = 2 << 20
	secret = "multihost-secret"
)

type peer struct {
	*peertest.Peer
	t *testing.T
}

func start(t *testing.T, ipr iproute, f *fakecuda.Fake, ns, addr, machine string, bufs ...peertest.Buffer) peer {
	t.Helper()
	p := peertest.Start(t, peertest.Config{
		Transports: []string{"cuda", "shm", "tcp"}, Secret: secret, ListenAddr: addr + ":0", Buffers: bufs,
		Env:  append(f.Env(), "TENT_MACHINE_ID="+machine),
		Exec: []string{ipr.bin, "netns", "exec", ns},
	})
	return peer{p, t}
}

func (p peer) cmd(format string, args ...any) string {
	p.t.Helper()
	s, err := p.Cmd(format, args...)
	require.NoError(p.t, err)
	return s
}

func (p peer) stat(transport, key string) int64 {
	p.t.Helper()
	n, err := strconv.ParseInt(p.cmd("stat %s %s", transport, key), 10, 64)
	require.NoError(p.t, err)
	return n
}

// xfer answers the request's status, transport and flags, and the local
// buffer's sum.
func (p peer) xfer(op string, target peer, buf int, n uint64) (code status.Code, transport, flags uint32, sum string) {
	p.t.Helper()
	ans := p.cmd("xfer %s %s %d %d", op, target.Name, target.Buffers[buf].Addr, n)
	var c int
	_, err := fmt.Sscanf(ans, "code=%d transport=%d flags=%d sum=%s", &c, &transport, &flags, &sum)
	require.NoError(p.t, err, "answer %q", ans)
	return status.Code(c), transport, flags, sum
}

func TestTwoHosts(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "network namespaces need root")
	}
	ipr := iproute{testenv.RequireBinary(t, "ip")}
	nsA, nsB := ipr.network(t)
	f := fakecuda.New(t, fakecuda.Granularity(gran))

	// Host A: the target, with a read-write and a read-only allocation
	// (both memfds) and a read-write GPU allocation; plus a second engine
	// on host A. Host B: an engine with its own machine id, and one that
	// (misconfigured) claims host A's.
	target := start(t, ipr, f, nsA, addrA, "host-a",
		peertest.Buffer{Size: size, Perm: core.PermRemoteRead | core.PermRemoteWrite, Alloc: true},
		peertest.Buffer{Size: size, Perm: core.PermRemoteRead, Alloc: true},
		peertest.Buffer{Size: gran, Perm: core.PermRemoteRead | core.PermRemoteWrite, Alloc: true, Location: "cuda:0"})
	require.True(t, strings.HasPrefix(target.Name, addrA+":"), "target name %q", target.Name)
	neighbour := start(t, ipr, f, nsA, addrA, "host-a")
	remote := start(t, ipr, f, nsB, addrB, "host-b")
	misnamed := start(t, ipr, f, nsB, addrB, "host-a")

	patterns := []string{peertest.Sum(peertest.Pattern(0, size)), peertest.Sum(peertest.Pattern(1, size)),
		peertest.Sum(peertest.Pattern(2, gran))}

	t.Run("the hosts are apart", func(t *testing.T) {
		// Host B reaches host A only over the veth: A's loopback is not B's.
		out, err := exec.Command(ipr.bin, "-n", nsB, "route", "get", addrA).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "tmh", "route from B to A goes over the veth: %s", out)
		require.NotEqual(t, strconv.Itoa(int(status.OK)),
			remote.cmd("open 127.0.0.1:%s %s", strings.Split(target.Name, ":")[1], secret),
			"the target's port is not on host B's loopback")
	})

	t.Run("cross-host traffic is tcp", func(t *testing.T) {
		code, tr, flags, sum := remote.xfer("read", target, 0, size)
		require.Equal(t, status.OK, code)
		require.Equal(t, tcp.ID, tr)
		require.Zero(t, flags, "tcp at once, no retry")
		require.Equal(t, patterns[0], sum)

		code, tr, _, sum = remote.xfer("read", target, 2, gran) // GPU memory, staged by the target
		require.Equal(t, status.OK, code)
		require.Equal(t, tcp.ID, tr)
		require.Equal(t, patterns[2], sum)

		code, tr, _, _ = remote.xfer("write", target, 0, size)
		require.Equal(t, status.OK, code)
		require.Equal(t, tcp.ID, tr)
		require.Equal(t, peertest.Sum(peertest.Pattern(77, size)), target.cmd("sum 0"))
		require.Equal(t, "ok", target.cmd("fill 0 0"))

		code, _, _, _ = remote.xfer("write", target, 1, size)
		require.Equal(t, status.PermissionDenied, code)
		require.Equal(t, patterns[1], target.cmd("sum 1"), "the read-only allocation is unchanged")
	})

	t.Run("a host claiming the target's machine id still gets tcp", func(t *testing.T) {
		// Abstract Unix sockets are per network namespace: the shm dial is
		// refused and the request retried over tcp.
		code, tr, flags, sum := misnamed.xfer("read", target, 0, size)
		require.Equal(t, status.OK, code)
		require.Equal(t, tcp.ID, tr)
		require.Equal(t, core.FlagRetried, flags&core.FlagRetried)
		require.Equal(t, patterns[0], sum)
	})

	t.Run("the secret is required", func(t *testing.T) {
		require.Equal(t, strconv.Itoa(int(status.AuthFailed)), remote.cmd("open %s wrong", target.Name))
		require.Equal(t, strconv.Itoa(int(status.AuthFailed)), remote.cmd("open %s", target.Name))
		require.Equal(t, strconv.Itoa(int(status.OK)), remote.cmd("open %s %s", target.Name, secret))
	})

	t.Run("no same-host capability crosses hosts", func(t *testing.T) {
		for _, p := range []peer{remote, misnamed} {
			require.Zero(t, p.stat("shm", "fds_received"), "a memfd reached host B")
			require.Zero(t, p.stat("cuda", "imports_total"), "a CUDA handle reached host B")
		}
		require.Zero(t, target.stat("shm", "fds_sent"))
		require.Zero(t, target.stat("cuda", "exports_total"))
	})

	t.Run("an engine on the target's host does get them", func(t *testing.T) {
		// The control: the same transfers from host A map the read-write
		// memfd and import the GPU allocation, and the counters say so.
		code, tr, _, sum := neighbour.xfer("read", target, 0, size)
		require.Equal(t, status.OK, code)
		require.Equal(t, shm.ID, tr)
		require.Equal(t, patterns[0], sum)
		code, tr, _, sum = neighbour.xfer("read", target, 2, gran)
		require.Equal(t, status.OK, code)
		require.Equal(t, cuda.ID, tr)
		require.Equal(t, patterns[2], sum)
		require.EqualValues(t, 1, neighbour.stat("shm", "fds_received"))
		require.EqualValues(t, 1, target.stat("shm", "fds_sent"))
		require.EqualValues(t, 1, target.stat("cuda", "exports_total"))
		// The read-only allocation never travels as a descriptor, even here.
		code, tr, _, sum = neighbour.xfer("read", target, 1, size)
		require.Equal(t, status.OK, code)
		require.Equal(t, shm.ID, tr)
		require.Equal(t, patterns[1], sum)
		require.EqualValues(t, 1, neighbour.stat("shm", "fds_received"))
	})

	for _, p := range []peer{misnamed, remote, neighbour, target} {
		require.NoError(t, p.Stop())
	}
}
