package tcp

import "github.com/tent-dev/tent/core"

// Name is the transport's name in Options.Transports and endpoints.
const Name = "tcp"

// ID is the transport's id in request statuses (TENT_TRANSPORT_TCP).
const ID uint32 = 3

// Rank places tcp last among the built-in transports: it reaches any peer,
// so it serves what no more direct path can.
const Rank = 40

// KindData is the channel kind of the data streams, on the engine's
// listener.
const KindData uint8 = 2

// DefaultStreams is the number of streams per peer when Options.Streams is 0.
const DefaultStreams = 4

// Options are the tcp transport's own; the zero value means defaults.
type Options struct {
	// Streams is the number of connections per peer incarnation that
	// large requests are spread over.
	Streams int
}

func (o Options) withDefaults() Options {
	if o.Streams <= 0 {
		o.Streams = DefaultStreams
	}
	return o
}

// Spec declares the transport to an engine, with options o.
func Spec(o Options) core.TransportSpec {
	return core.TransportSpec{
		Name: Name, ID: ID, Rank: Rank, Kinds: []uint8{KindData},
		New: func() core.Transport { return New(o) },
	}
}
