package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"
	"strings"

	// The transports built into libtent.so; each registers itself with
	// core, which orders them by preference (core.AvailableTransports).
	_ "github.com/tent-dev/tent/transport/cuda"
	_ "github.com/tent-dev/tent/transport/local"
	_ "github.com/tent-dev/tent/transport/shm"
	_ "github.com/tent-dev/tent/transport/tcp"
)

//export tentgo_engine_transports
func tentgo_engine_transports(id C.uint64_t, buf C.uintptr_t, capacity C.size_t, lenOut C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("engine_transports")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if err := copyOut(uintptr(buf), capacity, uintptr(lenOut), e.transportList()); err != nil {
		return fail(err)
	}
	return ok()
}

// transportList is the installed transports in preference order, comma
// separated: the format tent_engine_options.transports takes, so a caller
// can hand it back to a new engine.
func (e *engine) transportList() string {
	ts := e.core.Transports()
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name()
	}
	return strings.Join(names, ",")
}
