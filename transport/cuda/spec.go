package cuda

import "github.com/tent-dev/tent/core"

// ID is the transport's id in request statuses (TENT_TRANSPORT_CUDA).
const ID uint32 = 4

// Rank places cuda right after local: for GPU memory on this host the
// copy engine is the most direct path.
const Rank = 20

// Spec declares the transport to an engine. Its channel kind serves both
// its own Unix listener and lease-only sessions on the engine's listener.
func Spec() core.TransportSpec {
	return core.TransportSpec{
		Name: Name, ID: ID, Rank: Rank, Kinds: []uint8{KindCUDA},
		New: func() core.Transport { return New() },
	}
}
