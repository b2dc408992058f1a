package main

import (
	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
)

// library is what libtent.so keeps for the whole process, beside the
// engines themselves: the library is the process boundary, so state that
// spans engines lives here and nowhere in the packages below.
type library struct {
	// handles holds every handle given to C, of every engine. Ids are
	// never reused, so a stale id can never find another object.
	handles *handles.Table
	// peers is the set every engine of the library joins, so engines of
	// one process reach each other without the network.
	peers *core.LocalPeers
	// transports lists the transports an engine may install, with the
	// tcp stream count tent_engine_options gives (builtinTransports).
	transports func(tcpStreams uint32) []core.TransportSpec
}

// lib is the library's state, made once when libtent.so is loaded.
var lib = newLibrary(builtinTransports)

func newLibrary(transports func(tcpStreams uint32) []core.TransportSpec) *library {
	return &library{handles: handles.NewTable(), peers: core.NewLocalPeers(), transports: transports}
}
