// Package nvmlinfo discovers the machine's GPU topology with NVML, which it
// dlopen()s at run time (libnvidia-ml.so.1, or $TENT_NVML_LIBRARY) and
// calls through dlsym'd pointers, declaring the few NVML types it reads
// itself (tent_nvml.h). It builds and runs without a driver.
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
// saying why. A function the installed NVML lacks is skipped, and a panic
// during the query is recovered into Reason.
//
// Why not github.com/NVIDIA/go-nvml: it references every NVML function
// at link time and leaves them to be resolved lazily. A Go program copes,
// but libtent.so (-buildmode=c-shared) then carries hundreds of undefined
// nvml* symbols: Python's ctypes (which dlopens with RTLD_NOW) cannot load
// it on a machine without NVML, and a C program cannot link against it
// without --allow-shlib-undefined. dlsym on a private handle has neither
// problem.
//
// NVML is initialized once per library path and never shut down.
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
