package rdma

import "github.com/tent-dev/tent/core"

// Name is the transport's name in Options.Transports and endpoints.
const Name = "rdma"

// ID is the transport's id in request statuses (TENT_TRANSPORT_RDMA).
const ID uint32 = 5

// Rank places rdma after shm and cuda (on one host a copy through shared
// memory or the copy engine needs no NIC) and before tcp, which it beats
// between hosts.
const Rank = 35

// KindConnect is the channel kind of queue-pair set-up connections on the
// engine's listener.
const KindConnect uint8 = 5

// Options are the rdma transport's own; the zero value means defaults.
type Options struct {
	// Library is the libibverbs to open; "" means $TENT_RDMA_VERBS_LIBRARY,
	// else libibverbs.so.1.
	Library string
	// SysfsRoot is where NIC affinity is read (/sys/class/infiniband/<dev>);
	// "" means /sys. Tests point it at a directory of their own.
	SysfsRoot string
	// SignalEvery is how many work requests of a chain share one signalled
	// completion (selective signalling); 0 means 16, 1 signals every one.
	SignalEvery int

	// beforeRegMR, set by tests, runs before each ibv_reg_mr with the NIC's
	// index (a panic in the middle of a batch).
	beforeRegMR func(nic int)
	// beforeEnqueue, set by tests, runs between a queue pair's lookup and
	// the enqueue of work on it (a break landing in between).
	beforeEnqueue func(qp *queuePair)
	// open, set by tests, opens the verbs library instead of package
	// verbs (an in-process fabric).
	open func(path string) (devLibrary, error)
}

// Spec declares the transport to an engine, with options o.
func Spec(o Options) core.TransportSpec {
	return core.TransportSpec{
		Name: Name, ID: ID, Rank: Rank, Kinds: []uint8{KindConnect},
		New: func() core.Transport { return New(o) },
	}
}
