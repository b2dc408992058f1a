package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/cuda/nvmlinfo"
)

// VRAMResult is one block size of VRAM to VRAM between the processes.
type VRAMResult struct {
	Size        uint64  `json:"size"`
	Blocks      int     `json:"blocks"` // requests of Size per batch
	Iterations  int     `json:"iterations"`
	FirstReadMs float64 `json:"first_read_ms"`
	ReadGBps    float64 `json:"read_gbps"` // best batch after the first
	WriteGBps   float64 `json:"write_gbps"`
	DtoDGBps    float64 `json:"dtod_gbps"` // cuMemcpyDtoD of the same blocks, one stream
	ReadRatio   float64 `json:"read_ratio"`
	WriteRatio  float64 `json:"write_ratio"`
	ReadSumOK   bool    `json:"read_checksum_ok"`
	WriteSumOK  bool    `json:"write_checksum_ok"`
}

// HostResult is one block size of host memory to VRAM and back, in this
// process (two engines, the cuda transport).
type HostResult struct {
	Size       uint64  `json:"size"`
	Blocks     int     `json:"blocks"`
	Iterations int     `json:"iterations"`
	HtoDGBps   float64 `json:"htod_gbps"` // host region read into VRAM
	DtoHGBps   float64 `json:"dtoh_gbps"` // VRAM written into the host region
	HtoDSumOK  bool    `json:"htod_checksum_ok"`
	DtoHSumOK  bool    `json:"dtoh_checksum_ok"`
}

// StagedResult is tcp staging of the peer's cuMemAlloc memory.
type StagedResult struct {
	Size        uint64  `json:"size"`
	PeerLoc     string  `json:"peer_location"` // detected location of the peer's cuMemAlloc memory
	ReadGBps    float64 `json:"read_gbps"`
	WriteGBps   float64 `json:"write_gbps"`
	ReadSumOK   bool    `json:"read_checksum_ok"`
	WriteSumOK  bool    `json:"write_checksum_ok"`
	Transport   string  `json:"transport"`   // what served every request
	StagedFlags bool    `json:"staged_flag"` // every request carried FlagStaged
}

// RegResult is registration and location detection.
type RegResult struct {
	RawPointerLoc string `json:"raw_pointer_location"` // cuMemAlloc pointer, location ""
	AllocLoc      string `json:"alloc_location"`       // Engine.Alloc("cuda:N")
	HostLoc       string `json:"host_location"`        // mmap'd host memory, location ""
	// DeviceAsHost: a device pointer declared "cpu" is refused.
	DeviceAsHostRefused bool   `json:"device_pointer_as_cpu_refused"`
	DeviceAsHostError   string `json:"device_pointer_as_cpu_error"`
}

// TeardownResult is uninstall under load and destroy, and the baselines.
type TeardownResult struct {
	BatchesUnderLoad   int              `json:"batches_during_uninstall"`
	BatchOutcomes      map[string]int   `json:"batch_outcomes"` // status name -> count
	UninstallError     string           `json:"uninstall_error,omitempty"`
	StatsAfter         map[string]int64 `json:"cuda_stats_after_uninstall,omitempty"`
	AfterUninstall     string           `json:"request_after_uninstall"` // what served it, or its error
	AfterUninstallSum  *bool            `json:"request_after_uninstall_checksum_ok,omitempty"`
	FDsBefore          int              `json:"fds_before"`
	FDsAfter           int              `json:"fds_after"`
	FreeBefore         uint64           `json:"gpu_free_before"`
	FreeAfter          uint64           `json:"gpu_free_after"`
	FreeDelta          int64            `json:"gpu_free_delta"`
	FreeTolerance      uint64           `json:"gpu_free_tolerance"`
	AllocationsBefore  *int64           `json:"driver_allocations_before"` // fake: live allocations; real: NVML process bytes
	AllocationsAfter   *int64           `json:"driver_allocations_after"`
	AllocationsMeasure string           `json:"driver_allocations_measure"`
	FakeLeaks          string           `json:"fake_driver_leaks"`
	PeerFakeLeaks      string           `json:"peer_fake_driver_leaks"`
}

func run(rep *Report, sizes []uint64, peerOut **peerProc) int {
	d, err := cu.Default()
	if err != nil {
		rep.fail("%v", err)
		return 2
	}
	rep.Driver = d.VersionString()
	fake, _ := fakecuda.Open(d.Path())
	rep.FakeDriver = fake != nil
	if info, err := d.Device(*dev); err == nil {
		rep.Device = info.Name
		if !info.VMM || !info.PosixFD {
			rep.fail("device %d lacks VMM with POSIX fd handles", *dev)
			return 2
		}
	} else {
		rep.fail("device %d: %v", *dev, err)
		return 2
	}
	rep.Topology, _ = nvmlinfo.Topology()
	if len(rep.Topology.GPUs) == 0 {
		rep.fail("NVML topology: no GPU (%s)", rep.Topology.Reason)
	}

	// Baselines: after this process's context exists (it stays for the
	// process's life) and an engine has run once, before the peer starts.
	if _, err := d.Granularity(*dev); err != nil {
		rep.fail("%v", err)
		return 2
	}
	if warm, err := newEngine(); err == nil {
		_ = warm.Close()
	}
	td := &rep.Teardown
	td.FreeTolerance = *tol
	td.FDsBefore = countFDs()
	td.AllocationsBefore, td.AllocationsMeasure = driverAllocations(fake)
	if !*noMem {
		if td.FreeBefore, _, err = memInfo(d.Path(), *dev); err != nil {
			rep.fail("%v", err)
			return 2
		}
	}

	peer, h, err := startPeer()
	if err != nil {
		rep.fail("%v", err)
		return 2
	}
	*peerOut = peer
	defer peer.kill()

	code := exercise(rep, d, peer, h, sizes)
	if line, err := peer.ask("exit"); err != nil {
		rep.fail("peer exit: %v", err)
	} else {
		td.PeerFakeLeaks = strings.TrimSpace(strings.TrimPrefix(line, "leaks"))
		if td.PeerFakeLeaks != "" {
			rep.fail("peer: fake driver objects left: %s", td.PeerFakeLeaks)
		}
	}
	_ = peer.in.Close()
	if err := peer.cmd.Wait(); err != nil {
		rep.fail("peer: %v", err)
	}
	*peerOut = nil

	td.FDsAfter = countFDs()
	if td.FDsAfter != td.FDsBefore {
		rep.fail("file descriptors: %d before, %d after", td.FDsBefore, td.FDsAfter)
	}
	td.AllocationsAfter, _ = driverAllocations(fake)
	if td.AllocationsBefore != nil && td.AllocationsAfter != nil && *td.AllocationsAfter != *td.AllocationsBefore {
		rep.fail("driver allocations (%s): %d before, %d after", td.AllocationsMeasure, *td.AllocationsBefore, *td.AllocationsAfter)
	}
	if fake != nil {
		if td.FakeLeaks = fake.Counters().Leaks(); td.FakeLeaks != "" {
			rep.fail("fake driver objects left: %s", td.FakeLeaks)
		}
	}
	if *noMem {
		return code
	}
	// Freed device memory may take a moment to show.
	for i := 0; i < 20; i++ {
		td.FreeAfter, _, err = memInfo(d.Path(), *dev)
		if err != nil || absDelta(td.FreeAfter, td.FreeBefore) <= *tol {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	td.FreeDelta = int64(td.FreeAfter) - int64(td.FreeBefore)
	if err != nil {
		rep.fail("%v", err)
	} else if absDelta(td.FreeAfter, td.FreeBefore) > *tol {
		rep.fail("GPU free memory: %d before, %d after (delta %d, tolerance %d)", td.FreeBefore, td.FreeAfter, td.FreeDelta, *tol)
	}
	return code
}

// exercise runs every check with this process's main engine, then
// uninstalls and destroys it.
func exercise(rep *Report, d *cu.Driver, peer *peerProc, h hello, sizes []uint64) int {
	e, err := newEngine()
	if err != nil {
		rep.fail("engine: %v", err)
		return 1
	}
	closed := false
	defer func() {
		if !closed {
			_ = e.Close()
		}
	}()
	loc := "cuda:" + strconv.Itoa(*dev)
	perm := core.PermRemoteRead | core.PermRemoteWrite
	local, err := e.Alloc(*maxSize, loc, perm)
	if err != nil {
		rep.fail("alloc: %v", err)
		return 1
	}
	plain, err := e.Alloc(*maxSize, loc, perm)
	if err != nil {
		rep.fail("alloc: %v", err)
		return 1
	}
	seg, err := e.OpenSegment(h.Name)
	if err != nil {
		rep.fail("open segment: %v", err)
		return 1
	}
	if err := vramChecks(rep, d, e, seg, peer, h, local.Addr, plain.Addr, sizes); err != nil {
		rep.fail("VRAM to VRAM: %v", err)
	}
	if err := hostChecks(rep, d, e, local.Addr, sizes); err != nil {
		rep.fail("host to VRAM: %v", err)
	}
	if err := stagedCheck(rep, d, e, seg, peer, h, local.Addr); err != nil {
		rep.fail("tcp staging: %v", err)
	}
	if err := registrationCheck(rep, d, e); err != nil {
		rep.fail("registration: %v", err)
	}
	if err := teardownUnderLoad(rep, d, e, seg, peer, h, local.Addr); err != nil {
		rep.fail("uninstall under load: %v", err)
	}
	if err := e.Free(plain); err != nil {
		rep.fail("free: %v", err)
	}
	if err := e.Free(local); err != nil {
		rep.fail("free: %v", err)
	}
	closed = true
	if err := e.Close(); err != nil {
		rep.fail("engine close: %v", err)
	}
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// driverAllocations counts the driver's allocations of this process: the
// fake's live allocations and cuMemAlloc blocks, or, on a real driver,
// the bytes NVML accounts to this process on all GPUs (nil: unknown).
func driverAllocations(fake *fakecuda.Fake) (*int64, string) {
	if fake != nil {
		c := fake.Counters()
		n := c.Allocations + c.MemAllocs + c.Handles + c.Mappings + c.Reservations
		return &n, "fake driver: live allocations, handles, mappings, reservations, cuMemAlloc blocks"
	}
	n, ok := nvmlProcessMemory(os.Getpid())
	if !ok {
		return nil, "NVML per-process GPU memory: unavailable"
	}
	return &n, "NVML per-process GPU memory (bytes)"
}

func absDelta(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// hostMemory maps n bytes of anonymous host memory.
func hostMemory(n uint64) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// unmapHost unmaps what hostMemory mapped.
func unmapHost(b []byte) { _ = syscall.Munmap(b) }
