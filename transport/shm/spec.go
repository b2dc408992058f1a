//go:build linux

package shm

import "github.com/tent-dev/tent/core"

// Name is the transport's name in Options.Transports and endpoints.
const Name = "shm"

// ID is the transport's id in request statuses (TENT_TRANSPORT_SHM).
const ID uint32 = 2

// Rank places shm after cuda (GPU memory wants the copy engine) and before
// tcp (a same-host copy beats the loopback).
const Rank = 30

// Spec declares the transport to an engine. Its channel kind is the one
// its own Unix listener serves.
func Spec() core.TransportSpec {
	return core.TransportSpec{
		Name: Name, ID: ID, Rank: Rank, Kinds: []uint8{kindShm},
		New: func() core.Transport { return New() },
	}
}
