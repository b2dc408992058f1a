package cuda

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/internal/peertest/gpuaccess"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/local"
	"github.com/tent-dev/tent/transport/tcp"
)

// childEnv selects a child mode of the test binary other than peertest's.
const childEnv = "TENT_CUDA_TEST_CHILD"

// processFake opens the fake driver this (peer) process loaded.
func processFake() (*fakecuda.Fake, error) {
	d, err := cu.Default()
	if err != nil {
		return nil, err
	}
	return fakecuda.Open(d.Path())
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
	peertest.Commands["handshake"] = handshakeCmd
	peertest.Commands["fds"] = func(_ *core.Engine, args []string) (string, error) {
		n, err := countFDs()
		if len(args) > 0 {
			return strings.Join(fdLinks(), " "), nil
		}
		return strconv.Itoa(n), err
	}
	peertest.Commands["fake"] = func(*core.Engine, []string) (string, error) {
		f, err := processFake()
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(f.Counters())
		return string(b), err
	}
	// fail FN NTH CODE: the peer's fake fails the NTH next call of FN.
	peertest.Commands["fail"] = func(_ *core.Engine, args []string) (string, error) {
		f, err := processFake()
		if err != nil {
			return "", err
		}
		nth, _ := strconv.Atoi(args[1])
		code, _ := strconv.Atoi(args[2])
		f.Fail(args[0], nth, code)
		return "ok", nil
	}
	peertest.Commands["stats"] = func(e *core.Engine, _ []string) (string, error) {
		b, err := json.Marshal(e.Stats().Transports[Name])
		return string(b), err
	}
	// uninstall: the cuda transport; answers how long it took, in ms.
	peertest.Commands["uninstall"] = func(e *core.Engine, _ []string) (string, error) {
		t0 := time.Now()
		if err := e.Uninstall(Name); err != nil {
			return "", err
		}
		return strconv.FormatInt(time.Since(t0).Milliseconds(), 10), nil
	}
	// memalloc SIZE SEED: cuMemAlloc (not VMM) memory, filled, registered
	// with its location detected; answers its address.
	peertest.Commands["memalloc"] = func(e *core.Engine, args []string) (string, error) {
		d, err := cu.Default()
		if err != nil {
			return "", err
		}
		size, _ := strconv.ParseUint(args[0], 10, 64)
		seed, _ := strconv.ParseInt(args[1], 10, 64)
		p, err := d.MemAlloc(0, size)
		if err != nil {
			return "", err
		}
		if err := d.CopyHtoD(p, peertest.Pattern(seed, size)); err != nil {
			return "", err
		}
		if _, err := e.Register(core.RegionDesc{Addr: p, Len: size}, core.PermRemoteRead|core.PermRemoteWrite); err != nil {
			return "", err
		}
		return strconv.FormatUint(p, 10), nil
	}
	if mode := os.Getenv(childEnv); mode != "" {
		if err := childMain(mode); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", mode, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	peertest.Main(available()...)
	os.Exit(m.Run())
}

// available is what the tests' engines may install: cuda, and local and tcp
// beside it.
func available() []core.TransportSpec {
	return []core.TransportSpec{Spec(), local.Spec(), tcp.Spec(tcp.Options{})}
}

// runChild runs the test binary in a child mode with extra environment.
func runChild(t *testing.T, mode string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child %s:\n%s", mode, out)
	return string(out)
}

func childMain(mode string) error {
	switch mode {
	case "nodriver":
		return childNoDriver()
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

// childNoDriver runs with TENT_CUDA_DRIVER naming no library: the engine
// must create without the cuda transport, saying why.
func childNoDriver() error {
	if _, err := cumem.Open(); err == nil || !strings.Contains(err.Error(), "no CUDA driver") {
		return fmt.Errorf("GPU memory without a driver: %v", err)
	}
	e, err := core.New(core.Options{Available: available(), Transports: []string{"cuda", "local"}})
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	defer e.Close()
	if tr := cudaOf(e); tr != nil {
		return fmt.Errorf("cuda transport installed without a driver")
	}
	if why := e.Stats().Unavailable[Name]; !strings.Contains(why, "no CUDA driver") {
		return fmt.Errorf("Stats().Unavailable[cuda] = %q", why)
	}
	tr := New() // installed directly: inert
	if err := tr.Install(e); err != nil {
		return err
	}
	defer tr.Uninstall()
	if _, err := tr.Driver(); err == nil || !strings.Contains(err.Error(), "no CUDA driver") {
		return fmt.Errorf("Driver() error = %v", err)
	}
	if g := tr.Stats()["gpus"]; g != 0 {
		return fmt.Errorf("gpus = %d", g)
	}
	buf := make([]byte, 4096)
	r, err := e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: 4096}, core.PermRemoteRead)
	if err != nil {
		return fmt.Errorf("register host memory: %w", err)
	}
	if r.Loc.IsCUDA() {
		return fmt.Errorf("host memory detected as %s", r.Loc)
	}
	req := &core.Request{LocalRegion: r, RemoteRegion: wireRegion("cuda:0", 1)}
	if tr.Eligible(req) {
		return fmt.Errorf("eligible without a driver")
	}
	_, allocErr := e.Alloc(1<<20, "cuda:0", core.PermRemoteRead)
	if status.CodeOf(allocErr) != status.Unsupported || !strings.Contains(allocErr.Error(), "no CUDA driver") {
		return fmt.Errorf("Alloc(cuda:0) = %v, want Unsupported naming the missing driver", allocErr)
	}
	d, err := e.Descriptor()
	if err != nil {
		return err
	}
	for _, ep := range d.Endpoints {
		if ep.Transport == Name {
			return fmt.Errorf("endpoint published without a driver")
		}
	}
	fmt.Println("alloc error:", allocErr)
	return nil
}

// countFDs counts this process's open file descriptors.
func countFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(ents) - 1, nil
}

// fdLinks lists this process's open file descriptors as "FD->target".
func fdLinks() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var links []string
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		links = append(links, e.Name()+"->"+l)
	}
	return links
}

func fdCount(t *testing.T) int {
	t.Helper()
	n, err := countFDs()
	require.NoError(t, err)
	return n
}

// waitFDs waits (closes by other goroutines) for the fd count, up to a
// bound for a leak, long enough for a loaded machine.
func waitFDs(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := fdCount(t)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("open fds: %d, want %d\n%s", n, want, strings.Join(fdLinks(), "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
