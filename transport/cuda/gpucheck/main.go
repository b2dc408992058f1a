// Command gpucheck checks the cuda transport on a real GPU: two processes
// on one GPU, 1 GiB moved VRAM to VRAM through the transport in both
// directions with checksums, the bandwidth next to a plain cuMemcpyDtoD of
// the same size in the same run, then uninstall and destroy, and the
// process's file descriptors and the GPU's free memory back at their
// baseline. It prints one JSON object and exits 0 when every check passed,
// 1 when one failed, 2 when it could not run (no GPU, timeout).
//
//	go run ./transport/cuda/gpucheck [-size 1073741824] [-chunk 67108864] [-dev 0] [-peer-dev 0]
//
// It needs a CUDA driver with virtual memory management and POSIX fd
// handles (any Linux driver of the last years). Runtime: well under a
// minute on a current GPU; the whole run is bounded by -timeout (4m30s).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	cudatransport "github.com/tent-dev/tent/transport/cuda"
)

const childEnv = "TENT_GPUCHECK_CHILD"

// Result is the JSON gpucheck prints.
type Result struct {
	OK     bool     `json:"ok"`
	Errors []string `json:"errors,omitempty"`

	Driver     string `json:"driver,omitempty"`
	Device     string `json:"device,omitempty"`
	Dev        int    `json:"dev"`
	PeerDev    int    `json:"peer_dev"`
	Size       uint64 `json:"size"`
	Chunk      uint64 `json:"chunk"`
	Iterations int    `json:"iterations"`

	FirstReadMs   float64 `json:"first_read_ms"` // includes the session and the import
	ReadGBps      float64 `json:"read_gbps"`     // best of Iterations, after the first
	WriteGBps     float64 `json:"write_gbps"`
	DtoDGBps      float64 `json:"plain_dtod_gbps"` // cuMemcpyDtoD of Size in this process
	ReadRatio     float64 `json:"read_ratio"`      // read / plain DtoD
	WriteRatio    float64 `json:"write_ratio"`
	ReadChecksum  bool    `json:"read_checksum_ok"`
	WriteChecksum bool    `json:"write_checksum_ok"`

	TransportStats map[string]int64 `json:"transport_stats_before_uninstall,omitempty"`
	AfterUninstall map[string]int64 `json:"transport_stats_after_uninstall,omitempty"`

	FDsBefore      int     `json:"fds_before"`
	FDsAfter       int     `json:"fds_after"`
	FreeBefore     uint64  `json:"gpu_free_before"`
	FreeAfter      uint64  `json:"gpu_free_after"`
	FreeDelta      int64   `json:"gpu_free_delta"` // after - before; ~0 when nothing leaked
	FreeTolerance  uint64  `json:"gpu_free_tolerance"`
	ElapsedSeconds float64 `json:"elapsed_s"`
}

var (
	size    = flag.Uint64("size", 1<<30, "bytes to move")
	chunk   = flag.Uint64("chunk", 64<<20, "bytes per request")
	dev     = flag.Int("dev", 0, "GPU of this process")
	peerDev = flag.Int("peer-dev", 0, "GPU of the peer process")
	iters   = flag.Int("iterations", 3, "timed transfers per direction")
	timeout = flag.Duration("timeout", 4*time.Minute+30*time.Second, "bound on the whole run")
	tol     = flag.Uint64("tolerance", 64<<20, "allowed drift of the GPU's free memory")
	noMem   = flag.Bool("no-meminfo", false, "skip the free-memory check (for the fake driver, which lacks cuMemGetInfo)")
)

func main() {
	flag.Parse()
	if os.Getenv(childEnv) != "" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck child:", err)
			os.Exit(1)
		}
		return
	}
	res := &Result{Dev: *dev, PeerDev: *peerDev, Size: *size, Chunk: *chunk, Iterations: *iters, FreeTolerance: *tol}
	start := time.Now()
	var peer *peerProc
	timer := time.AfterFunc(*timeout, func() {
		if peer != nil {
			peer.kill()
		}
		res.Errors = append(res.Errors, fmt.Sprintf("timeout after %v", *timeout))
		emit(res, start, 2)
	})
	defer timer.Stop()
	code := run(res, &peer)
	timer.Stop()
	emit(res, start, code)
}

func emit(res *Result, start time.Time, code int) {
	res.ElapsedSeconds = time.Since(start).Seconds()
	res.OK = code == 0 && len(res.Errors) == 0
	if !res.OK && code == 0 {
		code = 1
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println(string(b))
	os.Exit(code)
}

func (r *Result) fail(format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}

// pattern fills b with the deterministic content of [off, off+len(b)) of
// a buffer with seed: splitmix64 of the word index, fast enough for GiBs.
func pattern(b []byte, seed, off uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		z := seed*0x9e3779b97f4a7c15 + (off+uint64(i))/8 + 1
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
}

// expected is the sha256 of a whole pattern buffer.
func expected(seed, n, step uint64) string {
	h := sha256.New()
	buf := make([]byte, step)
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		pattern(buf[:m], seed, off)
		h.Write(buf[:m])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// fill writes the pattern into device memory through a host buffer.
func fill(d *cu.Driver, addr, n, seed, step uint64) error {
	buf := make([]byte, step)
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		pattern(buf[:m], seed, off)
		if err := d.CopyHtoD(addr+off, buf[:m]); err != nil {
			return err
		}
	}
	return nil
}

// sum is the sha256 of device memory, read through a host buffer.
func sum(d *cu.Driver, addr, n, step uint64) (string, error) {
	h := sha256.New()
	buf := make([]byte, step)
	for off := uint64(0); off < n; off += step {
		m := min(step, n-off)
		if err := d.CopyDtoH(buf[:m], addr+off); err != nil {
			return "", err
		}
		h.Write(buf[:m])
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1
}

// hello is what the child reports once its buffer is ready.
type hello struct {
	Name string `json:"name"`
	Addr uint64 `json:"addr"`
}

// child: an engine with one GPU buffer of -size on -peer-dev filled with
// pattern seed 1; commands on stdin: "sum" (sha256 of the buffer), "exit".
func child() error {
	d, err := cu.Default()
	if err != nil {
		return err
	}
	e, err := core.New(core.Options{Available: []core.TransportSpec{cudatransport.Spec()}, Memory: gpuMemory()})
	if err != nil {
		return err
	}
	defer e.Close()
	r, err := e.Alloc(*size, "cuda:"+strconv.Itoa(*peerDev), core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		return err
	}
	if err := fill(d, r.Addr, *size, 1, *chunk); err != nil {
		return err
	}
	b, _ := json.Marshal(hello{Name: e.Name(), Addr: r.Addr})
	fmt.Println(string(b))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "sum":
			s, err := sum(d, r.Addr, *size, *chunk)
			if err != nil {
				fmt.Println("error", err)
			} else {
				fmt.Println(s)
			}
		case "exit":
			if err := e.Free(r); err != nil {
				return err
			}
			return e.Close()
		}
	}
	return nil
}

type peerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func (p *peerProc) kill() { _ = p.cmd.Process.Kill() }

func (p *peerProc) ask(line string) (string, error) {
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		return "", err
	}
	s, err := p.out.ReadString('\n')
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "error") {
		return "", fmt.Errorf("peer: %s", s)
	}
	return s, err
}

func startPeer() (*peerProc, hello, error) {
	var h hello
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, h, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, h, err
	}
	if err := cmd.Start(); err != nil {
		return nil, h, err
	}
	p := &peerProc{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.kill()
		_ = cmd.Wait()
		return nil, h, fmt.Errorf("peer did not start: %v", err)
	}
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		p.kill()
		_ = cmd.Wait()
		return nil, h, fmt.Errorf("peer hello %q: %v", line, err)
	}
	return p, h, nil
}

// move runs one batch covering [0, size) in chunk-sized requests and
// returns its wall time.
func move(e *core.Engine, seg *core.Segment, op core.Op, local, remote uint64) (time.Duration, error) {
	var reqs []core.TransferRequest
	for off := uint64(0); off < *size; off += *chunk {
		reqs = append(reqs, core.TransferRequest{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Len: min(*chunk, *size-off)})
	}
	t0 := time.Now()
	b, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute})
	if err != nil {
		return 0, err
	}
	defer e.ReleaseBatch(b)
	code, err := b.Wait(-1)
	el := time.Since(t0)
	if code != 0 {
		return el, fmt.Errorf("batch: %v", err)
	}
	st := make([]core.RequestStatus, len(reqs))
	b.Status(st)
	for i, s := range st {
		if s.Transport != cudatransport.ID {
			return el, fmt.Errorf("request %d served by transport %d, not cuda", i, s.Transport)
		}
	}
	return el, nil
}

func gbps(n uint64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

func run(res *Result, peerOut **peerProc) int {
	d, err := cu.Default()
	if err != nil {
		res.fail("%v", err)
		return 2
	}
	res.Driver = d.VersionString()
	if info, err := d.Device(*dev); err == nil {
		res.Device = info.Name
		if !info.VMM || !info.PosixFD {
			res.fail("device %d lacks VMM with POSIX fd handles", *dev)
			return 2
		}
	}
	// Baselines: after this process's context exists (it stays for the
	// process's life) and the network poller is up, before the peer runs.
	if _, err := d.Granularity(*dev); err != nil {
		res.fail("%v", err)
		return 2
	}
	if warm, err := core.New(core.Options{Available: []core.TransportSpec{cudatransport.Spec()}, Memory: gpuMemory()}); err == nil {
		_ = warm.Close()
	}
	res.FDsBefore = countFDs()
	if !*noMem {
		if res.FreeBefore, _, err = memInfo(d.Path(), *dev); err != nil {
			res.fail("%v", err)
			return 2
		}
	}

	peer, h, err := startPeer()
	if err != nil {
		res.fail("%v", err)
		return 2
	}
	*peerOut = peer
	defer peer.kill()

	e, err := core.New(core.Options{Available: []core.TransportSpec{cudatransport.Spec()}, DefaultTimeout: time.Minute, Memory: gpuMemory()})
	if err != nil {
		res.fail("engine: %v", err)
		return 1
	}
	code := exercise(res, d, e, peer, h)
	if err := e.Close(); err != nil {
		res.fail("engine close: %v", err)
	}
	if _, err := peer.ask("exit"); err != nil && err != io.EOF {
		res.fail("peer exit: %v", err)
	}
	_ = peer.in.Close()
	if err := peer.cmd.Wait(); err != nil {
		res.fail("peer: %v", err)
	}
	*peerOut = nil

	res.FDsAfter = countFDs()
	if res.FDsAfter != res.FDsBefore {
		res.fail("file descriptors: %d before, %d after", res.FDsBefore, res.FDsAfter)
	}
	if *noMem {
		return code
	}
	// Freed device memory may take a moment to show.
	for i := 0; i < 20; i++ {
		res.FreeAfter, _, err = memInfo(d.Path(), *dev)
		if err != nil || absDelta(res.FreeAfter, res.FreeBefore) <= *tol {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.FreeDelta = int64(res.FreeAfter) - int64(res.FreeBefore)
	if err != nil {
		res.fail("%v", err)
	} else if absDelta(res.FreeAfter, res.FreeBefore) > *tol {
		res.fail("GPU free memory: %d before, %d after (delta %d, tolerance %d)", res.FreeBefore, res.FreeAfter, res.FreeDelta, *tol)
	}
	return code
}

func absDelta(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

func exercise(res *Result, d *cu.Driver, e *core.Engine, peer *peerProc, h hello) int {
	loc := "cuda:" + strconv.Itoa(*dev)
	local, err := e.Alloc(*size, loc, core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		res.fail("alloc: %v", err)
		return 1
	}
	plain, err := e.Alloc(*size, loc, core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		res.fail("alloc: %v", err)
		return 1
	}
	seg, err := e.OpenSegment(h.Name)
	if err != nil {
		res.fail("open segment: %v", err)
		return 1
	}

	// READ: the peer's pattern 1 into local.
	el, err := move(e, seg, core.OpRead, local.Addr, h.Addr)
	if err != nil {
		res.fail("first read: %v", err)
		return 1
	}
	res.FirstReadMs = float64(el.Microseconds()) / 1000
	best := time.Duration(1 << 62)
	for i := 0; i < *iters; i++ {
		el, err := move(e, seg, core.OpRead, local.Addr, h.Addr)
		if err != nil {
			res.fail("read: %v", err)
			return 1
		}
		best = min(best, el)
	}
	res.ReadGBps = gbps(*size, best)
	got, err := sum(d, local.Addr, *size, *chunk)
	if err != nil {
		res.fail("local sum: %v", err)
		return 1
	}
	res.ReadChecksum = got == expected(1, *size, *chunk)
	if !res.ReadChecksum {
		res.fail("read checksum mismatch")
	}

	// WRITE: pattern 2 from local to the peer.
	if err := fill(d, local.Addr, *size, 2, *chunk); err != nil {
		res.fail("fill: %v", err)
		return 1
	}
	best = time.Duration(1 << 62)
	for i := 0; i < *iters; i++ {
		el, err := move(e, seg, core.OpWrite, local.Addr, h.Addr)
		if err != nil {
			res.fail("write: %v", err)
			return 1
		}
		best = min(best, el)
	}
	res.WriteGBps = gbps(*size, best)
	remoteSum, err := peer.ask("sum")
	if err != nil {
		res.fail("peer sum: %v", err)
		return 1
	}
	res.WriteChecksum = remoteSum == expected(2, *size, *chunk)
	if !res.WriteChecksum {
		res.fail("write checksum mismatch")
	}

	// Plain cuMemcpyDtoD of the same size, same process, same GPU.
	best = time.Duration(1 << 62)
	for i := 0; i < *iters; i++ {
		t0 := time.Now()
		if err := d.CopyDtoD(plain.Addr, local.Addr, *size); err != nil {
			res.fail("cuMemcpyDtoD: %v", err)
			return 1
		}
		best = min(best, time.Since(t0))
	}
	res.DtoDGBps = gbps(*size, best)
	if res.DtoDGBps > 0 {
		res.ReadRatio = res.ReadGBps / res.DtoDGBps
		res.WriteRatio = res.WriteGBps / res.DtoDGBps
	}

	res.TransportStats = e.Stats().Transports[cudatransport.Name]
	var tr core.Transport
	for _, t := range e.Transports() {
		if t.Name() == cudatransport.Name {
			tr = t
		}
	}
	if err := e.Uninstall(cudatransport.Name); err != nil {
		res.fail("uninstall: %v", err)
	}
	if tr != nil {
		res.AfterUninstall = tr.Stats()
		for _, k := range []string{"mappings", "streams", "events", "sessions", "server_conns", "leases", "inflight", "cached_imports"} {
			if v := res.AfterUninstall[k]; v != 0 {
				res.fail("after uninstall the transport still holds %s=%d", k, v)
			}
		}
	}
	return 0
}

// gpuMemory is the GPU memory of the process's driver for an engine's
// Options.Memory, as the C library gives its engines; none without one.
func gpuMemory() []tmem.Kind {
	if gpu, err := cumem.Open(); err == nil {
		return []tmem.Kind{gpu}
	}
	return nil
}
