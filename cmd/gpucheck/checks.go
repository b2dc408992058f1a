package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	cudatransport "github.com/tent-dev/tent/transport/cuda"
	"github.com/tent-dev/tent/transport/tcp"
)

// Seeds of the patterns this process writes.
const (
	seedLocalVRAM = 2 // local VRAM, written to the peer's
	seedMallocIn  = 4 // local VRAM, written to the peer's cuMemAlloc memory
	seedHost      = 5 // the host region, read into VRAM
	seedVRAMOut   = 6 // local VRAM, written into the host region
)

// batchBytes bounds the bytes of one timed batch of small blocks.
const batchBytes = 256 << 20

// shape is how a block size is measured: blocks per batch, timed batches.
func shape(size uint64) (blocks, iters int) {
	blocks = int(max(1, min(256, min(*maxSize, batchBytes)/size)))
	iters = 10
	if uint64(blocks)*size >= 64<<20 {
		iters = 3
	}
	return blocks, iters
}

// move runs one batch of blocks requests of size at offsets 0, size, ...
// and returns its wall time. Every request must be served by transport
// want (a core.Transport* id), with FlagStaged iff staged.
func move(e *core.Engine, seg *core.Segment, op core.Op, local, remote, size uint64, blocks int, want uint32, staged bool) (time.Duration, error) {
	reqs := make([]core.TransferRequest, blocks)
	for i := range reqs {
		off := uint64(i) * size
		reqs[i] = core.TransferRequest{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Len: size}
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
		if s.Transport != want {
			return el, fmt.Errorf("request %d served by transport %d, want %d", i, s.Transport, want)
		}
		if (s.Flags&core.FlagStaged != 0) != staged {
			return el, fmt.Errorf("request %d: staged flag %v, want %v", i, s.Flags&core.FlagStaged != 0, staged)
		}
	}
	return el, nil
}

// timed runs move iters times after a first untimed one and returns the
// first's time and the best.
func timed(iters int, f func() (time.Duration, error)) (first, best time.Duration, err error) {
	if first, err = f(); err != nil {
		return 0, 0, err
	}
	best = time.Duration(1 << 62)
	for i := 0; i < iters; i++ {
		el, err := f()
		if err != nil {
			return 0, 0, err
		}
		best = min(best, el)
	}
	return first, best, nil
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func vramChecks(rep *Report, d *cu.Driver, e *core.Engine, seg *core.Segment, peer *peerProc, h hello, local, plain uint64, sizes []uint64) error {
	results := make([]VRAMResult, len(sizes))
	// READ: the peer's pattern into local, every size, then WRITE.
	for i, size := range sizes {
		blocks, iters := shape(size)
		n := uint64(blocks) * size
		r := VRAMResult{Size: size, Blocks: blocks, Iterations: iters}
		first, best, err := timed(iters, func() (time.Duration, error) {
			return move(e, seg, core.OpRead, local, h.VRAM, size, blocks, cudatransport.ID, false)
		})
		if err != nil {
			return fmt.Errorf("read %d: %w", size, err)
		}
		r.FirstReadMs = float64(first.Microseconds()) / 1000
		r.ReadGBps = gbps(n, best)
		got, err := sum(d, local, n, *chunk)
		if err != nil {
			return err
		}
		if r.ReadSumOK = got == expected(seedPeerVRAM, n, *chunk); !r.ReadSumOK {
			rep.fail("VRAM read %d: checksum mismatch", size)
		}
		// cuMemcpyDtoD of the same blocks on one stream, this process.
		_, best, err = timed(iters, func() (time.Duration, error) { return dtod(d, plain, local, size, blocks) })
		if err != nil {
			return fmt.Errorf("cuMemcpyDtoD %d: %w", size, err)
		}
		r.DtoDGBps = gbps(n, best)
		r.ReadRatio = ratio(r.ReadGBps, r.DtoDGBps)
		results[i] = r
	}
	if err := fill(d, local, *maxSize, seedLocalVRAM, *chunk); err != nil {
		return err
	}
	for i, size := range sizes {
		r := &results[i]
		n := uint64(r.Blocks) * size
		_, best, err := timed(r.Iterations, func() (time.Duration, error) {
			return move(e, seg, core.OpWrite, local, h.VRAM, size, r.Blocks, cudatransport.ID, false)
		})
		if err != nil {
			return fmt.Errorf("write %d: %w", size, err)
		}
		r.WriteGBps = gbps(n, best)
		r.WriteRatio = ratio(r.WriteGBps, r.DtoDGBps)
		got, err := peer.ask("sum vram " + strconv.FormatUint(n, 10))
		if err != nil {
			return err
		}
		if r.WriteSumOK = got == expected(seedLocalVRAM, n, *chunk); !r.WriteSumOK {
			rep.fail("VRAM write %d: checksum mismatch", size)
		}
	}
	rep.VRAM = results
	return nil
}

// dtod copies blocks of size from src to dst on one stream and waits.
func dtod(d *cu.Driver, dst, src, size uint64, blocks int) (time.Duration, error) {
	s, err := d.NewStream(*dev)
	if err != nil {
		return 0, err
	}
	defer s.Destroy()
	t0 := time.Now()
	for i := 0; i < blocks; i++ {
		off := uint64(i) * size
		if err := s.MemcpyDtoD(dst+off, src+off, size); err != nil {
			return 0, err
		}
	}
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// hostChecks moves between local VRAM (engine e) and a host region of a
// second engine in this process: the cuda transport's HtoD and DtoH.
func hostChecks(rep *Report, d *cu.Driver, e *core.Engine, local uint64, sizes []uint64) error {
	host, err := hostMemory(*maxSize)
	if err != nil {
		return err
	}
	defer unmapHost(host)
	pattern(host, seedHost, 0)
	e2, err := newEngine()
	if err != nil {
		return err
	}
	defer e2.Close()
	hostAddr := uint64(uintptr(unsafe.Pointer(&host[0])))
	hr, err := e2.Register(core.RegionDesc{Addr: hostAddr, Len: *maxSize, Location: "cpu"}, core.PermRemoteRead|core.PermRemoteWrite)
	if err != nil {
		return err
	}
	defer e2.Unregister(hr)
	seg, err := e.OpenSegment(e2.Name())
	if err != nil {
		return err
	}
	defer e.CloseSegment(seg)
	results := make([]HostResult, len(sizes))
	for i, size := range sizes {
		blocks, iters := shape(size)
		n := uint64(blocks) * size
		r := HostResult{Size: size, Blocks: blocks, Iterations: iters}
		_, best, err := timed(iters, func() (time.Duration, error) {
			return move(e, seg, core.OpRead, local, hostAddr, size, blocks, cudatransport.ID, false)
		})
		if err != nil {
			return fmt.Errorf("host to VRAM %d: %w", size, err)
		}
		r.HtoDGBps = gbps(n, best)
		got, err := sum(d, local, n, *chunk)
		if err != nil {
			return err
		}
		if r.HtoDSumOK = got == expected(seedHost, n, *chunk); !r.HtoDSumOK {
			rep.fail("host to VRAM %d: checksum mismatch", size)
		}
		results[i] = r
	}
	if err := fill(d, local, *maxSize, seedVRAMOut, *chunk); err != nil {
		return err
	}
	for i, size := range sizes {
		r := &results[i]
		n := uint64(r.Blocks) * size
		_, best, err := timed(r.Iterations, func() (time.Duration, error) {
			return move(e, seg, core.OpWrite, local, hostAddr, size, r.Blocks, cudatransport.ID, false)
		})
		if err != nil {
			return fmt.Errorf("VRAM to host %d: %w", size, err)
		}
		r.DtoHGBps = gbps(n, best)
		if r.DtoHSumOK = hostSum(host[:n]) == expected(seedVRAMOut, n, *chunk); !r.DtoHSumOK {
			rep.fail("VRAM to host %d: checksum mismatch", size)
		}
	}
	rep.HostVRAM = results
	return nil
}

// stagedCheck reads and writes the peer's cuMemAlloc memory, which has no
// shareable handle: tcp serves it through host buffers.
func stagedCheck(rep *Report, d *cu.Driver, e *core.Engine, seg *core.Segment, peer *peerProc, h hello, local uint64) error {
	n := *stagedSize
	r := &StagedResult{Size: n, PeerLoc: h.MallocLoc, Transport: tcp.Name}
	rep.Staged = r
	if want := "cuda:" + strconv.Itoa(*peerDev); h.MallocLoc != want {
		rep.fail("peer's cuMemAlloc memory detected as %q, want %q", h.MallocLoc, want)
	}
	blocks := int(max(1, n / *chunk))
	size := n / uint64(blocks)
	_, best, err := timed(2, func() (time.Duration, error) {
		return move(e, seg, core.OpRead, local, h.Malloc, size, blocks, tcp.ID, true)
	})
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	r.ReadGBps = gbps(n, best)
	got, err := sum(d, local, n, *chunk)
	if err != nil {
		return err
	}
	if r.ReadSumOK = got == expected(seedPeerMalloc, n, *chunk); !r.ReadSumOK {
		rep.fail("tcp staged read: checksum mismatch")
	}
	if err := fill(d, local, n, seedMallocIn, *chunk); err != nil {
		return err
	}
	_, best, err = timed(2, func() (time.Duration, error) {
		return move(e, seg, core.OpWrite, local, h.Malloc, size, blocks, tcp.ID, true)
	})
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	r.WriteGBps = gbps(n, best)
	got, err = peer.ask("sum malloc " + strconv.FormatUint(n, 10))
	if err != nil {
		return err
	}
	if r.WriteSumOK = got == expected(seedMallocIn, n, *chunk); !r.WriteSumOK {
		rep.fail("tcp staged write: checksum mismatch")
	}
	r.StagedFlags = true // move checked FlagStaged on every request
	return nil
}

func registrationCheck(rep *Report, d *cu.Driver, e *core.Engine) error {
	const n = 1 << 20
	r := &RegResult{}
	rep.Registration = r
	want := "cuda:" + strconv.Itoa(*dev)
	perm := core.PermRemoteRead | core.PermRemoteWrite

	// A raw device pointer, as __cuda_array_interface__ hands one over.
	raw, err := d.MemAlloc(*dev, n)
	if err != nil {
		return err
	}
	defer d.MemFree(raw)
	reg, err := e.Register(core.RegionDesc{Addr: raw, Len: n}, perm)
	if err != nil {
		return fmt.Errorf("raw pointer: %w", err)
	}
	r.RawPointerLoc = reg.Loc.String()
	if err := e.Unregister(reg); err != nil {
		return err
	}
	_, err = e.Register(core.RegionDesc{Addr: raw, Len: n, Location: "cpu"}, perm)
	r.DeviceAsHostRefused = err != nil
	if err != nil {
		r.DeviceAsHostError = err.Error()
	} else {
		rep.fail("a device pointer registered as cpu memory was accepted")
	}

	a, err := e.Alloc(n, want, perm)
	if err != nil {
		return fmt.Errorf("alloc %s: %w", want, err)
	}
	r.AllocLoc = a.Loc.String()
	if err := e.Free(a); err != nil {
		return err
	}

	host, err := hostMemory(n)
	if err != nil {
		return err
	}
	defer unmapHost(host)
	hreg, err := e.Register(core.RegionDesc{Addr: uint64(uintptr(unsafe.Pointer(&host[0]))), Len: n}, perm)
	if err != nil {
		return fmt.Errorf("host memory: %w", err)
	}
	r.HostLoc = hreg.Loc.String()
	if err := e.Unregister(hreg); err != nil {
		return err
	}
	if r.RawPointerLoc != want || r.AllocLoc != want || !strings.HasPrefix(r.HostLoc, "cpu") {
		rep.fail("locations: raw pointer %q, alloc %q (want %q), host %q (want cpu)", r.RawPointerLoc, r.AllocLoc, want, r.HostLoc)
	}
	return nil
}

// teardownUnderLoad uninstalls "cuda" while readers keep batches in
// flight, then checks a request after it is not served by cuda (whose
// imported mappings are gone) and, if served, moves the right bytes.
func teardownUnderLoad(rep *Report, d *cu.Driver, e *core.Engine, seg *core.Segment, peer *peerProc, h hello, local uint64) error {
	td := &rep.Teardown
	td.BatchOutcomes = map[string]int{}
	size := min(*chunk, *maxSize)
	blocks := int(max(1, min(*maxSize, 1<<30)/size))
	var (
		mu      sync.Mutex
		stop    = make(chan struct{})
		started = make(chan struct{}, 64)
		wg      sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]core.TransferRequest, blocks)
				for i := range reqs {
					off := uint64(i) * size
					reqs[i] = core.TransferRequest{Op: core.OpRead, Local: local + off, Segment: seg, Remote: h.VRAM + off, Len: size}
				}
				b, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute})
				select {
				case started <- struct{}{}:
				default:
				}
				outcome := "submit refused"
				if err == nil {
					code, _ := b.Wait(2 * time.Minute)
					outcome = code.String()
					e.ReleaseBatch(b)
				}
				mu.Lock()
				td.BatchOutcomes[outcome]++
				td.BatchesUnderLoad++
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < 4; i++ {
		<-started // batches are in flight
	}
	var tr core.Transport
	for _, t := range e.Transports() {
		if t.Name() == cudatransport.Name {
			tr = t
		}
	}
	if err := e.Uninstall(cudatransport.Name); err != nil {
		td.UninstallError = err.Error()
		rep.fail("uninstall: %v", err)
	}
	close(stop)
	wg.Wait()
	if tr != nil {
		td.StatsAfter = tr.Stats()
		for _, k := range []string{"mappings", "streams", "events", "sessions", "server_conns", "leases", "inflight", "cached_imports"} {
			if v := td.StatsAfter[k]; v != 0 {
				rep.fail("cuda transport after uninstall: %s = %d", k, v)
			}
		}
	}

	// One more read of the peer's VRAM: cuda is gone, so tcp stages it or
	// it fails; it must never reach a stale mapping.
	n := min(uint64(1<<20), *maxSize)
	reqs := []core.TransferRequest{{Op: core.OpRead, Local: local, Segment: seg, Remote: h.VRAM, Len: n}}
	b, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute})
	if err != nil {
		td.AfterUninstall = "refused: " + err.Error()
		return nil
	}
	defer e.ReleaseBatch(b)
	code, werr := b.Wait(time.Minute)
	st := make([]core.RequestStatus, 1)
	b.Status(st)
	switch {
	case st[0].Transport == cudatransport.ID:
		rep.fail("a request after uninstall was served by cuda")
		td.AfterUninstall = "cuda"
	case code != 0:
		td.AfterUninstall = fmt.Sprintf("failed: %s: %v", code, werr)
	default:
		td.AfterUninstall = fmt.Sprintf("transport %d, staged %v", st[0].Transport, st[0].Flags&core.FlagStaged != 0)
		want, err := peer.ask("sum vram " + strconv.FormatUint(n, 10))
		if err != nil {
			return err
		}
		got, err := sum(d, local, n, *chunk)
		if err != nil {
			return err
		}
		ok := got == want
		td.AfterUninstallSum = &ok
		if !ok {
			rep.fail("request after uninstall: checksum mismatch")
		}
	}
	return nil
}

// nvmlProcessMemory is the GPU memory NVML accounts to pid on all GPUs.
func nvmlProcessMemory(pid int) (int64, bool) {
	if nvml.Init() != nvml.SUCCESS {
		return 0, false
	}
	defer nvml.Shutdown()
	count, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return 0, false
	}
	var total int64
	for i := 0; i < count; i++ {
		dev, r := nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return 0, false
		}
		procs, r := dev.GetComputeRunningProcesses()
		if r != nvml.SUCCESS {
			return 0, false
		}
		for _, p := range procs {
			if int(p.Pid) == pid {
				total += int64(p.UsedGpuMemory)
			}
		}
	}
	return total, true
}
