// Package fakenvml builds a fake NVML library, libnvidia-ml.so.1, for
// tests on machines without the NVIDIA driver: it reports GPUs (name, UUID,
// PCI bus and device ids, memory, NUMA node, NVLink fabric state) from the
// environment (FAKENVML_GPUS, FAKENVML_NUMA, FAKENVML_FABRIC,
// FAKENVML_INIT_ERROR; see c/fakenvml.c) and defines only the functions
// tent's topology calls, so any other NVML function is one it lacks.
//
// NVML is found the way the real driver is: by name, libnvidia-ml.so.1,
// through the dynamic loader's search path. A test builds the fake into a
// directory (Build, or Dir) and starts a process with that directory on
// LD_LIBRARY_PATH (Environ); the process's go-nvml and tent's forwarders
// (cuda/nvmlinfo/forward) then reach the fake. The loader reads
// LD_LIBRARY_PATH when a process starts, so it is always a new process.
//
//	dir := fakenvml.Dir(t)                        // removed when t ends
//	cmd.Env = fakenvml.Environ(dir, "FAKENVML_GPUS=4")
//
// Variants leave functions out, for code paths of older drivers:
// WithoutFabricV (only nvmlDeviceGetGpuFabricInfo), WithoutNUMA.
package fakenvml
