package local

import "github.com/tent-dev/tent/core"

// Name is the transport's name in Options.Transports.
const Name = "local"

// ID is the transport's id in request statuses (TENT_TRANSPORT_LOCAL).
const ID uint32 = 1

// Rank places local first: a copy inside the process beats every wire.
const Rank = 10

// Spec declares the transport to an engine. It has no options and no
// channel kinds: it never talks to a listener.
func Spec() core.TransportSpec {
	return core.TransportSpec{Name: Name, ID: ID, Rank: Rank, New: func() core.Transport { return New() }}
}
