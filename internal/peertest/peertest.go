package peertest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	tmem "github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/metadata/p2p"
)

const envConfig = "TENT_PEERTEST_CONFIG"

// Config describes the peer engine and its buffers.
type Config struct {
	Transports []string
	Secret     string
	ListenAddr string
	Name       string
	Metadata   string
	// Buffers to register, each filled with Pattern(seed=i).
	Buffers []Buffer
	// Env is added to the child's environment.
	Env []string `json:"-"`
	// Exec, when set, is a command prefix that runs the peer, such as
	// {"ip", "netns", "exec", "NS"}; it must exec the binary it is given
	// (not fork it), so the peer's pid is the one Start waits for.
	Exec []string `json:"-"`
	// Binary, when set, is run instead of this test binary (os.Args[0]):
	// a copy of it another user may execute, say.
	Binary string `json:"-"`
	// NoFileLimit, when set, is the child's RLIMIT_NOFILE soft limit, set
	// before the engine is created (the Go runtime raises the soft limit
	// at start, so it cannot be inherited).
	NoFileLimit uint64 `json:",omitempty"`
	// MaxUnauthenticated and HandshakeTimeout are the engine's listener
	// limits (core.Options); zero means the defaults.
	MaxUnauthenticated int           `json:",omitempty"`
	HandshakeTimeout   time.Duration `json:",omitempty"`
}

// Buffer is one buffer of the peer.
type Buffer struct {
	Size  uint64
	Perm  core.Perm
	Alloc bool // allocate with the engine (memfd) instead of the Go heap
	// Location for Alloc ("cuda:0"); "" means "cpu". Buffers outside host
	// memory are filled and summed through Accessors.
	Location string `json:",omitempty"`
}

// Accessor reads and writes peer buffers that the peer cannot touch
// directly (GPU memory).
type Accessor interface {
	Read(addr, n uint64) ([]byte, error)
	Write(addr uint64, b []byte) error
}

// Command is an extra peer command: it gets the peer's engine and the
// command's arguments and returns the one-line answer.
type Command func(e *core.Engine, args []string) (string, error)

// Accessors (by location kind, "cuda"), Commands (by name), Memory
// (the memory kinds of the peer's engine besides host memory; nil for
// host memory only) and Directory (what opens the peer's directory when
// Config.Metadata is set; nil for p2p) extend the peer. A test binary sets
// them in TestMain before calling Main; they are read-only afterwards.
var (
	Accessors = map[string]Accessor{}
	Commands  = map[string]Command{}
	Memory    func() []tmem.Kind
	Directory core.DirectoryFactory
)

// Hello is what the peer reports once it is ready.
type Hello struct {
	Name    string
	PID     int
	Buffers []Region
}

// Region is one registered buffer of the peer.
type Region struct {
	Addr    uint64
	Len     uint64
	AllocID uint64 `json:",omitempty"` // engine allocations only
}

// Peer is a running peer process.
type Peer struct {
	Hello
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	mu    sync.Mutex
	waitc chan error
	once  sync.Once
	exit  error
}

// Main must be called first in TestMain: in the peer process it runs the
// peer, with an engine that may install the transports available (Config
// names which), and exits; in the test process it returns.
func Main(available ...core.TransportSpec) {
	cfg := os.Getenv(envConfig)
	if cfg == "" {
		return
	}
	os.Exit(runPeer(cfg, available))
}

// Start launches a peer and waits until it is ready. The peer is killed
// when the test ends.
func Start(t testing.TB, cfg Config) *Peer {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Args[0]
	if cfg.Binary != "" {
		bin = cfg.Binary
	}
	argv := append(append([]string(nil), cfg.Exec...), bin, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), envConfig+"="+string(raw)), cfg.Env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Peer{cmd: cmd, in: in, out: bufio.NewReader(outPipe), waitc: make(chan error, 1)}
	go func() { p.waitc <- cmd.Wait() }()
	t.Cleanup(p.Kill)
	// Generous: a -race peer that fills 64 MiB buffers on a machine whose
	// CPUs are all busy (make test-stress) can take tens of seconds.
	line, err := p.readLine(90 * time.Second)
	if err != nil {
		t.Fatalf("peer did not start: %v", err)
	}
	if err := json.Unmarshal([]byte(line), &p.Hello); err != nil {
		t.Fatalf("peer hello %q: %v", line, err)
	}
	return p
}

func (p *Peer) readLine(timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer from peer within %v", timeout)
	}
}

// Cmd sends one command line and returns the peer's one-line answer.
// Commands: "sum I" (sha256 of buffer I), "fill I SEED", "unregister I",
// "register I", "recv" (next notification), "free I" (Free an Alloc
// buffer), "realloc I SEED" (Free it if needed, Alloc it again with the
// same size, location and permissions, fill it with Pattern(SEED); answers
// "ADDR ALLOCID" in decimal), "listeners" (the engine's Stats().Listeners
// as JSON, see Listeners), and the names in Commands.
func (p *Peer) Cmd(format string, args ...any) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		return "", err
	}
	line, err := p.readLine(30 * time.Second)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(line, "error ") {
		return "", fmt.Errorf("peer: %s", line[6:])
	}
	return line, nil
}

// Listeners returns the peer engine's listener counts ("engine", "shm", ...).
func (p *Peer) Listeners() (map[string]core.ListenerStats, error) {
	line, err := p.Cmd("listeners")
	if err != nil {
		return nil, err
	}
	var out map[string]core.ListenerStats
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		return nil, fmt.Errorf("listeners %q: %w", line, err)
	}
	return out, nil
}

// Kill ends the peer with SIGKILL (no clean shutdown) and reaps it.
func (p *Peer) Kill() {
	_ = p.cmd.Process.Kill()
	p.reap(10 * time.Second)
}

// reap waits for the process once; later calls return the same result.
func (p *Peer) reap(timeout time.Duration) error {
	p.once.Do(func() {
		select {
		case p.exit = <-p.waitc:
		case <-time.After(timeout):
			p.exit = fmt.Errorf("peer did not exit within %v", timeout)
		}
	})
	return p.exit
}

// Stop asks the peer to destroy its engine and exit, and waits.
func (p *Peer) Stop() error {
	p.in.Close()
	err := p.reap(30 * time.Second)
	if err != nil {
		_ = p.cmd.Process.Kill()
	}
	return err
}

// Pattern returns the deterministic content of buffer i of a peer.
func Pattern(seed int64, n uint64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// Sum returns the hex sha256 of b, as "sum" reports it.
func Sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// runPeer is the peer process: it creates the engine of the JSON config
// raw, registers and fills its buffers, prints its Hello, then answers
// commands from stdin, one line each, until stdin closes.
func runPeer(raw string, available []core.TransportSpec) int {
	var cfg Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "peertest:", err)
		return 2
	}
	if cfg.NoFileLimit > 0 {
		lim := unix.Rlimit{Cur: cfg.NoFileLimit, Max: cfg.NoFileLimit}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			fmt.Fprintln(os.Stderr, "peertest: RLIMIT_NOFILE:", err)
			return 2
		}
	}
	opts := core.Options{Available: available, Transports: cfg.Transports, ListenAddr: cfg.ListenAddr, Name: cfg.Name, Metadata: cfg.Metadata,
		MaxUnauthenticated: cfg.MaxUnauthenticated, HandshakeTimeout: cfg.HandshakeTimeout}
	if cfg.Secret != "" {
		opts.Secret = []byte(cfg.Secret)
	}
	if Memory != nil {
		opts.Memory = Memory()
	}
	if cfg.Metadata != "" && cfg.Metadata != p2p.Scheme {
		opts.Directory = Directory
	}
	e, err := core.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peertest: engine:", err)
		return 2
	}
	p := &peerProc{cfg: cfg, e: e, regions: make([]*core.Region, len(cfg.Buffers)), mems: make([][]byte, len(cfg.Buffers))}
	hello, err := p.setUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, "peertest: buffer:", err)
		return 2
	}
	out, _ := json.Marshal(hello)
	fmt.Println(string(out))

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if f := strings.Fields(in.Text()); len(f) > 0 {
			fmt.Println(p.answer(f))
		}
	}
	if err := e.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "peertest: close:", err)
		return 1
	}
	return 0
}

// peerProc is the state of the peer process: its engine and, for each
// configured buffer, its region (nil once freed or unregistered) and, for
// host memory, its bytes.
type peerProc struct {
	cfg     Config
	e       *core.Engine
	regions []*core.Region
	mems    [][]byte
}

// kind is buffer i's memory kind: "cpu", "cuda", ...
func (p *peerProc) kind(i int) string {
	k, _, _ := strings.Cut(p.cfg.Buffers[i].Location, ":")
	if k == "" {
		k = "cpu"
	}
	return k
}

// accessor reaches buffer i through its region when it lives outside host
// memory.
func (p *peerProc) accessor(i int) (Accessor, error) {
	a := Accessors[p.kind(i)]
	if a == nil || p.regions[i] == nil {
		return nil, fmt.Errorf("no accessor for %s memory", p.kind(i))
	}
	return a, nil
}

func (p *peerProc) write(i int, b []byte) error {
	if p.kind(i) == "cpu" {
		copy(p.mems[i], b)
		return nil
	}
	a, err := p.accessor(i)
	if err != nil {
		return err
	}
	return a.Write(p.regions[i].Addr, b)
}

func (p *peerProc) read(i int) ([]byte, error) {
	if p.kind(i) == "cpu" {
		return p.mems[i], nil
	}
	a, err := p.accessor(i)
	if err != nil {
		return nil, err
	}
	return a.Read(p.regions[i].Addr, p.cfg.Buffers[i].Size)
}

// alloc allocates buffer i with the engine.
func (p *peerProc) alloc(i int) (*core.Region, error) {
	b := p.cfg.Buffers[i]
	loc := b.Location
	if loc == "" {
		loc = "cpu"
	}
	r, err := p.e.Alloc(b.Size, loc, b.Perm)
	if err == nil && p.kind(i) == "cpu" {
		p.mems[i] = host.Bytes(r.Addr, b.Size)
	}
	return r, err
}

// setUp registers (or allocates) every buffer, fills buffer i with
// Pattern(i), and returns the Hello that describes them.
func (p *peerProc) setUp() (Hello, error) {
	hello := Hello{Name: p.e.Name(), PID: os.Getpid()}
	for i, b := range p.cfg.Buffers {
		var r *core.Region
		var err error
		switch {
		case b.Alloc:
			r, err = p.alloc(i)
		case p.kind(i) != "cpu":
			err = fmt.Errorf("buffer %d: %s memory needs Alloc", i, b.Location)
		default:
			p.mems[i] = make([]byte, b.Size)
			r, err = p.e.Register(core.RegionDesc{Addr: host.Addr(p.mems[i]), Len: b.Size}, b.Perm)
		}
		if err != nil {
			return hello, err
		}
		p.regions[i] = r
		if err := p.write(i, Pattern(int64(i), b.Size)); err != nil {
			return hello, err
		}
		reg := Region{Addr: r.Addr, Len: b.Size}
		if r.Alloc != nil {
			reg.AllocID = r.Alloc.ID
		}
		hello.Buffers = append(hello.Buffers, reg)
	}
	return hello, nil
}

// answer runs one command line (split into fields) and returns its
// one-line answer; failures are "error ...".
func (p *peerProc) answer(f []string) string {
	if cmd := Commands[f[0]]; cmd != nil {
		ans, err := cmd(p.e, f[1:])
		if err != nil {
			return "error " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		return ans
	}
	switch f[0] {
	case "listeners":
		out, _ := json.Marshal(p.e.Stats().Listeners)
		return string(out)
	case "recv":
		n, err := p.e.RecvNotification(10*time.Second, func(core.Notification) bool { return true })
		if err != nil {
			return fmt.Sprint("error ", err)
		}
		return fmt.Sprintf("%s %s", n.From, n.Msg)
	}
	idx := -1
	if len(f) > 1 {
		idx, _ = strconv.Atoi(f[1])
	}
	if idx < 0 || idx >= len(p.mems) {
		return "error bad buffer index"
	}
	ans, err := p.bufferCommand(f[0], idx, f[2:])
	if err != nil {
		return fmt.Sprint("error ", err)
	}
	return ans
}

// bufferCommand runs a command on buffer idx: sum, fill SEED, free,
// realloc SEED, unregister, register.
func (p *peerProc) bufferCommand(name string, idx int, args []string) (string, error) {
	seed := func() (int64, error) {
		if len(args) < 1 {
			return 0, fmt.Errorf("%s needs a seed", name)
		}
		v, _ := strconv.ParseInt(args[0], 10, 64)
		return v, nil
	}
	switch name {
	case "sum":
		b, err := p.read(idx)
		if err != nil {
			return "", err
		}
		return Sum(b), nil
	case "fill":
		s, err := seed()
		if err != nil {
			return "", err
		}
		return "ok", p.write(idx, Pattern(s, p.cfg.Buffers[idx].Size))
	case "free":
		if p.regions[idx] == nil || p.regions[idx].Alloc == nil {
			return "", fmt.Errorf("buffer is not allocated")
		}
		if err := p.e.Free(p.regions[idx]); err != nil {
			return "", err
		}
		p.regions[idx], p.mems[idx] = nil, nil
		return "ok", nil
	case "realloc":
		s, err := seed()
		if err != nil {
			return "", err
		}
		return p.realloc(idx, s)
	case "unregister":
		return "ok", p.e.Unregister(p.regions[idx])
	case "register":
		return p.register(idx)
	}
	return "", fmt.Errorf("unknown command")
}

// realloc frees buffer idx if the engine allocated it, allocates it anew
// and fills it with Pattern(seed); the answer is "ADDR ALLOCID".
func (p *peerProc) realloc(idx int, seed int64) (string, error) {
	if p.regions[idx] != nil && p.regions[idx].Alloc != nil {
		if err := p.e.Free(p.regions[idx]); err != nil {
			return "", err
		}
		p.regions[idx], p.mems[idx] = nil, nil
	}
	r, err := p.alloc(idx)
	if err != nil {
		return "", err
	}
	p.regions[idx] = r
	if err := p.write(idx, Pattern(seed, p.cfg.Buffers[idx].Size)); err != nil {
		return "", err
	}
	return fmt.Sprint(r.Addr, " ", r.Alloc.ID), nil
}

// register registers buffer idx again (after unregister).
func (p *peerProc) register(idx int) (string, error) {
	var addr uint64
	switch {
	case p.mems[idx] != nil:
		addr = host.Addr(p.mems[idx])
	case p.regions[idx] != nil:
		addr = p.regions[idx].Addr
	default:
		return "", fmt.Errorf("buffer was freed")
	}
	b := p.cfg.Buffers[idx]
	r, err := p.e.Register(core.RegionDesc{Addr: addr, Len: b.Size, Location: b.Location}, b.Perm)
	if err != nil {
		return "", err
	}
	p.regions[idx] = r
	return "ok", nil
}
