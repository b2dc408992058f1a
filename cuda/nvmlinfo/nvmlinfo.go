package nvmlinfo

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DefaultLibrary is the NVML library Topology loads unless EnvLibrary names
// another one.
const DefaultLibrary = "libnvidia-ml.so.1"

// EnvLibrary overrides the NVML library path (tests point it at a fake).
const EnvLibrary = "TENT_NVML_LIBRARY"

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
func (t TopologyInfo) JSON() ([]byte, error) {
	if t.GPUs == nil {
		t.GPUs = []GPU{}
	}
	return json.Marshal(t)
}

// MarshalJSON makes every encoding of t list "gpus" as an array.
func (t TopologyInfo) MarshalJSON() ([]byte, error) {
	type plain TopologyInfo
	if t.GPUs == nil {
		t.GPUs = []GPU{}
	}
	return json.Marshal(plain(t))
}

// Topology discovers the GPUs with NVML ($TENT_NVML_LIBRARY, else
// libnvidia-ml.so.1). No NVML or no driver is not an error: the topology
// is empty and Reason says why. The error is reserved for misuse; today
// Topology always returns nil.
func Topology() (TopologyInfo, error) {
	path := os.Getenv(EnvLibrary)
	if path == "" {
		path = DefaultLibrary
	}
	return TopologyFrom(path)
}

var (
	libMu sync.Mutex
	libs  = map[string]nvml.Interface{}

	// newLibrary makes the go-nvml library object (tests replace it).
	newLibrary = func(path string) nvml.Interface { return nvml.New(nvml.WithLibraryPath(path)) }
)

// TopologyFrom is Topology with the NVML library at path. NVML stays
// initialized for the life of the process once it worked (a library whose
// functions are bound is never unloaded).
func TopologyFrom(path string) (info TopologyInfo, err error) {
	defer func() {
		if p := recover(); p != nil {
			info = TopologyInfo{GPUs: []GPU{}, Reason: fmt.Sprintf("NVML failed: %v", p)}
			err = nil
		}
	}()
	info = TopologyInfo{GPUs: []GPU{}}
	lib, reason := open(path)
	if lib == nil {
		info.Reason = reason
		return info, nil
	}
	ext := lib.Extensions()
	has := func(sym string) bool { return ext.LookupSymbol(sym) == nil }

	if has("nvmlSystemGetDriverVersion") {
		if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
			info.DriverVersion = v
		}
	}
	if has("nvmlSystemGetCudaDriverVersion") {
		if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
			info.CUDADriverVersion = v
		}
	}
	for _, syms := range [][]string{
		{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
		{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
		{"nvmlDeviceGetName"},
		{"nvmlDeviceGetUUID"},
		{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"},
		{"nvmlErrorString"},
	} {
		// go-nvml binds NVML functions lazily: calling one the library
		// lacks would end the process, so check before any call.
		found := false
		for _, s := range syms {
			found = found || has(s)
		}
		if !found {
			info.Reason = "NVML lacks " + syms[0]
			return info, nil
		}
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		info.Reason = "nvmlDeviceGetCount: " + lib.ErrorString(ret)
		return info, nil
	}
	if n == 0 {
		info.Reason = "NVML sees no GPU"
		return info, nil
	}
	var problems []string
	for i := 0; i < n; i++ {
		g, problem := gpu(lib, has, i)
		if problem != "" {
			problems = append(problems, problem)
		}
		info.GPUs = append(info.GPUs, g)
	}
	info.FabricCapable = len(info.GPUs) > 0
	for _, g := range info.GPUs {
		info.FabricCapable = info.FabricCapable && g.Fabric.Usable
	}
	if len(problems) > 0 {
		info.Reason = fmt.Sprintf("%d problem(s): %v", len(problems), problems)
	}
	return info, nil
}

// open initializes the NVML library at path once; on failure it returns
// nil and the reason.
func open(path string) (nvml.Interface, string) {
	libMu.Lock()
	defer libMu.Unlock()
	if lib, ok := libs[path]; ok {
		return lib, ""
	}
	lib := newLibrary(path)
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		libs[path] = lib
		return lib, ""
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Sprintf("no NVML (%s not found): no GPU topology", path)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, "nvmlInit: the NVIDIA driver is not loaded: no GPU topology"
	default:
		// The library stays loaded (go-nvml keeps it); a later call
		// retries nvmlInit.
		return nil, fmt.Sprintf("nvmlInit: %s: no GPU topology", lib.ErrorString(ret))
	}
}

func gpu(lib nvml.Interface, has func(string) bool, i int) (GPU, string) {
	g := GPU{Index: i, NUMANode: -1, Fabric: Fabric{State: FabricStateUnknown}}
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return g, fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d): %s", i, lib.ErrorString(ret))
	}
	var problem string
	note := func(call string, ret nvml.Return) {
		if problem == "" {
			problem = fmt.Sprintf("GPU %d: %s: %s", i, call, lib.ErrorString(ret))
		}
	}
	if v, ret := lib.DeviceGetName(dev); ret == nvml.SUCCESS {
		g.Name = v
	} else {
		note("nvmlDeviceGetName", ret)
	}
	if v, ret := lib.DeviceGetUUID(dev); ret == nvml.SUCCESS {
		g.UUID = v
	} else {
		note("nvmlDeviceGetUUID", ret)
	}
	if v, ret := lib.DeviceGetPciInfo(dev); ret == nvml.SUCCESS {
		g.PCIBusID = cstr(v.BusId[:])
	} else {
		note("nvmlDeviceGetPciInfo", ret)
	}
	if has("nvmlDeviceGetMemoryInfo") {
		if v, ret := lib.DeviceGetMemoryInfo(dev); ret == nvml.SUCCESS {
			g.MemoryTotal = v.Total
		} else {
			note("nvmlDeviceGetMemoryInfo", ret)
		}
	}
	if has("nvmlDeviceGetNumaNodeId") {
		if v, ret := lib.DeviceGetNumaNodeId(dev); ret == nvml.SUCCESS {
			g.NUMANode = v
		}
	}
	g.Fabric = fabric(lib, has, dev)
	return g, problem
}

func fabric(lib nvml.Interface, has func(string) bool, dev nvml.Device) Fabric {
	var (
		uuid    [16]uint8
		st      uint32
		clique  uint32
		state   uint8
		ret     nvml.Return
		queried bool
	)
	switch {
	case has("nvmlDeviceGetGpuFabricInfoV"):
		var v nvml.GpuFabricInfo_v2
		v, ret = lib.DeviceGetGpuFabricInfoV(dev).V2()
		uuid, st, clique, state, queried = v.ClusterUuid, v.Status, v.CliqueId, v.State, true
	case has("nvmlDeviceGetGpuFabricInfo"):
		var v nvml.GpuFabricInfo
		v, ret = lib.DeviceGetGpuFabricInfo(dev)
		uuid, st, clique, state, queried = v.ClusterUuid, v.Status, v.CliqueId, v.State, true
	}
	if !queried {
		return Fabric{State: FabricStateUnknown}
	}
	if ret != nvml.SUCCESS {
		return Fabric{State: FabricStateNotSupported}
	}
	f := Fabric{Supported: true, CliqueID: clique, State: stateName(state), Status: nvml.Return(st).String()}
	if st == uint32(nvml.SUCCESS) {
		f.Status = "SUCCESS"
	}
	if uuid != ([16]uint8{}) {
		f.ClusterUUID = fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:16])
	}
	f.Usable = state == nvml.GPU_FABRIC_STATE_COMPLETED && st == uint32(nvml.SUCCESS) && f.ClusterUUID != ""
	if state == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		f.Supported = false
	}
	return f
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

func cstr(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
