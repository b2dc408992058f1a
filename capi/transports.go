package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"
	"slices"
	"strings"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/transport/cuda"
	"github.com/tent-dev/tent/transport/local"
	"github.com/tent-dev/tent/transport/rdma"
	"github.com/tent-dev/tent/transport/shm"
	"github.com/tent-dev/tent/transport/tcp"
)

//export tentgo_engine_transports
func tentgo_engine_transports(id C.uint64_t, buf C.uintptr_t, capacity C.size_t, lenOut C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
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

// builtinTransports lists the transports built into libtent.so, each
// declared by its package's spec with the options tent_engine_options gives
// it; core orders them by rank. A transport added to the library is added
// here.
func builtinTransports(tcpStreams uint32) []core.TransportSpec {
	return []core.TransportSpec{
		local.Spec(),
		cuda.Spec(),
		shm.Spec(),
		rdma.Spec(rdma.Options{}),
		tcp.Spec(tcp.Options{Streams: int(tcpStreams)}),
	}
}

// transportSpecs lists the transports an engine of the library may install.
func transportSpecs(tcpStreams uint32) []core.TransportSpec {
	return lib.transports(tcpStreams)
}

// knownTransport reports whether name is a transport of the library, for
// checking tent_transfer_options.transport before anything is submitted.
func knownTransport(name string) bool {
	return slices.ContainsFunc(transportSpecs(0), func(s core.TransportSpec) bool { return s.Name == name })
}

// transportNames lists the library's transport names, for messages.
func transportNames() []string {
	var out []string
	for _, s := range transportSpecs(0) {
		out = append(out, s.Name)
	}
	return out
}
