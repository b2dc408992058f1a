package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// nic is one opened verbs device: its context, protection domain and the
// completion queue shared by every queue pair on it, polled by one
// goroutine (poller.go).
type nic struct {
	idx  int
	info nicInfo
	port uint8
	ctx  devContext
	pd   devPD
	cq   devCQ
	attr portAttr
	gid  gid

	// mu guards the work requests in flight on the NIC (by id) and every
	// queue pair's queue and posted count.
	mu       sync.Mutex
	inflight map[uint64]*workRequest
	wake     chan struct{} // poked when work is posted
	qps      int           // live queue pairs on the NIC, both sides

	bytes    atomic.Int64 // bytes moved through this NIC (stats)
	requests atomic.Int64 // work requests completed on it
	served   atomic.Int64 // core requests it carried (all or part of)
}

// cqEntries is each NIC's completion-queue depth: room for every queue
// pair's send queue several times over.
const cqEntries = 4096

// openNIC opens device info.Name and readies its port for queue pairs.
// On error nothing stays open.
func openNIC(lib devLibrary, idx int, info nicInfo, port uint8, gidIndex int) (*nic, error) {
	n := &nic{idx: idx, info: info, port: port, inflight: map[uint64]*workRequest{}, wake: make(chan struct{}, 1)}
	if err := n.open(lib, gidIndex); err != nil {
		_ = n.close()
		return nil, err
	}
	return n, nil
}

func (n *nic) open(lib devLibrary, gidIndex int) (err error) {
	if n.ctx, err = lib.OpenDevice(n.info.Name); err != nil {
		return err
	}
	if n.attr, err = n.ctx.QueryPort(n.port); err != nil {
		return err
	}
	if n.gid, err = n.ctx.QueryGID(n.port, gidIndex); err != nil {
		return err
	}
	if n.pd, err = n.ctx.AllocPD(); err != nil {
		return err
	}
	n.cq, err = n.ctx.CreateCQ(cqEntries)
	return err
}

// close destroys what openNIC made, in reverse order: the CQ (its queue
// pairs are gone by now), the PD (its MRs are gone), the context.
func (n *nic) close() error {
	var errs []error
	if n.cq != nil {
		errs = append(errs, n.cq.Destroy())
		n.cq = nil
	}
	if n.pd != nil {
		errs = append(errs, n.pd.Dealloc())
		n.pd = nil
	}
	if n.ctx != nil {
		errs = append(errs, n.ctx.Close())
		n.ctx = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing %s: %w", n.info.Name, err)
	}
	return nil
}

// addr is this NIC's half of a queue pair's connection parameters.
func (n *nic) addr(qpn, psn uint32) qpAddr {
	return qpAddr{QPN: qpn, PSN: psn, LID: n.attr.LID, GID: n.gid, Port: n.port}
}

// poke wakes the NIC's poller if it sleeps.
func (n *nic) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}
