// Package nvmlinfo discovers the machine's GPU topology with NVML, through
// github.com/NVIDIA/go-nvml's typed API (its process-wide library:
// nvml.Init, the queries, nvml.Shutdown, per Topology call).
//
// Topology lists the GPUs (index, name, UUID, PCI bus id, PCI device id,
// NUMA node, total memory), the driver version, and each GPU's NVLink
// fabric registration (nvmlDeviceGetGpuFabricInfoV, else
// nvmlDeviceGetGpuFabricInfo): cluster UUID, clique id, state.
// Fabric.Usable (registration completed with success in a cluster) is what
// CUDA FABRIC handles, multi-node NVLink, need; TopologyInfo.FabricCapable
// says all GPUs have it. CUDA's own answer is the device attribute
// HANDLE_TYPE_FABRIC_SUPPORTED (cuda.DeviceInfo); both must hold.
//
// go-nvml leaves every NVML function undefined for the dynamic loader to
// bind lazily, which libtent.so cannot afford (no driver: Python's RTLD_NOW
// load fails). Package forward, imported here, defines them all inside the
// binary and resolves each with dlsym from libnvidia-ml.so.1, opened once:
// a missing library or function is an NVML error code, never a failed load
// or a crash.
//
// No NVML library or no driver is not an error: Topology returns an empty
// topology (GPUs is [], never null, in JSON) and a nil error, with Reason
// saying why. A function the installed NVML lacks leaves its field at the
// zero value (NUMANode -1, fabric state "unknown"); a failed name, UUID or
// PCI query is listed in Reason; a panic during the query is recovered
// into Reason.
//
// Tests use the fake NVML of package fakenvml, on LD_LIBRARY_PATH of a
// child process.
//
// JSON field names are stable:
//
//	{"driver_version": "550.54.15", "cuda_driver_version": 12040,
//	 "gpus": [{"index": 0, "name": "...", "uuid": "GPU-...", "pci_bus_id": "00000000:1B:00.0",
//	           "pci_device_id": 590680286, "numa_node": 0, "memory_total": 85899345920,
//	           "fabric": {"supported": true, "state": "completed", "status": "SUCCESS",
//	                      "cluster_uuid": "...", "clique_id": 7, "usable": true}}],
//	 "fabric_capable": true, "reason": ""}
package nvmlinfo
