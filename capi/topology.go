package main

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/json"
	"runtime/debug"

	"github.com/tent-dev/tent/status"
)

// topology has the JSON shape of cuda/nvmlinfo.TopologyInfo.
//
// Not cuda/nvmlinfo itself: go-nvml leaves every NVML function an undefined
// symbol bound lazily, and a library with undefined symbols fails to load
// with RTLD_NOW, which Python's ctypes always uses ("undefined symbol:
// nvmlGpuInstanceGetComputeInstanceProfileInfoV"). The dlopen test in
// tests/c guards against that. Wire nvmlinfo here once it resolves NVML
// with dlsym.
type topology struct {
	DriverVersion     string `json:"driver_version"`
	CUDADriverVersion int    `json:"cuda_driver_version"`
	GPUs              []any  `json:"gpus"`
	FabricCapable     bool   `json:"fabric_capable"`
	Reason            string `json:"reason"`
}

//export tentgo_topology_json
func tentgo_topology_json(buf *C.char, capacity C.size_t, lenOut *C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("topology_json")
	// No GPU is not an error: "gpus": [] and a reason.
	js, err := json.Marshal(topology{
		GPUs:   []any{},
		Reason: "GPU discovery (NVML) is not built into this libtent yet",
	})
	if err != nil {
		return fail(status.Errorf(status.Internal, "encoding the topology: %w", err))
	}
	if err := copyOut(buf, capacity, lenOut, string(js)); err != nil {
		return fail(err)
	}
	return ok()
}
