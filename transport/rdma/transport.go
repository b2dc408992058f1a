package rdma

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/rdma/verbs"
	"github.com/tent-dev/tent/wire"
)

// Transport is the rdma transport of one engine. Make it with New (or
// through Spec); the engine calls the rest.
type Transport struct {
	opts Options
	e    *core.Engine
	lib  devLibrary
	// nics is fixed once Install returns: Submit and Eligible read it
	// without a lock, also while Uninstall closes the NICs (their
	// requests then fail on the closed transport).
	nics []*nic
	// why is the reason the transport cannot serve here (no library, no
	// device, a device that does not open); "" when it can.
	why      string
	gidIndex int // of every port (GIDIndexEnv)

	mu     sync.Mutex
	regs   map[*core.Region]*registration
	conns  map[connKey]*queuePair
	closed bool

	ctx      context.Context // canceled by Uninstall: aborts dials
	cancel   context.CancelFunc
	unhandle func()
	wg       sync.WaitGroup // connect and watch goroutines
	pollers  sync.WaitGroup
	stop     chan struct{}
	targets  connSet // connect-channel connections we serve

	liveNICs  atomic.Int64 // NICs opened and not yet closed
	targetQPs atomic.Int64
	mrs       atomic.Int64
	ids       atomic.Uint64 // work request ids
	spread    atomic.Uint64 // round robin over a route's NIC pairs
	posts     atomic.Int64  // ibv_post_send calls (each a chain)
	signaled  atomic.Int64  // work requests posted signalled
}

// New makes an rdma transport with options o; Install opens libibverbs.
func New(o Options) *Transport {
	return &Transport{opts: o, regs: map[*core.Region]*registration{}, conns: map[connKey]*queuePair{}, stop: make(chan struct{})}
}

// Name is "rdma".
func (t *Transport) Name() string { return Name }

// port is the HCA port used on every NIC.
const port uint8 = 1

// Install opens libibverbs and every device it lists, and starts a poller
// per NIC. A machine without a library or a device is not an error: the
// transport reports why through Unavailable, and the engine leaves it out.
func (t *Transport) Install(e *core.Engine) error {
	t.e = e
	t.ctx, t.cancel = context.WithCancel(context.Background())
	path := t.opts.Library
	if path == "" {
		path = verbs.LibraryPath(os.Getenv)
	}
	open := t.opts.open
	if open == nil {
		open = openVerbs
	}
	lib, err := open(path)
	if err != nil {
		t.why = fmt.Sprintf("no verbs library: %v", err)
		return nil
	}
	devs, err := lib.Devices()
	switch {
	case errors.Is(err, verbs.ErrNoDevice) || (err == nil && len(devs) == 0):
		t.why = fmt.Sprintf("no RDMA device (%s lists none)", path)
	case err != nil:
		t.why = fmt.Sprintf("listing RDMA devices: %v", err)
	}
	if t.why != "" {
		_ = lib.Close()
		return nil
	}
	if len(devs) > maxNICs {
		devs = devs[:maxNICs]
	}
	t.gidIndex, _ = strconv.Atoi(os.Getenv(GIDIndexEnv))
	for i, d := range devs {
		info := nicInfo{Name: d.Name, NUMA: d.NUMANode, PCI: d.PCIAddress}
		if info.NUMA < 0 && info.PCI == "" {
			info.NUMA, info.PCI = sysfsAffinity(t.opts.SysfsRoot, d.Name)
		}
		n, err := openNIC(lib, i, info, port, t.gidIndex)
		if err != nil {
			t.why = fmt.Sprintf("opening RDMA device %s: %v", d.Name, err)
			t.closeNICs()
			t.nics = nil
			_ = lib.Close()
			return nil
		}
		t.nics = append(t.nics, n)
		t.liveNICs.Add(1)
	}
	t.lib = lib
	un, err := e.HandleConn(KindConnect, t.serveConnect)
	if err != nil {
		t.closeNICs()
		t.nics = nil
		_ = lib.Close()
		t.lib = nil
		return err
	}
	t.unhandle = un
	for _, n := range t.nics {
		t.pollers.Add(1)
		go t.poll(n)
	}
	return nil
}

// GIDIndexEnv selects the GID index of each port (RoCE v2 usually needs a
// non-zero one; see show_gids); unset means 0.
const GIDIndexEnv = "TENT_RDMA_GID_INDEX"

// Unavailable is why the transport cannot serve on this machine, or "".
func (t *Transport) Unavailable() string { return t.why }

// Endpoints publishes the engine's listener, where peers connect queue
// pairs (KindConnect).
func (t *Transport) Endpoints() []wire.Endpoint {
	if t.why != "" {
		return nil
	}
	return []wire.Endpoint{{Transport: Name, Addr: t.e.ListenAddr()}}
}

func (t *Transport) queuePairs() []*queuePair {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*queuePair, 0, len(t.conns))
	for _, qp := range t.conns {
		out = append(out, qp)
	}
	return out
}

// Uninstall fails the work in flight (ErrClosed), then destroys, in
// order, the queue pairs (ours and those peers connected), the MRs, the
// completion queues, protection domains and device contexts, and closes
// the library.
func (t *Transport) Uninstall() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	if t.cancel != nil {
		t.cancel()
	}
	if t.lib == nil {
		return nil // never opened a NIC
	}
	if t.unhandle != nil {
		t.unhandle()
	}
	closed := status.Errorf(status.Closed, "rdma transport uninstalled")
	for _, qp := range t.queuePairs() {
		t.breakQP(qp, closed)
	}
	t.targets.closeAll()
	t.wg.Wait()
	// A connect that finished after the sweep above broke its own queue
	// pair (it found the transport closed); sweep once more for any
	// queue pair made in between.
	for _, qp := range t.queuePairs() {
		t.breakQP(qp, closed)
	}
	close(t.stop)
	t.pollers.Wait()
	var errs []error
	t.mu.Lock()
	regs := t.regs
	t.regs = map[*core.Region]*registration{}
	t.conns = map[connKey]*queuePair{}
	t.mu.Unlock()
	for _, reg := range regs {
		t.mrs.Add(-int64(len(reg.mrs)))
		errs = append(errs, reg.dereg())
	}
	errs = append(errs, t.closeNICs())
	errs = append(errs, t.lib.Close())
	t.lib = nil
	return errors.Join(errs...)
}

func (t *Transport) closeNICs() error {
	var errs []error
	for _, n := range t.nics {
		errs = append(errs, n.close())
	}
	t.liveNICs.Store(0)
	return errors.Join(errs...)
}

// Stats reports the transport's live objects (for leak checks) and, per
// NIC, its index (as request statuses name it), the bytes, work requests
// and core requests it carried.
func (t *Transport) Stats() map[string]int64 {
	s := map[string]int64{
		"nics":       t.liveNICs.Load(),
		"mrs":        t.mrs.Load(),
		"target_qps": t.targetQPs.Load(),
		"posts":      t.posts.Load(),
		"signaled":   t.signaled.Load(),
	}
	var qps, inflight int64
	for _, n := range t.nics {
		n.mu.Lock()
		qps += int64(n.qps)
		inflight += int64(len(n.inflight))
		n.mu.Unlock()
		s["nic."+n.info.Name+".bytes"] = n.bytes.Load()
		s["nic."+n.info.Name+".wrs"] = n.requests.Load()
		s["nic."+n.info.Name+".requests"] = n.served.Load()
		// The index a request's status names its NIC by (TENT_STATUS_NIC).
		s["nic."+n.info.Name+".index"] = int64(n.idx)
	}
	s["qps"] = qps
	s["inflight"] = inflight
	t.mu.Lock()
	s["regions"] = int64(len(t.regs))
	// GPU regions by how they were registered (host regions are the rest).
	s["gpu_regions.dmabuf"], s["gpu_regions.peermem"] = 0, 0
	for _, reg := range t.regs {
		if reg.path != pathHost {
			s["gpu_regions."+reg.path.String()]++
		}
	}
	t.mu.Unlock()
	return s
}
