package cuda

/*
#include "tent_cuda.h"
*/
import "C"

import (
	"fmt"
	"strings"
)

// DeviceAttribute is a CUdevice_attribute value.
type DeviceAttribute int32

// The device attributes tent reads (values from cuda.h).
const (
	AttrMultiprocessorCount     DeviceAttribute = 16
	AttrPCIBusID                DeviceAttribute = 33
	AttrPCIDeviceID             DeviceAttribute = 34
	AttrUnifiedAddressing       DeviceAttribute = 41
	AttrPCIDomainID             DeviceAttribute = 50
	AttrComputeCapabilityMajor  DeviceAttribute = 75
	AttrComputeCapabilityMinor  DeviceAttribute = 76
	AttrVirtualMemoryManagement DeviceAttribute = 102
	AttrHandleTypePosixFD       DeviceAttribute = 103
	AttrGPUDirectRDMAWithVMM    DeviceAttribute = 110
	AttrGPUDirectRDMA           DeviceAttribute = 116
	AttrDMABuf                  DeviceAttribute = 124
	AttrHandleTypeFabric        DeviceAttribute = 128
	AttrNUMAID                  DeviceAttribute = 131
	AttrHostNUMAID              DeviceAttribute = 134
)

// Attribute is cuDeviceGetAttribute. Old drivers answer
// CUDA_ERROR_INVALID_VALUE for attributes newer than themselves.
func (d *Driver) Attribute(dev int, attr DeviceAttribute) (int, error) {
	if err := d.checkDevice(dev); err != nil {
		return 0, err
	}
	var v C.int
	if r := C.tent_cu_device_attr(d.api, d.devs[dev], C.int(attr), &v); r != 0 {
		return 0, d.fail(r, "cuDeviceGetAttribute(%d, device %d)", int(attr), dev)
	}
	return int(v), nil
}

// attrOr is Attribute with def for an attribute the driver does not know.
func (d *Driver) attrOr(dev int, attr DeviceAttribute, def int) int {
	v, err := d.Attribute(dev, attr)
	if err != nil {
		return def
	}
	return v
}

// DeviceInfo describes one device as the CUDA driver sees it.
type DeviceInfo struct {
	Ordinal int    `json:"ordinal"`
	Name    string `json:"name"`
	// UUID in nvidia-smi's form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
	// empty when the driver lacks cuDeviceGetUuid.
	UUID string `json:"uuid"`
	// PCIBusID as cuDeviceGetPCIBusId gives it ("0000:3b:00.0"); compare
	// with NormalizePCIBusID.
	PCIBusID    string `json:"pci_bus_id"`
	TotalMemory uint64 `json:"total_memory"`
	CCMajor     int    `json:"cc_major"`
	CCMinor     int    `json:"cc_minor"`
	// UnifiedAddressing: the device shares one address space with the host.
	UnifiedAddressing bool `json:"unified_addressing"`
	// VMM: cuMemCreate/cuMemMap work on this device.
	VMM bool `json:"vmm"`
	// PosixFD: VMM allocations can be exported as file descriptors.
	PosixFD bool `json:"posix_fd"`
	// Fabric: VMM allocations can be exported as fabric handles (the
	// node still has to be in an NVLink fabric: see nvmlinfo).
	Fabric               bool `json:"fabric"`
	GPUDirectRDMA        bool `json:"gpudirect_rdma"`
	GPUDirectRDMAWithVMM bool `json:"gpudirect_rdma_with_vmm"`
	DMABuf               bool `json:"dmabuf"`
	// HostNUMANode is the host NUMA node closest to the device, -1 when
	// unknown.
	HostNUMANode int `json:"host_numa_node"`
}

// Device describes device dev. Attributes the driver does not know read as
// false (or -1 for HostNUMANode).
func (d *Driver) Device(dev int) (DeviceInfo, error) {
	if err := d.checkDevice(dev); err != nil {
		return DeviceInfo{}, err
	}
	cd := d.devs[dev]
	info := DeviceInfo{Ordinal: dev, HostNUMANode: -1}
	var buf [256]C.char
	if r := C.tent_cu_device_name(d.api, cd, &buf[0], C.int(len(buf))); r != 0 {
		return DeviceInfo{}, d.fail(r, "cuDeviceGetName(%d)", dev)
	}
	info.Name = C.GoString(&buf[0])
	if r := C.tent_cu_device_pci(d.api, cd, &buf[0], C.int(len(buf))); r == 0 {
		info.PCIBusID = C.GoString(&buf[0])
	} else {
		dom := d.attrOr(dev, AttrPCIDomainID, 0)
		bus := d.attrOr(dev, AttrPCIBusID, 0)
		slot := d.attrOr(dev, AttrPCIDeviceID, 0)
		info.PCIBusID = fmt.Sprintf("%04x:%02x:%02x.0", dom, bus, slot)
	}
	var uuid [16]C.uchar
	if r := C.tent_cu_device_uuid(d.api, cd, &uuid[0]); r == 0 {
		var b [16]byte
		for i := range uuid {
			b[i] = byte(uuid[i])
		}
		info.UUID = FormatUUID(b)
	}
	var mem C.ulonglong
	if r := C.tent_cu_device_total_mem(d.api, cd, &mem); r == 0 {
		info.TotalMemory = uint64(mem)
	}
	info.CCMajor = d.attrOr(dev, AttrComputeCapabilityMajor, 0)
	info.CCMinor = d.attrOr(dev, AttrComputeCapabilityMinor, 0)
	info.UnifiedAddressing = d.attrOr(dev, AttrUnifiedAddressing, 0) != 0
	info.VMM = d.features.VMM && d.attrOr(dev, AttrVirtualMemoryManagement, 0) != 0
	info.PosixFD = info.VMM && d.attrOr(dev, AttrHandleTypePosixFD, 0) != 0
	info.Fabric = info.VMM && d.features.Fabric && d.attrOr(dev, AttrHandleTypeFabric, 0) != 0
	info.GPUDirectRDMA = d.attrOr(dev, AttrGPUDirectRDMA, 0) != 0
	info.GPUDirectRDMAWithVMM = info.VMM && d.attrOr(dev, AttrGPUDirectRDMAWithVMM, 0) != 0
	info.DMABuf = d.attrOr(dev, AttrDMABuf, 0) != 0
	info.HostNUMANode = d.attrOr(dev, AttrHostNUMAID, -1)
	return info, nil
}

// FormatUUID writes a 16-byte device UUID the way nvidia-smi and NVML do:
// "GPU-" and 8-4-4-4-12 lower-case hex digits.
func FormatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// NormalizePCIBusID makes bus ids from CUDA ("0000:3b:00.0") and NVML
// ("00000000:3B:00.0") comparable: lower case, 4-digit domain.
func NormalizePCIBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return id
	}
	dom = strings.TrimLeft(dom, "0")
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}
