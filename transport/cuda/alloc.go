package cuda

import (
	"sync"
	"sync/atomic"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/status"
)

// driverFn loads the driver the transport, the allocator and the location
// detector use: cuda.Default in production; tests point it at a fresh fake
// per test.
var driverFn = cu.Default

// detectDrv is the driver of the last successful Install; the location
// detector is inert (host memory) until it is set.
var detectDrv atomic.Pointer[cu.Driver]

// The allocator and the detector are process-wide hooks of core. They are
// installed from init, which happens before any goroutine of the process
// can read them, so there is no data race on core.LocationDetector; the
// detector only starts asking the CUDA driver once an Install found one
// (detectDrv), so a process without a GPU keeps the default behaviour.
func init() {
	prev := core.LocationDetector
	core.LocationDetector = func(addr uint64) (core.Location, error) {
		if d := detectDrv.Load(); d != nil {
			return detect(d, addr)
		}
		if prev != nil {
			return prev(addr)
		}
		return core.CPU, nil
	}
	core.GPUCount = func() int {
		if d, err := driverFn(); err == nil {
			return d.DeviceCount()
		}
		return 0
	}
	core.RegisterAllocator("cuda", allocCUDA)
	core.DeviceStager = stager{}
}

// stager copies between host and GPU memory for the tcp transport's
// staging, with the driver of the last successful Install.
type stager struct{}

func (stager) Ready() bool { return detectDrv.Load() != nil }

func (stager) ToHost(dst []byte, src uint64) error {
	d := detectDrv.Load()
	if d == nil {
		return errNoStagingDriver
	}
	return d.CopyDtoH(dst, src)
}

func (stager) ToDevice(dst uint64, src []byte) error {
	d := detectDrv.Load()
	if d == nil {
		return errNoStagingDriver
	}
	return d.CopyHtoD(dst, src)
}

var errNoStagingDriver = status.Errorf(status.Unsupported, "cuda: no CUDA driver in this process to stage GPU memory with")

// detect asks the driver where addr lives: device memory is "cuda:N";
// host memory, pinned or not, and managed memory (which the host can
// touch) are "cpu".
func detect(d *cu.Driver, addr uint64) (core.Location, error) {
	pa, err := d.Pointer(addr)
	if err != nil {
		return core.Location{}, status.Errorf(status.CodeOf(err),
			"cannot detect where %#x lives (%v): pass the location explicitly", addr, err)
	}
	if pa.Type == cu.MemoryDevice && !pa.Managed && pa.Device >= 0 {
		return core.Location{Kind: "cuda", Device: pa.Device}, nil
	}
	return core.CPU, nil
}

// allocRec is what the allocator knows about one of its allocations: the
// mapping that holds it, and whether it can be exported as a fabric handle.
type allocRec struct {
	m      *cu.Mapping
	d      *cu.Driver
	dev    int
	fabric bool
}

// allocRecs maps *core.Allocation to *allocRec for the allocations made by
// allocCUDA that are not yet freed.
var allocRecs sync.Map

func lookupAlloc(a *core.Allocation) *allocRec {
	if a == nil {
		return nil
	}
	v, ok := allocRecs.Load(a)
	if !ok {
		return nil
	}
	return v.(*allocRec)
}

// allocCUDA is the "cuda" allocator behind Engine.Alloc(size, "cuda:N"):
// cuMemCreate with POSIX file descriptor handles (and fabric handles when
// the driver and the device support them), rounded up to the granularity,
// reserved, mapped and made accessible to the device. The free function
// undoes it in the order unmap, release handle, free reservation.
func allocCUDA(size uint64, loc core.Location) (*core.Allocation, error) {
	d, err := driverFn()
	if err != nil {
		return nil, status.Errorf(status.Unsupported, "cannot allocate %s memory: %v", loc, err)
	}
	dev := loc.Device
	if dev < 0 || dev >= d.DeviceCount() {
		return nil, status.Errorf(status.InvalidArgument,
			"cannot allocate %s memory: the CUDA driver sees %d device(s)", loc, d.DeviceCount())
	}
	info, err := d.Device(dev)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cannot allocate %s memory: %w", loc, err)
	}
	if !info.VMM || !info.PosixFD {
		return nil, status.Errorf(status.Unsupported,
			"cannot allocate %s memory: device %d (%s) lacks CUDA virtual memory management with file descriptor export, which shareable GPU allocations need",
			loc, dev, info.Name)
	}
	opts := cu.AllocOptions{HandleTypes: cu.HandleTypePosixFD, GPUDirectRDMA: info.GPUDirectRDMAWithVMM}
	fabric := d.Features().Fabric && info.Fabric
	var m *cu.Mapping
	if fabric {
		fo := opts
		fo.HandleTypes |= cu.HandleTypeFabric
		m, err = d.CreateMapping(dev, size, fo)
		if err != nil {
			// A device that can do fabric handles still needs the node to
			// be part of an NVLink fabric; without one, fall back to fds.
			fabric = false
		}
	}
	if m == nil {
		m, err = d.CreateMapping(dev, size, opts)
	}
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cannot allocate %d bytes of %s memory: %w", size, loc, err)
	}
	rec := &allocRec{m: m, d: d, dev: dev, fabric: fabric}
	var a *core.Allocation
	a = core.NewAllocation(m.Ptr(), m.Size(), loc, -1, func() error {
		allocRecs.Delete(a)
		if err := m.Release(); err != nil {
			return status.Errorf(status.Internal, "freeing %s allocation: %w", loc, err)
		}
		return nil
	})
	allocRecs.Store(a, rec)
	return a, nil
}
