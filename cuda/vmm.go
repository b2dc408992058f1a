package cuda

/*
#include "tent_cuda.h"
*/
import "C"

import (
	"fmt"
	"syscall"

	"github.com/tent-dev/tent/status"
)

// AllocHandle is a CUmemGenericAllocationHandle: one physical allocation
// made by Create, ImportFD, ImportFabric or RetainAllocationHandle. Each
// must be given back with Release exactly once.
type AllocHandle uint64

// HandleType is a CUmemAllocationHandleType bit mask.
type HandleType int32

// Handle types (values from cuda.h).
const (
	HandleTypeNone    HandleType = 0x0
	HandleTypePosixFD HandleType = 0x1
	HandleTypeFabric  HandleType = 0x8
)

// FabricHandleSize is the size of a CUmemFabricHandle.
const FabricHandleSize = 64

// FabricHandle is an exported CUmemFabricHandle: 64 opaque bytes that a
// process on any node of the same NVLink fabric can import.
type FabricHandle [FabricHandleSize]byte

// AccessFlags is a CUmemAccess_flags value.
type AccessFlags int32

// Access flags (values from cuda.h).
const (
	AccessNone      AccessFlags = 0x0
	AccessRead      AccessFlags = 0x1
	AccessReadWrite AccessFlags = 0x3
)

// AllocOptions are the properties of an allocation made by Create.
type AllocOptions struct {
	// HandleTypes the allocation may be exported as; zero means
	// HandleTypePosixFD.
	HandleTypes HandleType
	// GPUDirectRDMA sets allocFlags.gpuDirectRDMACapable, needed for NIC
	// access to the memory (see DeviceInfo.GPUDirectRDMAWithVMM).
	GPUDirectRDMA bool
}

func (o AllocOptions) types() HandleType {
	if o.HandleTypes == HandleTypeNone {
		return HandleTypePosixFD
	}
	return o.HandleTypes
}

// Granularity is the minimum allocation granularity of dev for allocations
// exportable as file descriptors: sizes and addresses given to Create,
// Reserve and Map must be multiples of it.
func (d *Driver) Granularity(dev int) (uint64, error) {
	return d.GranularityFor(dev, HandleTypePosixFD, false)
}

// GranularityFor is cuMemGetAllocationGranularity for allocations of the
// given handle types on dev; recommended asks for the recommended rather
// than the minimum granularity.
func (d *Driver) GranularityFor(dev int, types HandleType, recommended bool) (uint64, error) {
	ctx, err := d.vmmCtx("cuMemGetAllocationGranularity", dev)
	if err != nil {
		return 0, err
	}
	return d.granularity(ctx, dev, types, recommended)
}

func (d *Driver) granularity(ctx C.CUcontext, dev int, types HandleType, recommended bool) (uint64, error) {
	opt := C.int(C.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
	if recommended {
		opt = C.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	}
	var g C.ulonglong
	if r := C.tent_cu_granularity(d.api, ctx, C.int(dev), C.int(types), opt, &g); r != 0 {
		return 0, d.fail(r, "cuMemGetAllocationGranularity(device %d)", dev)
	}
	if g == 0 {
		return 0, status.Errorf(status.Internal, "cuda: cuMemGetAllocationGranularity(device %d) answered 0", dev)
	}
	return uint64(g), nil
}

// vmmCtx checks that VMM is available and returns dev's context.
func (d *Driver) vmmCtx(what string, dev int) (C.CUcontext, error) {
	if err := d.needVMM(what); err != nil {
		return nil, err
	}
	return d.ctx(dev)
}

// vmmAnyCtx checks that VMM is available and returns a context for a call
// that names no device.
func (d *Driver) vmmAnyCtx(what string) (C.CUcontext, error) {
	if err := d.needVMM(what); err != nil {
		return nil, err
	}
	return d.anyCtx()
}

// Create is cuMemCreate: size bytes of device memory on dev (size must be a
// multiple of the granularity). Release the handle with Release.
func (d *Driver) Create(dev int, size uint64, opts AllocOptions) (AllocHandle, error) {
	ctx, err := d.vmmCtx("cuMemCreate", dev)
	if err != nil {
		return 0, err
	}
	return d.create(ctx, dev, size, opts)
}

func (d *Driver) create(ctx C.CUcontext, dev int, size uint64, opts AllocOptions) (AllocHandle, error) {
	gdr := C.int(0)
	if opts.GPUDirectRDMA {
		gdr = 1
	}
	var h C.CUmemGenericAllocationHandle
	if r := C.tent_cu_mem_create(d.api, ctx, C.int(dev), C.ulonglong(size), C.int(opts.types()), gdr, &h); r != 0 {
		return 0, d.fail(r, "cuMemCreate(device %d, %d, types %#x)", dev, size, int(opts.types()))
	}
	return AllocHandle(h), nil
}

// Release is cuMemRelease. The memory itself lives on until its last
// mapping is unmapped.
func (d *Driver) Release(h AllocHandle) error {
	ctx, err := d.vmmAnyCtx("cuMemRelease")
	if err != nil {
		return err
	}
	return d.release(ctx, h)
}

func (d *Driver) release(ctx C.CUcontext, h AllocHandle) error {
	if r := C.tent_cu_mem_release(d.api, ctx, C.CUmemGenericAllocationHandle(h)); r != 0 {
		return d.fail(r, "cuMemRelease(%#x)", uint64(h))
	}
	return nil
}

// ExportFD is cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR). The
// caller owns the returned file descriptor (close-on-exec is set) and must
// close it; the allocation needs HandleTypePosixFD.
func (d *Driver) ExportFD(h AllocHandle) (int, error) {
	ctx, err := d.vmmAnyCtx("cuMemExportToShareableHandle")
	if err != nil {
		return -1, err
	}
	return d.exportFD(ctx, h)
}

func (d *Driver) exportFD(ctx C.CUcontext, h AllocHandle) (int, error) {
	var fd C.int
	if r := C.tent_cu_export_fd(d.api, ctx, C.CUmemGenericAllocationHandle(h), &fd); r != 0 {
		return -1, d.fail(r, "cuMemExportToShareableHandle(%#x, POSIX_FILE_DESCRIPTOR)", uint64(h))
	}
	if fd < 0 {
		return -1, status.Errorf(status.Internal, "cuda: cuMemExportToShareableHandle(%#x) returned fd %d", uint64(h), int(fd))
	}
	syscall.CloseOnExec(int(fd))
	return int(fd), nil
}

// ImportFD is cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR). It
// does not take ownership of fd: the caller still closes it (it may do so
// at once; the returned handle keeps the allocation alive).
func (d *Driver) ImportFD(fd int) (AllocHandle, error) {
	ctx, err := d.vmmAnyCtx("cuMemImportFromShareableHandle")
	if err != nil {
		return 0, err
	}
	return d.importFD(ctx, fd)
}

func (d *Driver) importFD(ctx C.CUcontext, fd int) (AllocHandle, error) {
	if fd < 0 {
		return 0, status.Errorf(status.InvalidArgument, "cuda: ImportFD(%d): invalid file descriptor", fd)
	}
	var h C.CUmemGenericAllocationHandle
	if r := C.tent_cu_import_fd(d.api, ctx, C.int(fd), &h); r != 0 {
		return 0, d.fail(r, "cuMemImportFromShareableHandle(fd %d, POSIX_FILE_DESCRIPTOR)", fd)
	}
	return AllocHandle(h), nil
}

func (d *Driver) needFabric(what string) error {
	if err := d.needVMM(what); err != nil {
		return err
	}
	if !d.features.Fabric {
		return status.Errorf(status.Unsupported,
			"cuda: %s: fabric handles need a CUDA 12.3 or later driver (have %s)", what, d.VersionString())
	}
	return nil
}

// ExportFabric is cuMemExportToShareableHandle(FABRIC); the allocation
// needs HandleTypeFabric.
func (d *Driver) ExportFabric(h AllocHandle) (FabricHandle, error) {
	if err := d.needFabric("ExportFabric"); err != nil {
		return FabricHandle{}, err
	}
	ctx, err := d.anyCtx()
	if err != nil {
		return FabricHandle{}, err
	}
	var out [FabricHandleSize]C.uchar
	if r := C.tent_cu_export_fabric(d.api, ctx, C.CUmemGenericAllocationHandle(h), &out[0]); r != 0 {
		return FabricHandle{}, d.fail(r, "cuMemExportToShareableHandle(%#x, FABRIC)", uint64(h))
	}
	var fh FabricHandle
	for i := range out {
		fh[i] = byte(out[i])
	}
	return fh, nil
}

// ImportFabric is cuMemImportFromShareableHandle(FABRIC).
func (d *Driver) ImportFabric(fh FabricHandle) (AllocHandle, error) {
	if err := d.needFabric("ImportFabric"); err != nil {
		return 0, err
	}
	ctx, err := d.anyCtx()
	if err != nil {
		return 0, err
	}
	return d.importFabric(ctx, fh)
}

func (d *Driver) importFabric(ctx C.CUcontext, fh FabricHandle) (AllocHandle, error) {
	var in [FabricHandleSize]C.uchar
	for i := range fh {
		in[i] = C.uchar(fh[i])
	}
	var h C.CUmemGenericAllocationHandle
	if r := C.tent_cu_import_fabric(d.api, ctx, &in[0], &h); r != 0 {
		return 0, d.fail(r, "cuMemImportFromShareableHandle(FABRIC)")
	}
	return AllocHandle(h), nil
}

// RetainAllocationHandle is cuMemRetainAllocationHandle: the handle of the
// VMM allocation mapped at addr (any address inside the mapping). It fails
// for memory that is not a VMM mapping. Release the handle with Release.
func (d *Driver) RetainAllocationHandle(addr uint64) (AllocHandle, error) {
	if err := d.needVMM("cuMemRetainAllocationHandle"); err != nil {
		return 0, err
	}
	if !d.features.RetainAllocationHandle {
		return 0, status.Errorf(status.Unsupported, "cuda: the driver %s lacks cuMemRetainAllocationHandle", d.path)
	}
	var h C.CUmemGenericAllocationHandle
	if r := C.tent_cu_retain_handle(d.api, nil, C.CUdeviceptr(addr), &h); r != 0 {
		return 0, d.fail(r, "cuMemRetainAllocationHandle(%#x)", addr)
	}
	return AllocHandle(h), nil
}

// Reserve is cuMemAddressReserve: size bytes of virtual address space,
// aligned to align (0: the granularity). Free it with AddressFree.
func (d *Driver) Reserve(size, align uint64) (uint64, error) {
	ctx, err := d.vmmAnyCtx("cuMemAddressReserve")
	if err != nil {
		return 0, err
	}
	return d.reserve(ctx, size, align)
}

func (d *Driver) reserve(ctx C.CUcontext, size, align uint64) (uint64, error) {
	var p C.CUdeviceptr
	if r := C.tent_cu_reserve(d.api, ctx, C.ulonglong(size), C.ulonglong(align), &p); r != 0 {
		return 0, d.fail(r, "cuMemAddressReserve(%d, align %d)", size, align)
	}
	return uint64(p), nil
}

// AddressFree is cuMemAddressFree of a whole reservation; unmap first.
func (d *Driver) AddressFree(addr, size uint64) error {
	ctx, err := d.vmmAnyCtx("cuMemAddressFree")
	if err != nil {
		return err
	}
	return d.addressFree(ctx, addr, size)
}

func (d *Driver) addressFree(ctx C.CUcontext, addr, size uint64) error {
	if r := C.tent_cu_address_free(d.api, ctx, C.CUdeviceptr(addr), C.ulonglong(size)); r != 0 {
		return d.fail(r, "cuMemAddressFree(%#x, %d)", addr, size)
	}
	return nil
}

// Map is cuMemMap: maps size bytes of h, from offset, at addr (inside a
// reservation). The mapping is inaccessible until SetAccess.
func (d *Driver) Map(addr, size, offset uint64, h AllocHandle) error {
	ctx, err := d.vmmAnyCtx("cuMemMap")
	if err != nil {
		return err
	}
	return d.mapAt(ctx, addr, size, offset, h)
}

func (d *Driver) mapAt(ctx C.CUcontext, addr, size, offset uint64, h AllocHandle) error {
	if r := C.tent_cu_map(d.api, ctx, C.CUdeviceptr(addr), C.ulonglong(size), C.ulonglong(offset),
		C.CUmemGenericAllocationHandle(h)); r != 0 {
		return d.fail(r, "cuMemMap(%#x, %d, offset %d, %#x)", addr, size, offset, uint64(h))
	}
	return nil
}

// Unmap is cuMemUnmap of whole mappings.
func (d *Driver) Unmap(addr, size uint64) error {
	ctx, err := d.vmmAnyCtx("cuMemUnmap")
	if err != nil {
		return err
	}
	return d.unmap(ctx, addr, size)
}

func (d *Driver) unmap(ctx C.CUcontext, addr, size uint64) error {
	if r := C.tent_cu_unmap(d.api, ctx, C.CUdeviceptr(addr), C.ulonglong(size)); r != 0 {
		return d.fail(r, "cuMemUnmap(%#x, %d)", addr, size)
	}
	return nil
}

// SetAccess is cuMemSetAccess: gives each of devs the access flags to the
// mapped range [addr, addr+size).
func (d *Driver) SetAccess(addr, size uint64, flags AccessFlags, devs ...int) error {
	if len(devs) == 0 {
		return status.Errorf(status.InvalidArgument, "cuda: SetAccess(%#x, %d): no device", addr, size)
	}
	ctx, err := d.vmmCtx("cuMemSetAccess", devs[0])
	if err != nil {
		return err
	}
	return d.setAccess(ctx, addr, size, flags, devs...)
}

func (d *Driver) setAccess(ctx C.CUcontext, addr, size uint64, flags AccessFlags, devs ...int) error {
	if len(devs) == 0 || len(devs) > 16 {
		return status.Errorf(status.InvalidArgument, "cuda: SetAccess(%#x, %d): %d devices (1 to 16)", addr, size, len(devs))
	}
	cdevs := make([]C.int, len(devs))
	for i, dev := range devs {
		if err := d.checkDevice(dev); err != nil {
			return err
		}
		cdevs[i] = C.int(dev)
	}
	if r := C.tent_cu_set_access(d.api, ctx, C.CUdeviceptr(addr), C.ulonglong(size), &cdevs[0], C.int(len(cdevs)), C.int(flags)); r != 0 {
		return d.fail(r, "cuMemSetAccess(%#x, %d, devices %v, flags %#x)", addr, size, devs, int(flags))
	}
	return nil
}

// MemoryType is a CUmemorytype value; 0 means memory CUDA does not know
// (ordinary pageable host memory).
type MemoryType int32

// Memory types (values from cuda.h).
const (
	MemoryUnknown MemoryType = 0
	MemoryHost    MemoryType = 1
	MemoryDevice  MemoryType = 2
	MemoryArray   MemoryType = 3
	MemoryUnified MemoryType = 4
)

func (t MemoryType) String() string {
	switch t {
	case MemoryUnknown:
		return "unknown"
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryArray:
		return "array"
	case MemoryUnified:
		return "unified"
	}
	return fmt.Sprintf("MemoryType(%d)", int32(t))
}

// PointerAttributes is what the driver knows about an address.
type PointerAttributes struct {
	Type MemoryType
	// Device is the ordinal of the device the memory belongs to, -1 for
	// memory CUDA does not know.
	Device int
	// Base and Size are the allocation (RANGE_START_ADDR, RANGE_SIZE) the
	// address lies in; zero for memory CUDA does not know.
	Base, Size uint64
	// Managed: cuMemAllocManaged memory.
	Managed bool
	// VMM: the address lies in a cuMemCreate/cuMemMap mapping (found with
	// cuMemRetainAllocationHandle; without it, inferred from the legacy-IPC
	// attribute).
	VMM bool
	// AllowedHandleTypes the allocation can be exported as (VMM memory).
	AllowedHandleTypes HandleType
	// LegacyIPC: usable with cuIpcGetMemHandle (cuMemAlloc memory).
	LegacyIPC bool
	// GPUDirectRDMA: usable with GPUDirect RDMA.
	GPUDirectRDMA bool
	// MappingBase and MappingSize: the cuMemMap mapping the address lies
	// in, when the driver reports it (CUDA 12+), else zero.
	MappingBase, MappingSize uint64
}

// Pointer returns the driver's attributes of addr. An address CUDA does not
// know is not an error: its Type is MemoryUnknown.
func (d *Driver) Pointer(addr uint64) (PointerAttributes, error) {
	var o C.tent_cu_ptr_info
	if r := C.tent_cu_pointer_info(d.api, nil, C.CUdeviceptr(addr), &o); r != 0 {
		return PointerAttributes{Device: -1}, d.fail(r, "cuPointerGetAttributes(%#x)", addr)
	}
	pa := PointerAttributes{Type: MemoryType(o.memory_type), Device: -1}
	if pa.Type == MemoryUnknown {
		return pa, nil
	}
	pa.Device = int(o.device_ordinal)
	pa.Base, pa.Size = uint64(o.range_start), uint64(o.range_size)
	pa.Managed = o.have_managed != 0 && o.managed != 0
	pa.LegacyIPC = o.have_legacy_ipc != 0 && o.legacy_ipc != 0
	pa.GPUDirectRDMA = o.have_gdr_capable != 0 && o.gdr_capable != 0
	if o.have_allowed_handle_types != 0 {
		pa.AllowedHandleTypes = HandleType(o.allowed_handle_types)
	}
	if o.have_mapping != 0 {
		pa.MappingBase, pa.MappingSize = uint64(o.mapping_base), uint64(o.mapping_size)
	}
	if pa.Type == MemoryDevice && !pa.Managed {
		if d.features.RetainAllocationHandle {
			var h C.CUmemGenericAllocationHandle
			if C.tent_cu_retain_handle(d.api, nil, C.CUdeviceptr(addr), &h) == 0 {
				pa.VMM = true
				if r := C.tent_cu_mem_release(d.api, nil, h); r != 0 {
					return pa, d.fail(r, "cuMemRelease(%#x) of a handle retained for %#x", uint64(h), addr)
				}
			}
		} else {
			pa.VMM = o.have_legacy_ipc != 0 && o.legacy_ipc == 0
		}
	}
	return pa, nil
}

// PointerInfo is the short form of Pointer: whether addr is device memory,
// which device, and the allocation it lies in.
func (d *Driver) PointerInfo(addr uint64) (isDevice bool, device int, base, size uint64, err error) {
	pa, err := d.Pointer(addr)
	if err != nil {
		return false, -1, 0, 0, err
	}
	return pa.Type == MemoryDevice, pa.Device, pa.Base, pa.Size, nil
}

// AddressRange is cuMemGetAddressRange: the allocation addr lies in. It
// runs in the context of the device owning addr.
func (d *Driver) AddressRange(addr uint64) (base, size uint64, err error) {
	ctx, err := d.ctxFor(addr)
	if err != nil {
		return 0, 0, err
	}
	var b C.CUdeviceptr
	var s C.ulonglong
	if r := C.tent_cu_address_range(d.api, ctx, C.CUdeviceptr(addr), &b, &s); r != 0 {
		return 0, 0, d.fail(r, "cuMemGetAddressRange(%#x)", addr)
	}
	return uint64(b), uint64(s), nil
}

// DMABufFD is cuMemGetHandleForAddressRange with a dmabuf fd handle: a
// file descriptor for [addr, addr+size) of device memory, which the caller
// closes. addr and size must be multiples of the host page size. A driver
// without the call (before CUDA 11.7) answers UNSUPPORTED.
func (d *Driver) DMABufFD(addr, size uint64) (int, error) {
	ctx, err := d.ctxFor(addr)
	if err != nil {
		return -1, err
	}
	var fd C.int
	if r := C.tent_cu_dmabuf_fd(d.api, ctx, C.CUdeviceptr(addr), C.ulonglong(size), &fd); r != 0 {
		return -1, d.fail(r, "cuMemGetHandleForAddressRange(%#x, %d, DMA_BUF_FD)", addr, size)
	}
	return int(fd), nil
}

// ctxFor is the context of the device owning addr, else anyCtx.
func (d *Driver) ctxFor(addr uint64) (C.CUcontext, error) {
	var o C.tent_cu_ptr_info
	if C.tent_cu_pointer_info(d.api, nil, C.CUdeviceptr(addr), &o) == 0 && o.memory_type != 0 {
		if dev := int(o.device_ordinal); dev >= 0 && dev < len(d.devs) {
			return d.ctx(dev)
		}
	}
	return d.anyCtx()
}
