// Command gpucheck checks tent's GPU paths on a real GPU (or, for a dry
// run, on the fake driver cuda/fakecuda and the fake NVML cuda/fakenvml)
// and prints one JSON report (Report). Two processes, this one and a peer
// it starts (itself, in child mode), each with an engine:
//
//   - VRAM to VRAM through the cuda transport (POSIX fd handles), for each
//     block size of -sizes (default 4 KiB to 1 GiB), read and write, with
//     checksums, GB/s beside cuMemcpyDtoD of the same blocks in this run;
//
//   - host to VRAM and back in one process (two engines: cuMemcpyHtoD/DtoH
//     by the cuda transport), checksums and GB/s;
//
//   - tcp staging of the peer's cuMemAlloc ("cudaMalloc") memory, which no
//     fd can share: every request carries FlagStaged (TENT_STATUS_STAGED);
//
//   - registration of a raw device pointer (location detected "cuda:N"),
//     of Engine.Alloc("cuda:N") (tent_alloc) and of host memory ("cpu");
//
//   - uninstall of "cuda" with a batch in flight, then no request served by
//     cuda (no stale mapping used), then engine destroy: the process's fds,
//     cuMemGetInfo's free memory and the driver's allocation count (the
//     fake's counters; NVML's per-process memory on a real driver) back at
//     their baseline;
//
//   - the GPU topology through go-nvml (name, PCI bus id, NUMA, fabric).
//
//     gpucheck [-sizes 4K,64K,1M,64M,1G] [-dev 0] [-peer-dev 0] [-no-meminfo]
//
// Exit 0 when every check passed, 1 when one failed, 2 when it could not
// run (no GPU, timeout: -timeout bounds the whole run).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/cuda/nvmlinfo"
	tmem "github.com/tent-dev/tent/memory"
	cumem "github.com/tent-dev/tent/memory/cuda"
	cudatransport "github.com/tent-dev/tent/transport/cuda"
	"github.com/tent-dev/tent/transport/tcp"
)

var (
	sizesFlag  = flag.String("sizes", "4K,64K,1M,64M,1G", "block sizes, VRAM to VRAM and host to VRAM")
	chunk      = flag.Uint64("chunk", 64<<20, "host buffer size for filling and summing device memory")
	stagedSize = flag.Uint64("staged-size", 64<<20, "bytes moved by tcp staging each way")
	dev        = flag.Int("dev", 0, "GPU of this process")
	peerDev    = flag.Int("peer-dev", 0, "GPU of the peer process")
	timeout    = flag.Duration("timeout", 7*time.Minute, "bound on the whole run")
	tol        = flag.Uint64("tolerance", 64<<20, "allowed drift of the GPU's free memory")
	noMem      = flag.Bool("no-meminfo", false, "skip cuMemGetInfo (the fake driver lacks it)")

	// maxSize is the largest of -sizes: each side's VRAM buffer.
	maxSize = new(uint64)
)

// Report is the JSON gpucheck prints.
type Report struct {
	OK     bool     `json:"ok"`
	Errors []string `json:"errors,omitempty"`

	Driver     string `json:"driver"`
	FakeDriver bool   `json:"fake_driver"`
	Device     string `json:"device"`
	Dev        int    `json:"dev"`
	PeerDev    int    `json:"peer_dev"`

	Topology     nvmlinfo.TopologyInfo `json:"topology"`
	VRAM         []VRAMResult          `json:"vram_to_vram"`
	HostVRAM     []HostResult          `json:"host_vram"`
	Staged       *StagedResult         `json:"tcp_staged,omitempty"`
	Registration *RegResult            `json:"registration,omitempty"`
	Teardown     TeardownResult        `json:"teardown"`

	ElapsedSeconds float64 `json:"elapsed_s"`
}

func (r *Report) fail(format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}

func main() {
	flag.Parse()
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(2)
	}
	for _, s := range sizes {
		*maxSize = max(*maxSize, s)
	}
	// Staging moves into local VRAM of -sizes' largest block.
	*stagedSize = min(*stagedSize, *maxSize)
	if os.Getenv(childEnv) != "" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck peer:", err)
			os.Exit(1)
		}
		return
	}
	rep := &Report{Dev: *dev, PeerDev: *peerDev, VRAM: []VRAMResult{}, HostVRAM: []HostResult{}}
	start := time.Now()
	var peer *peerProc
	timer := time.AfterFunc(*timeout, func() {
		if peer != nil {
			peer.kill()
		}
		rep.fail("timeout after %v", *timeout)
		emit(rep, start, 2)
	})
	code := run(rep, sizes, &peer)
	timer.Stop()
	emit(rep, start, code)
}

func emit(rep *Report, start time.Time, code int) {
	rep.ElapsedSeconds = time.Since(start).Seconds()
	rep.OK = code == 0 && len(rep.Errors) == 0
	if !rep.OK && code == 0 {
		code = 1
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	os.Exit(code)
}

// parseSizes reads "4K,64K,1M,64M,1G" (K, M, G: powers of 1024).
func parseSizes(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToUpper(f))
		mul := uint64(1)
		switch {
		case strings.HasSuffix(f, "K"):
			mul, f = 1<<10, strings.TrimSuffix(f, "K")
		case strings.HasSuffix(f, "M"):
			mul, f = 1<<20, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "G"):
			mul, f = 1<<30, strings.TrimSuffix(f, "G")
		}
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil || n == 0 || n*mul%8 != 0 {
			return nil, fmt.Errorf("-sizes: bad size %q (a positive multiple of 8 bytes, K/M/G suffixes)", f)
		}
		out = append(out, n*mul)
	}
	return out, nil
}

func gbps(n uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1
}

// thisProcess is the set of local peers the check's engines share: the
// host checks move between two engines of this process.
var thisProcess = core.NewLocalPeers()

// newEngine is an engine with GPU memory (when the process has a driver),
// the cuda transport and tcp (which stages GPU memory no fd can share).
func newEngine() (*core.Engine, error) {
	var kinds []tmem.Kind
	if gpu, err := cumem.Open(); err == nil {
		kinds = append(kinds, gpu)
	}
	return core.New(core.Options{
		Available:      []core.TransportSpec{cudatransport.Spec(), tcp.Spec(tcp.Options{})},
		Memory:         kinds,
		DefaultTimeout: time.Minute,
		LocalPeers:     thisProcess,
	})
}
