package cuda

/*
#include "tent_cuda.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/tent-dev/tent/status"
)

// Mapping is device memory made usable at an address of this process by a
// sequence of VMM steps (import or create, reserve, map, set access), with
// a record of exactly what it holds, so that Release undoes exactly those
// steps, and a failure half way undoes the steps already done.
//
// The exported fields are that record; they change only in Release and
// CloseFD. Read them while no Release is running.
type Mapping struct {
	// Device is the device whose context the steps ran in, and the one
	// given read-write access.
	Device int
	// Handle is the allocation handle; HasHandle tells whether the
	// Mapping still holds it (Release gives it back with cuMemRelease).
	Handle    AllocHandle
	HasHandle bool
	// FD is a file descriptor the Mapping owns and closes, -1 for none.
	FD int
	// Addr and Reserved are the address reservation held; Reserved is 0
	// when none is held.
	Addr     uint64
	Reserved uint64
	// Mapped is the number of bytes mapped at Addr, 0 when not mapped.
	Mapped uint64
	// Access tells whether cuMemSetAccess was done (nothing to undo).
	Access bool

	d   *Driver
	ctx C.CUcontext
	mu  sync.Mutex
}

// Ptr is the device address of the mapping, 0 once released.
func (m *Mapping) Ptr() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Mapped == 0 {
		return 0
	}
	return m.Addr
}

// Size is the number of bytes mapped, 0 once released.
func (m *Mapping) Size() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.Mapped
}

func (m *Mapping) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("cuda.Mapping{device %d, handle %#x (held %v), fd %d, reserved %#x+%d, mapped %d, access %v}",
		m.Device, uint64(m.Handle), m.HasHandle, m.FD, m.Addr, m.Reserved, m.Mapped, m.Access)
}

// ImportMapping imports the allocation exported as fd (of exactly size
// bytes, a multiple of dev's granularity) and maps it read-write for dev:
// cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
// cuMemSetAccess, all in dev's primary context.
//
// ImportMapping takes ownership of fd: the Mapping closes it in Release (or
// earlier, with CloseFD), and a failed ImportMapping has closed it already,
// after undoing every step it had done.
func (d *Driver) ImportMapping(fd int, size uint64, dev int) (*Mapping, error) {
	m := &Mapping{Device: dev, FD: fd, d: d}
	if fd < 0 {
		m.FD = -1
		return nil, status.Errorf(status.InvalidArgument, "cuda: ImportMapping: invalid file descriptor %d", fd)
	}
	err := m.build(size, HandleTypePosixFD, "ImportMapping", func() (AllocHandle, error) { return d.importFD(m.ctx, fd) })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// ImportFabricMapping is ImportMapping for a fabric handle: it holds no
// file descriptor (FD is -1).
func (d *Driver) ImportFabricMapping(fh FabricHandle, size uint64, dev int) (*Mapping, error) {
	if err := d.needFabric("ImportFabricMapping"); err != nil {
		return nil, err
	}
	m := &Mapping{Device: dev, FD: -1, d: d}
	err := m.build(size, HandleTypeFabric, "ImportFabricMapping", func() (AllocHandle, error) { return d.importFabric(m.ctx, fh) })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// CreateMapping allocates size bytes on dev (rounded up to the
// granularity) and maps them read-write for dev: cuMemCreate,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess. Export it with
// Mapping.ExportFD or ExportFabric.
func (d *Driver) CreateMapping(dev int, size uint64, opts AllocOptions) (*Mapping, error) {
	m := &Mapping{Device: dev, FD: -1, d: d}
	if err := d.needVMM("CreateMapping"); err != nil {
		return nil, err
	}
	ctx, err := d.ctx(dev)
	if err != nil {
		return nil, err
	}
	g, err := d.granularity(ctx, dev, opts.types(), false)
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, status.Errorf(status.InvalidArgument, "cuda: CreateMapping: size 0")
	}
	size = (size + g - 1) / g * g
	err = m.build(size, opts.types(), "CreateMapping", func() (AllocHandle, error) { return d.create(m.ctx, dev, size, opts) })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// build runs the steps after the handle is obtained by get; on failure it
// undoes what was done and returns the step's error.
func (m *Mapping) build(size uint64, types HandleType, what string, get func() (AllocHandle, error)) error {
	d := m.d
	fail := func(err error) error {
		if rerr := m.Release(); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	if err := d.needVMM(what); err != nil {
		return fail(err)
	}
	ctx, err := d.ctx(m.Device)
	if err != nil {
		return fail(err)
	}
	m.ctx = ctx
	g, err := d.granularity(ctx, m.Device, types, false)
	if err != nil {
		return fail(err)
	}
	if size == 0 || size%g != 0 {
		return fail(status.Errorf(status.InvalidArgument,
			"cuda: %s: size %d is not a positive multiple of the granularity %d of device %d", what, size, g, m.Device))
	}
	h, err := get()
	if err != nil {
		return fail(err)
	}
	m.Handle, m.HasHandle = h, true
	addr, err := d.reserve(ctx, size, g)
	if err != nil {
		return fail(err)
	}
	m.Addr, m.Reserved = addr, size
	if err := d.mapAt(ctx, addr, size, 0, h); err != nil {
		return fail(err)
	}
	m.Mapped = size
	if err := d.setAccess(ctx, addr, size, AccessReadWrite, m.Device); err != nil {
		return fail(err)
	}
	m.Access = true
	return nil
}

// ExportFD exports the mapping's allocation as a new file descriptor owned
// by the caller.
func (m *Mapping) ExportFD() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.HasHandle {
		return -1, status.Errorf(status.Closed, "cuda: mapping holds no allocation handle")
	}
	return m.d.exportFD(m.ctx, m.Handle)
}

// ExportFabric exports the mapping's allocation as a fabric handle (it must
// have been created with HandleTypeFabric).
func (m *Mapping) ExportFabric() (FabricHandle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.HasHandle {
		return FabricHandle{}, status.Errorf(status.Closed, "cuda: mapping holds no allocation handle")
	}
	return m.d.ExportFabric(m.Handle)
}

// CloseFD closes the file descriptor the Mapping holds, if any, before
// Release (the allocation handle keeps the memory alive), so that long-lived
// mappings do not use up file descriptors.
func (m *Mapping) CloseFD() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closeFD()
}

func (m *Mapping) closeFD() error {
	if m.FD < 0 {
		return nil
	}
	fd := m.FD
	m.FD = -1
	if err := syscall.Close(fd); err != nil {
		return status.Errorf(status.Internal, "cuda: close(%d): %v", fd, err)
	}
	return nil
}

// Release undoes exactly the steps the Mapping records, in the order
// cuMemUnmap, cuMemRelease, cuMemAddressFree, close(fd). A step that fails
// stays recorded (a later Release tries it again) and the reservation is
// not freed while its mapping could not be unmapped; the other steps still
// run. Release is idempotent: a second call does nothing.
func (m *Mapping) Release() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	if m.Mapped != 0 {
		if err := m.d.unmap(m.ctx, m.Addr, m.Mapped); err != nil {
			errs = append(errs, err)
		} else {
			m.Mapped = 0
			m.Access = false
		}
	}
	if m.HasHandle {
		if err := m.d.release(m.ctx, m.Handle); err != nil {
			errs = append(errs, err)
		} else {
			m.HasHandle = false
		}
	}
	if m.Reserved != 0 && m.Mapped == 0 {
		if err := m.d.addressFree(m.ctx, m.Addr, m.Reserved); err != nil {
			errs = append(errs, err)
		} else {
			m.Reserved = 0
		}
	}
	if err := m.closeFD(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
