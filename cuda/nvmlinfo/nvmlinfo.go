package nvmlinfo

import (
	"encoding/json"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	// Definitions of every NVML function go-nvml calls, so that libtent.so
	// has no undefined nvml* symbol (see its doc.go).
	"github.com/tent-dev/tent/cuda/nvmlinfo/forward"
)

// Library is the NVML library go-nvml and tent's forwarders open: found by
// the dynamic loader like any library (LD_LIBRARY_PATH, ld.so.cache).
const Library = forward.LibraryName

// Fabric states, as NVML's nvmlGpuFabricState_t.
const (
	FabricStateNotSupported = "not_supported"
	FabricStateNotStarted   = "not_started"
	FabricStateInProgress   = "in_progress"
	FabricStateCompleted    = "completed"
	FabricStateUnknown      = "unknown"
)

// Fabric is a GPU's multi-node NVLink fabric registration
// (nvmlDeviceGetGpuFabricInfo[V]).
type Fabric struct {
	// Supported: NVML answered the query for this GPU (it is attached to
	// an NVLink fabric, or could be).
	Supported bool `json:"supported"`
	// State of the registration with the fabric manager: not_supported,
	// not_started, in_progress, completed (unknown: NVML lacks the call).
	State string `json:"state"`
	// Status is the NVML result of the registration, "SUCCESS" when done.
	Status string `json:"status"`
	// ClusterUUID of the NVLink domain ("" when none); GPUs with the same
	// cluster UUID and clique id can share FABRIC handles.
	ClusterUUID string `json:"cluster_uuid"`
	CliqueID    uint32 `json:"clique_id"`
	// Usable: registration completed with success in a cluster, so CUDA
	// FABRIC handles (multi-node NVLink) can work.
	Usable bool `json:"usable"`
}

// GPU describes one GPU as NVML sees it. NVML indexes GPUs in PCI order,
// ignoring CUDA_VISIBLE_DEVICES; match them to CUDA devices by UUID.
type GPU struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pci_bus_id"`
	// PCIDeviceID is the PCI device id (high 16 bits) and vendor id (low
	// 16 bits, 0x10de), 0 when unknown.
	PCIDeviceID uint32 `json:"pci_device_id"`
	// NUMANode is the host NUMA node of the GPU, -1 when unknown.
	NUMANode    int    `json:"numa_node"`
	MemoryTotal uint64 `json:"memory_total"`
	Fabric      Fabric `json:"fabric"`
}

// TopologyInfo is the machine's GPU topology.
type TopologyInfo struct {
	// DriverVersion is the kernel driver version ("550.54.15").
	DriverVersion string `json:"driver_version"`
	// CUDADriverVersion is the CUDA version the driver supports
	// (12040 for 12.4), 0 when unknown.
	CUDADriverVersion int   `json:"cuda_driver_version"`
	GPUs              []GPU `json:"gpus"`
	// FabricCapable: there are GPUs and every one's fabric is usable.
	FabricCapable bool `json:"fabric_capable"`
	// Reason says why the topology is empty or incomplete ("" when all
	// went well): no NVML library, no driver, a failed query.
	Reason string `json:"reason"`
}

// JSON encodes t with its stable field names ("gpus": [] when none).
func (t TopologyInfo) JSON() ([]byte, error) { return json.Marshal(t) }

// MarshalJSON makes every encoding of t list "gpus" as an array.
func (t TopologyInfo) MarshalJSON() ([]byte, error) {
	type plain TopologyInfo
	if t.GPUs == nil {
		t.GPUs = []GPU{}
	}
	return json.Marshal(plain(t))
}

// Topology discovers the GPUs with go-nvml. No NVML library or no driver
// is not an error: the topology is empty and Reason says why. The error is
// reserved for misuse; today Topology always returns nil.
func Topology() (TopologyInfo, error) { return query(processLibrary{}) }

// library is the part of go-nvml's nvml.Interface Topology uses.
type library interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	ErrorString(nvml.Return) string
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// processLibrary is go-nvml's process-wide library (nvml.Init & co.),
// which counts its users and serializes its loading.
type processLibrary struct{}

func (processLibrary) Init() nvml.Return                  { return nvml.Init() }
func (processLibrary) Shutdown() nvml.Return              { return nvml.Shutdown() }
func (processLibrary) ErrorString(r nvml.Return) string   { return nvml.ErrorString(r) }
func (processLibrary) DeviceGetCount() (int, nvml.Return) { return nvml.DeviceGetCount() }
func (processLibrary) SystemGetDriverVersion() (string, nvml.Return) {
	return nvml.SystemGetDriverVersion()
}
func (processLibrary) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return nvml.SystemGetCudaDriverVersion()
}
func (processLibrary) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return nvml.DeviceGetHandleByIndex(i)
}

// query is Topology on lib: Init, the queries, Shutdown. A panic inside
// NVML or go-nvml becomes the Reason of an empty topology.
func query(lib library) (info TopologyInfo, err error) {
	defer func() {
		if p := recover(); p != nil {
			info = TopologyInfo{GPUs: []GPU{}, Reason: fmt.Sprintf("NVML failed: %v", p)}
			err = nil
		}
	}()
	info = TopologyInfo{GPUs: []GPU{}}
	switch r := lib.Init(); r {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		info.Reason = fmt.Sprintf("no NVML (%s not found): no GPU topology", Library)
		return info, nil
	case nvml.ERROR_DRIVER_NOT_LOADED:
		// go-nvml holds the library after a failed nvmlInit: Shutdown lets
		// it go where NVML accepts that (a real one answers UNINITIALIZED).
		_ = lib.Shutdown()
		info.Reason = "nvmlInit: the NVIDIA driver is not loaded: no GPU topology"
		return info, nil
	default:
		msg := lib.ErrorString(r)
		_ = lib.Shutdown()
		info.Reason = fmt.Sprintf("nvmlInit: %s: no GPU topology", msg)
		return info, nil
	}
	defer lib.Shutdown()

	if v, r := lib.SystemGetDriverVersion(); r == nvml.SUCCESS {
		info.DriverVersion = v
	}
	if v, r := lib.SystemGetCudaDriverVersion(); r == nvml.SUCCESS {
		info.CUDADriverVersion = v
	}
	n, r := lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		info.Reason = "nvmlDeviceGetCount: " + lib.ErrorString(r)
		return info, nil
	}
	if n == 0 {
		info.Reason = "NVML sees no GPU"
		return info, nil
	}
	var problems []string
	for i := 0; i < n; i++ {
		g, problem := gpu(lib, i)
		if problem != "" {
			problems = append(problems, problem)
		}
		info.GPUs = append(info.GPUs, g)
	}
	info.FabricCapable = true
	for _, g := range info.GPUs {
		info.FabricCapable = info.FabricCapable && g.Fabric.Usable
	}
	if len(problems) > 0 {
		info.Reason = fmt.Sprintf("%d problem(s): %v", len(problems), problems)
	}
	return info, nil
}

// gpu reads GPU i. Name, UUID and PCI info are expected of every NVML: the
// first of them that fails is the problem returned. Memory, NUMA node and
// fabric are optional (absent from older drivers, or not supported).
func gpu(lib library, i int) (GPU, string) {
	g := GPU{Index: i, NUMANode: -1, Fabric: Fabric{State: FabricStateUnknown}}
	dev, r := lib.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return g, fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d): %s", i, lib.ErrorString(r))
	}
	var problem string
	note := func(call string, r nvml.Return) {
		if problem == "" {
			problem = fmt.Sprintf("GPU %d: %s: %s", i, call, lib.ErrorString(r))
		}
	}
	if s, r := dev.GetName(); r == nvml.SUCCESS {
		g.Name = s
	} else {
		note("nvmlDeviceGetName", r)
	}
	if s, r := dev.GetUUID(); r == nvml.SUCCESS {
		g.UUID = s
	} else {
		note("nvmlDeviceGetUUID", r)
	}
	if p, r := dev.GetPciInfo(); r == nvml.SUCCESS {
		g.PCIBusID = cString(p.BusId[:])
		g.PCIDeviceID = p.PciDeviceId
	} else {
		note("nvmlDeviceGetPciInfo", r)
	}
	if m, r := dev.GetMemoryInfo(); r == nvml.SUCCESS {
		g.MemoryTotal = m.Total
	}
	if node, r := dev.GetNumaNodeId(); r == nvml.SUCCESS {
		g.NUMANode = node
	}
	g.Fabric = fabric(lib, dev)
	return g, problem
}

// fabric asks nvmlDeviceGetGpuFabricInfoV (R550+), else the older
// nvmlDeviceGetGpuFabricInfo.
func fabric(lib library, dev nvml.Device) Fabric {
	var (
		uuid   [16]uint8
		status uint32
		clique uint32
		state  uint8
	)
	v2, r := dev.GetGpuFabricInfoV().V2()
	if r == nvml.ERROR_FUNCTION_NOT_FOUND {
		var v1 nvml.GpuFabricInfo
		v1, r = dev.GetGpuFabricInfo()
		uuid, status, clique, state = v1.ClusterUuid, v1.Status, v1.CliqueId, v1.State
	} else {
		uuid, status, clique, state = v2.ClusterUuid, v2.Status, v2.CliqueId, v2.State
	}
	switch {
	case r == nvml.ERROR_FUNCTION_NOT_FOUND:
		return Fabric{State: FabricStateUnknown}
	case r != nvml.SUCCESS:
		return Fabric{State: FabricStateNotSupported}
	}
	out := Fabric{Supported: state != nvml.GPU_FABRIC_STATE_NOT_SUPPORTED, CliqueID: clique, State: stateName(state)}
	if nvml.Return(status) == nvml.SUCCESS {
		out.Status = "SUCCESS"
	} else {
		out.Status = lib.ErrorString(nvml.Return(status))
	}
	if uuid != ([16]uint8{}) {
		out.ClusterUUID = fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:16])
	}
	out.Usable = state == nvml.GPU_FABRIC_STATE_COMPLETED && nvml.Return(status) == nvml.SUCCESS && out.ClusterUUID != ""
	return out
}

func stateName(s uint8) string {
	switch s {
	case nvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return FabricStateNotSupported
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		return FabricStateNotStarted
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return FabricStateInProgress
	case nvml.GPU_FABRIC_STATE_COMPLETED:
		return FabricStateCompleted
	}
	return FabricStateUnknown
}

// cString is the NUL-terminated string at the start of b (go-nvml's
// fixed-size char arrays).
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
