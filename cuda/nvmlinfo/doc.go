// Package nvmlinfo discovers the machine's GPU topology with NVML
// (github.com/NVIDIA/go-nvml, which dlopens libnvidia-ml.so.1 at Init, so
// it builds and runs without a driver).
//
// Topology lists the GPUs (index, name, UUID, PCI bus id, NUMA node, total
// memory), the driver version, and each GPU's NVLink fabric registration
// (nvmlDeviceGetGpuFabricInfoV, else nvmlDeviceGetGpuFabricInfo): cluster
// UUID, clique id, state. Fabric.Usable (registration completed with
// success in a cluster) is what CUDA FABRIC handles, multi-node NVLink,
// need; TopologyInfo.FabricCapable says all GPUs have it. CUDA's own answer
// is the device attribute HANDLE_TYPE_FABRIC_SUPPORTED (cuda.DeviceInfo);
// both must hold.
//
// No NVML library or no driver is not an error: Topology returns an empty
// topology (GPUs is [], never null, in JSON) and a nil error, with Reason
// saying why. go-nvml binds NVML functions lazily, so calling one that the
// installed library lacks would end the process: every call is preceded by
// a symbol check, and a panic inside go-nvml is recovered into Reason.
//
// NVML is initialized once per library path and never shut down (its
// functions, once bound, must stay valid). $TENT_NVML_LIBRARY overrides the
// library path.
//
// JSON field names are stable:
//
//	{"driver_version": "550.54.15", "cuda_driver_version": 12040,
//	 "gpus": [{"index": 0, "name": "...", "uuid": "GPU-...", "pci_bus_id": "00000000:1B:00.0",
//	           "numa_node": 0, "memory_total": 85899345920,
//	           "fabric": {"supported": true, "state": "completed", "status": "SUCCESS",
//	                      "cluster_uuid": "...", "clique_id": 7, "usable": true}}],
//	 "fabric_capable": true, "reason": ""}
package nvmlinfo
