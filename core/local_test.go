package core_test

import (
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/transport/local"
	"github.com/tent-dev/tent/transport/tcp"
)

// available is what the tests' engines may install: the transports core's
// tests exercise with real peers.
func available() []core.TransportSpec {
	return []core.TransportSpec{local.Spec(), tcp.Spec(tcp.Options{})}
}

func localTransport() core.Transport { return local.New() }

func uintptrOf(b []byte) uintptr { return uintptr(memoryAddr(b)) }

func memoryAddr(b []byte) uint64 { return host.Addr(b) }
