package cuda

import (
	"os"
	"strconv"

	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/status"
)

// location names GPU dev as a location string.
func location(dev int) string { return Kind + ":" + strconv.Itoa(dev) }

// Kind is the location kind of GPU memory.
const Kind = "cuda"

// Memory is GPU memory on one CUDA driver. It holds no state besides the
// driver: one value may serve several engines.
type Memory struct {
	d *cu.Driver
}

// New returns GPU memory on the driver d.
func New(d *cu.Driver) *Memory { return &Memory{d: d} }

// Open returns GPU memory on the process's default driver, or the reason
// there is none (no library, no GPU, a driver too old).
func Open() (*Memory, error) {
	d, err := cu.Default()
	if err != nil {
		return nil, err
	}
	return New(d), nil
}

// Driver returns the driver the memory lives on.
func (m *Memory) Driver() *cu.Driver { return m.d }

func (m *Memory) Name() string { return Kind }

// CheckDevice checks that the driver sees GPU dev (-1: any GPU at all).
func (m *Memory) CheckDevice(dev int) error {
	n := m.d.DeviceCount()
	switch {
	case n == 0:
		return status.Errorf(status.Unsupported, "the CUDA driver sees no GPU")
	case dev >= n:
		return status.Errorf(status.InvalidArgument,
			"no such GPU: the CUDA driver sees %d GPU(s), cuda:0 to cuda:%d", n, n-1)
	}
	return nil
}

// Detect asks the driver where addr lives: device memory is GPU memory of
// its device; host memory, pinned or not, and managed memory (which the
// host can touch) are not.
func (m *Memory) Detect(addr uint64) (int, bool, error) {
	pa, err := m.d.Pointer(addr)
	if err != nil {
		return -1, false, status.Errorf(status.CodeOf(err),
			"cannot detect where %#x lives (%v): pass the location explicitly", addr, err)
	}
	if pa.Type == cu.MemoryDevice && !pa.Managed && pa.Device >= 0 {
		return pa.Device, true, nil
	}
	return -1, false, nil
}

// Verify checks a location given explicitly against the driver: GPU
// memory registered as host memory, host memory registered as GPU memory
// and GPU memory of one device registered as another's are refused.
// Managed memory, which host and devices can both touch, may be either;
// an address the driver cannot tell about is trusted.
func (m *Memory) Verify(addr, n uint64, kind string, dev int) error {
	pa, err := m.d.Pointer(addr)
	if err != nil || pa.Managed {
		return nil
	}
	isDev := pa.Type == cu.MemoryDevice
	loc := kind
	if dev >= 0 {
		loc += ":" + strconv.Itoa(dev)
	}
	switch {
	case kind == Kind && !isDev:
		return status.Errorf(status.InvalidArgument,
			"[%#x, %#x) is registered as %s but the CUDA driver says it is not GPU memory", addr, addr+n, loc)
	case kind != Kind && isDev:
		return status.Errorf(status.InvalidArgument,
			"[%#x, %#x) is registered as %s but is GPU memory of %s: give location %q or none to detect it",
			addr, addr+n, loc, location(pa.Device), location(pa.Device))
	case isDev && dev != pa.Device:
		return status.Errorf(status.InvalidArgument,
			"[%#x, %#x) is registered as %s but is GPU memory of %s", addr, addr+n, loc, location(pa.Device))
	}
	return nil
}

// Allocation is what the kind knows about one of its allocations: the
// mapping that holds it, and whether it can be exported as a fabric handle.
type Allocation struct {
	Mapping *cu.Mapping
	Device  int
	Fabric  bool
}

// Alloc is cuMemCreate with POSIX file descriptor handles (and fabric
// handles when the driver and the device support them), rounded up to the
// granularity, reserved, mapped and made accessible to device dev.
func (m *Memory) Alloc(size uint64, dev int) (*memory.Allocation, error) {
	d := m.d
	loc := location(dev)
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
	var mp *cu.Mapping
	if fabric {
		fo := opts
		fo.HandleTypes |= cu.HandleTypeFabric
		mp, err = d.CreateMapping(dev, size, fo)
		if err != nil {
			// A device that can do fabric handles still needs the node to
			// be part of an NVLink fabric; without one, fall back to fds.
			fabric = false
		}
	}
	if mp == nil {
		mp, err = d.CreateMapping(dev, size, opts)
	}
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cannot allocate %d bytes of %s memory: %w", size, loc, err)
	}
	return &memory.Allocation{
		Addr: mp.Ptr(), Size: mp.Size(), FD: -1,
		Detail: &Allocation{Mapping: mp, Device: dev, Fabric: fabric},
		Free: func() error {
			if err := mp.Release(); err != nil {
				return status.Errorf(status.Internal, "freeing %s allocation: %w", loc, err)
			}
			return nil
		},
	}, nil
}

// DMABuf exports the host pages covering [addr, addr+n) of GPU memory as a
// dmabuf (cuMemGetHandleForAddressRange wants page-aligned ranges): the
// fd, which the caller closes, and addr's offset in it.
func (m *Memory) DMABuf(addr, n uint64) (int, uint64, error) {
	if !m.d.Features().DMABuf {
		return -1, 0, status.Errorf(status.Unsupported, "the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7+)")
	}
	page := uint64(os.Getpagesize())
	base := addr &^ (page - 1)
	end := (addr + n + page - 1) &^ (page - 1)
	fd, err := m.d.DMABufFD(base, end-base)
	if err != nil {
		return -1, 0, err
	}
	return fd, addr - base, nil
}

// CopyOut copies len(dst) bytes of GPU memory at src into dst.
func (m *Memory) CopyOut(dst []byte, src uint64) error { return m.d.CopyDtoH(dst, src) }

// CopyIn copies src into GPU memory at dst.
func (m *Memory) CopyIn(dst uint64, src []byte) error { return m.d.CopyHtoD(dst, src) }
