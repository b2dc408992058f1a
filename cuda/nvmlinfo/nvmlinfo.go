package nvmlinfo

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "tent_nvml.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"unsafe"
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
	libs  = map[string]*C.tent_nvml_api{}

	// testHook runs at the start of each query (tests make it panic).
	testHook func()
)

// NVML return codes and fabric states nvmlinfo looks at (nvml.h).
const (
	nvmlSuccess         = 0
	nvmlDriverNotLoaded = 9

	fabricNotSupported = 0
	fabricNotStarted   = 1
	fabricInProgress   = 2
	fabricCompleted    = 3
)

// TopologyFrom is Topology with the NVML library at path. NVML stays loaded
// and initialized for the life of the process once nvmlInit worked.
func TopologyFrom(path string) (info TopologyInfo, err error) {
	defer func() {
		if p := recover(); p != nil {
			info = TopologyInfo{GPUs: []GPU{}, Reason: fmt.Sprintf("NVML failed: %v", p)}
			err = nil
		}
	}()
	if testHook != nil {
		testHook()
	}
	info = TopologyInfo{GPUs: []GPU{}}
	a, reason := open(path)
	if a == nil {
		info.Reason = reason
		return info, nil
	}
	var buf [128]C.char
	if C.tent_nvml_driver_version(a, &buf[0], C.uint(len(buf))) == nvmlSuccess {
		info.DriverVersion = C.GoString(&buf[0])
	}
	var cv C.int
	if C.tent_nvml_cuda_driver_version(a, &cv) == nvmlSuccess {
		info.CUDADriverVersion = int(cv)
	}
	var n C.uint
	if r := C.tent_nvml_device_count(a, &n); r != nvmlSuccess {
		info.Reason = "nvmlDeviceGetCount: " + errorString(a, r)
		return info, nil
	}
	if n == 0 {
		info.Reason = "NVML sees no GPU"
		return info, nil
	}
	var problems []string
	for i := 0; i < int(n); i++ {
		g, problem := gpu(a, i)
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

func errorString(a *C.tent_nvml_api, r C.nvmlReturn_t) string {
	return C.GoString(C.tent_nvml_error_string(a, r))
}

// open loads and initializes the NVML library at path once; on failure it
// returns nil and the reason (a later call tries again).
func open(path string) (*C.tent_nvml_api, string) {
	libMu.Lock()
	defer libMu.Unlock()
	if a, ok := libs[path]; ok {
		return a, ""
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [256]C.char
	var notFound C.int
	a := C.tent_nvml_open(cpath, &errbuf[0], C.int(len(errbuf)), &notFound)
	if a == nil {
		if notFound != 0 {
			return nil, fmt.Sprintf("no NVML (%s not found): no GPU topology", path)
		}
		return nil, fmt.Sprintf("NVML unusable (%s): no GPU topology", C.GoString(&errbuf[0]))
	}
	switch r := C.tent_nvml_init(a); r {
	case nvmlSuccess:
		libs[path] = a
		return a, ""
	case nvmlDriverNotLoaded:
		return nil, "nvmlInit: the NVIDIA driver is not loaded: no GPU topology"
	default:
		return nil, fmt.Sprintf("nvmlInit: %s: no GPU topology", errorString(a, r))
	}
}

func gpu(a *C.tent_nvml_api, i int) (GPU, string) {
	g := GPU{Index: i, NUMANode: -1, Fabric: Fabric{State: FabricStateUnknown}}
	var dev C.nvmlDevice_t
	if r := C.tent_nvml_device_by_index(a, C.uint(i), &dev); r != nvmlSuccess {
		return g, fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d): %s", i, errorString(a, r))
	}
	var problem string
	note := func(call string, r C.nvmlReturn_t) {
		if problem == "" {
			problem = fmt.Sprintf("GPU %d: %s: %s", i, call, errorString(a, r))
		}
	}
	var buf [128]C.char
	if r := C.tent_nvml_name(a, dev, &buf[0], C.uint(len(buf))); r == nvmlSuccess {
		g.Name = C.GoString(&buf[0])
	} else {
		note("nvmlDeviceGetName", r)
	}
	if r := C.tent_nvml_uuid(a, dev, &buf[0], C.uint(len(buf))); r == nvmlSuccess {
		g.UUID = C.GoString(&buf[0])
	} else {
		note("nvmlDeviceGetUUID", r)
	}
	var pci C.tent_nvml_pci_t
	if r := C.tent_nvml_pci(a, dev, &pci); r == nvmlSuccess {
		g.PCIBusID = C.GoString(&pci.busId[0])
	} else {
		note("nvmlDeviceGetPciInfo", r)
	}
	var mem C.tent_nvml_memory_t
	if r := C.tent_nvml_memory(a, dev, &mem); r == nvmlSuccess {
		g.MemoryTotal = uint64(mem.total)
	}
	var node C.uint
	if C.tent_nvml_numa_node(a, dev, &node) == nvmlSuccess {
		g.NUMANode = int(node)
	}
	g.Fabric = fabric(a, dev)
	return g, problem
}

func fabric(a *C.tent_nvml_api, dev C.nvmlDevice_t) Fabric {
	var f C.tent_nvml_fabric_v2_t
	switch r := C.tent_nvml_fabric(a, dev, &f); {
	case r == C.NVML_ERROR_FUNCTION_NOT_FOUND:
		return Fabric{State: FabricStateUnknown}
	case r != nvmlSuccess:
		return Fabric{State: FabricStateNotSupported}
	}
	out := Fabric{Supported: true, CliqueID: uint32(f.cliqueId), State: stateName(uint8(f.state))}
	if f.status == nvmlSuccess {
		out.Status = "SUCCESS"
	} else {
		out.Status = errorString(a, f.status)
	}
	var uuid [16]byte
	for i := range uuid {
		uuid[i] = byte(f.clusterUuid[i])
	}
	if uuid != ([16]byte{}) {
		out.ClusterUUID = fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:16])
	}
	out.Usable = f.state == fabricCompleted && f.status == nvmlSuccess && out.ClusterUUID != ""
	if f.state == fabricNotSupported {
		out.Supported = false
	}
	return out
}

func stateName(s uint8) string {
	switch s {
	case fabricNotSupported:
		return FabricStateNotSupported
	case fabricNotStarted:
		return FabricStateNotStarted
	case fabricInProgress:
		return FabricStateInProgress
	case fabricCompleted:
		return FabricStateCompleted
	}
	return FabricStateUnknown
}
