package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"

	"github.com/tent-dev/tent/cuda/nvmlinfo"
	"github.com/tent-dev/tent/status"
)

//export tentgo_topology_json
func tentgo_topology_json(buf C.uintptr_t, capacity C.size_t, lenOut C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	// No GPU (no NVML, no driver) is not an error: "gpus": [] and a reason.
	// nvmlinfo queries NVML through go-nvml, whose NVML functions are
	// defined inside libtent.so (cuda/nvmlinfo/forward), so libtent.so
	// keeps loading with RTLD_NOW where no driver is installed
	// (tests/c/test_dlopen.c, tests/nvml).
	info, err := nvmlinfo.Topology()
	if err != nil {
		return fail(err)
	}
	js, err := info.JSON()
	if err != nil {
		return fail(status.Errorf(status.Internal, "encoding the topology: %w", err))
	}
	if err := copyOut(uintptr(buf), capacity, uintptr(lenOut), string(js)); err != nil {
		return fail(err)
	}
	return ok()
}
