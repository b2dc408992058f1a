//go:build linux

package shm

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// Tunables. Tests shorten leaseGrace; nothing else changes them.
var (
	// leaseGrace is added to a lease's time to live before the target
	// takes it back from an initiator that neither released it nor closed
	// its connection.
	leaseGrace = 2 * time.Second
	// chunk bounds one copy step (one memmove, or one process_vm call):
	// cancellation, uninstall and lease expiry are checked between steps.
	chunk uint64 = 16 << 20
	// pvmSplitMin is the smallest process_vm call split over two threads.
	// Below it the second thread's wake-up and the join cost more than
	// the half they copy: on a 2-vCPU VM a 512 KiB call took twice as long
	// split, 2 MiB broke even and 4 MiB gained 20-30 %.
	pvmSplitMin uint64 = 2 << 20
)

const (
	// pvmHandOffCalls is how many full process_vm calls (chunk bytes
	// each) a waiter leaves to a job goroutine (longPVM).
	pvmHandOffCalls = 4
	// iovMax is the kernel's IOV_MAX: the most iovecs one process_vm call
	// takes on each side.
	iovMax = 1024
	// maxLeasesPerConn bounds the leases one initiator connection may hold
	// on the target; past it, leases are answered with Busy.
	maxLeasesPerConn = 1024
	// controlWriteTimeout bounds writes the target makes on its own
	// account (grants, revokes) and fire-and-forget releases.
	controlWriteTimeout = 5 * time.Second
)

// Transport moves bytes between processes of one host. One instance serves
// one engine, as initiator (jobs, client connections, mappings) and as
// target (listener, server connections, leases).
type Transport struct {
	hooks    testHooks // tests only
	e        *core.Engine
	log      *slog.Logger // the engine's from Install; discards before
	ln       *lease.Listener
	addr     string
	secret   []byte
	maxLease time.Duration

	mu       sync.Mutex
	closed   bool
	done     chan struct{} // closed by Uninstall
	servers  map[*serverConn]struct{}
	clients  map[*core.Peer]*client
	conns    map[*conn]struct{}
	dials    map[net.Conn]struct{} // connections still in their handshake
	jobs     map[*job]struct{}
	queued   map[*core.Request]*job // jobs a waiter may still claim, by their first request
	free     []*job
	denied   map[uint64]struct{} // incarnations whose process_vm was refused
	copying  int                 // jobs holding a lease and copying
	copyIdle *sync.Cond          // signaled when copying drops to 0 (on mu)

	wg      sync.WaitGroup
	closing atomic.Bool
	nDenied atomic.Int32

	goroutines  atomic.Int64
	leases      atomic.Int64 // held by peers on this engine's memory
	mappings    atomic.Int64
	mappedBytes atomic.Int64
	fds         atomic.Int64 // received and not yet closed
	fdsReceived atomic.Int64 // memfds ever received (as initiator)
	fdsSent     atomic.Int64 // memfds ever sent (as target)
	bytesMapped atomic.Int64
	bytesPVM    atomic.Int64
	requests    atomic.Int64
	refused     atomic.Int64 // entries the target refused (either side counts its own)
	fallbacks   atomic.Int64 // process_vm refusals reported as TransportError
	expired     atomic.Int64 // leases the target took back at their deadline
	orphans     atomic.Int64 // grants that arrived after their waiter gave up
	revoked     atomic.Int64 // mappings dropped on the target's revoke
	invalidated atomic.Int64 // mappings dropped by the descriptor check

	// Standing grants.
	grantsHeld     atomic.Int64 // as target: held by peers on this engine's memory
	grantsCached   atomic.Int64 // as initiator: live in this engine's connections
	grantHits      atomic.Int64 // lease runs copied under standing grants, no round trip
	copiesInline   atomic.Int64 // of grantHits, those copied on the waiting caller's goroutine
	copiesHelped   atomic.Int64 // of grantHits, those copied by a caller waiting for a queued job (Help)
	pvmHandedOff   atomic.Int64 // copies a waiter left to a job goroutine: many split process_vm calls (longPVM)
	waitersCame    atomic.Int32 // batches in a row whose waiter claimed them, at most deferAfter
	jobsDeferred   atomic.Int64 // jobs queued for their waiter with no goroutine (queueLocked)
	deferExpiredN  atomic.Int64 // of jobsDeferred, those no waiter claimed in time
	grantMisses    atomic.Int64 // lease runs that asked the target
	grantsRevoked  atomic.Int64 // as initiator: standing grants the target took back
	revokesSent    atomic.Int64 // as target: REVOKE_GRANT frames sent
	revokesAcked   atomic.Int64 // as target: REVOKE_ACKs received
	revokeTimeouts atomic.Int64 // as target: connections closed for want of a REVOKE_ACK
}

// New returns an uninstalled shm transport.
func New() *Transport {
	t := &Transport{
		log:     slog.New(slog.DiscardHandler),
		done:    make(chan struct{}),
		servers: map[*serverConn]struct{}{},
		clients: map[*core.Peer]*client{},
		conns:   map[*conn]struct{}{},
		dials:   map[net.Conn]struct{}{},
		jobs:    map[*job]struct{}{},
		queued:  map[*core.Request]*job{},
		denied:  map[uint64]struct{}{},
	}
	t.copyIdle = sync.NewCond(&t.mu)
	return t
}

func (t *Transport) Name() string { return Name }

// Install starts the Unix-domain listener in the abstract namespace.
func (t *Transport) Install(e *core.Engine) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.e != nil || t.closed {
		return status.Errorf(status.InvalidArgument, "shm transport installed twice")
	}
	// Any process of the host can reach an abstract socket: the listener
	// admits only peers of this uid or root (SO_PEERCRED).
	ln, err := lease.Listen(e, "shm", kindShm)
	if err != nil {
		return err
	}
	opts := e.Options()
	t.e, t.ln, t.addr = e, ln, ln.Addr()
	t.log = e.Logger().With("transport", "shm")
	t.secret = append([]byte(nil), opts.Secret...)
	t.maxLease = opts.DefaultTimeout
	t.spawnLocked(func() { ln.Serve(t.admit) })
	return nil
}

// spawnLocked starts a tracked goroutine; t.mu is held and t is open.
func (t *Transport) spawnLocked(f func()) {
	t.wg.Add(1)
	t.goroutines.Add(1)
	go func() {
		defer t.wg.Done()
		defer t.goroutines.Add(-1)
		f()
	}()
}

// Endpoints publishes the listener.
func (t *Transport) Endpoints() []wire.Endpoint {
	return []wire.Endpoint{{Transport: "shm", Addr: t.addr}}
}

func (t *Transport) RegisterMemory([]*core.Region) error { return nil }

// UnregisterMemory takes back, synchronously, every standing grant on the
// regions (see revokeGrants), then revokes the descriptors of freed
// allocations from every connection they were sent on, so initiators
// unmap them at once. The engine calls it once the regions refuse new
// users and are idle (no lease holds them), before Unregister returns.
func (t *Transport) UnregisterMemory(regions []*core.Region) error {
	set := make(map[*core.Region]struct{}, len(regions))
	for _, r := range regions {
		set[r] = struct{}{}
	}
	t.revokeGrants(func(r *core.Region) bool {
		_, ok := set[r]
		return ok
	})
	var ids []uint64
	for _, r := range regions {
		if r.Alloc != nil {
			ids = append(ids, r.Alloc.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	t.mu.Lock()
	servers := make([]*serverConn, 0, len(t.servers))
	for sc := range t.servers {
		servers = append(servers, sc)
	}
	t.mu.Unlock()
	for _, sc := range servers {
		sc.revoke(ids)
	}
	return nil
}

// revokeGrants takes back every standing grant on the regions match
// selects: REVOKE_GRANT on each connection holding one, then it waits for
// each initiator's REVOKE_ACK (sent once no copy runs under them) or for
// that connection's death, at most UnregisterTimeout. A connection that
// has not acknowledged by then is closed: its initiator is stuck or
// dishonest, and closing ends its leases and grants here. (Its copy in
// progress, if any, is one step that the kernel does not stop: process_vm
// revocation is cooperative, see the security boundary in doc.go.) It
// never waits longer than that, whatever the initiators do.
func (t *Transport) revokeGrants(match func(*core.Region) bool) {
	if t.grantsHeld.Load() == 0 {
		return
	}
	t.mu.Lock()
	servers := make([]*serverConn, 0, len(t.servers))
	for sc := range t.servers {
		servers = append(servers, sc)
	}
	t.mu.Unlock()
	type pending struct {
		sc   *serverConn
		acks []chan struct{}
	}
	var waits []pending
	for _, sc := range servers {
		if ids := sc.takeGrants(match); len(ids) > 0 {
			if acks := sc.revokeGrants(ids); len(acks) > 0 {
				waits = append(waits, pending{sc, acks})
			}
		}
	}
	if len(waits) == 0 {
		return
	}
	timer := time.NewTimer(t.e.Options().UnregisterTimeout)
	defer timer.Stop()
	expired := false
	for _, w := range waits {
		for _, ack := range w.acks {
			if expired {
				select {
				case <-ack:
					continue
				case <-w.sc.dead:
					continue
				default:
				}
			} else {
				select {
				case <-ack:
					continue
				case <-w.sc.dead:
					continue
				case <-timer.C:
					expired = true
				}
			}
			t.revokeTimeouts.Add(1)
			t.log.Warn("shm peer did not acknowledge a grant revoke in time; closing its connection",
				"timeout", t.e.Options().UnregisterTimeout)
			w.sc.close()
			break
		}
	}
}

// ForgetsRequests: a job touches a request only until it calls Done for
// it (complete reports each one once, in order, and the job then only
// compares request pointers: putJob's queued entry, Cancel's and Help's
// lookups), so core may reuse a released batch's requests
// (core.Forgetter).
func (t *Transport) ForgetsRequests() {}

// EligibleByRegion: Eligible looks only at the request's descriptor and
// regions, and this transport's own record of peers denied process_vm
// (core.RegionEligible).
func (t *Transport) EligibleByRegion() {}

// Eligible: same machine, the peer runs an shm listener, host memory on
// both sides. Memory the peer did not allocate with tent_alloc needs
// process_vm, which is skipped for a peer whose kernel refused it before.
func (t *Transport) Eligible(r *core.Request) bool {
	d := r.Desc
	if d == nil || r.LocalRegion == nil || d.MachineID != r.LocalRegion.Engine().MachineID() || r.LocalRegion.Loc.IsCUDA() ||
		strings.HasPrefix(r.RemoteRegion.Location, "cuda") || endpoint(d) == "" {
		return false
	}
	if !mappable(r.RemoteRegion) && t.nDenied.Load() > 0 {
		t.mu.Lock()
		_, denied := t.denied[d.Incarnation]
		t.mu.Unlock()
		return !denied
	}
	return true
}

// mappable says whether the target may send a region's memfd (see
// core.Region.HandleShareable): an engine allocation open to remote reads
// and writes. Everything else is process_vm only.
func mappable(rd *wire.RegionDesc) bool {
	return rd.AllocID != 0 && rd.Perm&wire.PermMask == wire.PermMask
}

func endpoint(d *wire.SegmentDesc) string {
	for i := range d.Endpoints {
		if d.Endpoints[i].Transport == "shm" {
			return d.Endpoints[i].Addr
		}
	}
	return ""
}

// denyPVM stops offering process_vm work for a peer incarnation (a
// restarted peer has a new incarnation and starts afresh).
func (t *Transport) denyPVM(incarnation uint64) {
	t.mu.Lock()
	if _, ok := t.denied[incarnation]; !ok {
		t.denied[incarnation] = struct{}{}
		t.nDenied.Add(1)
	}
	t.mu.Unlock()
}

// Submit copies the requests on the calling goroutine when it may (see
// copyInline), else queues them as a job: a job goroutine runs it, unless
// the caller that waits for the batch claims it first (Help).
func (t *Transport) Submit(reqs []*core.Request) {
	if len(reqs) == 0 {
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		for _, r := range reqs {
			r.Done(0, core.ErrUninstalled)
		}
		return
	}
	t.requests.Add(int64(len(reqs)))
	j := t.getJobLocked(reqs)
	t.jobs[j] = struct{}{}
	if !t.mayInline(reqs) {
		t.queueLocked(j, true)
		t.mu.Unlock()
		return
	}
	// Copy on the caller's goroutine when standing grants cover the batch
	// (see copyInline). Counted in t.wg like a job, so Uninstall waits for
	// it.
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	if t.copyInline(j) {
		return
	}
	// Not covered (or closing): a waiter could not copy it either.
	t.mu.Lock()
	t.queueLocked(j, false) // legal after close: this call still holds t.wg
	t.mu.Unlock()
}

// inlineMax bounds the bytes of a batch Submit copies on the caller's
// goroutine when the caller has not promised to wait for it: a copy that
// size takes tens of microseconds, about what a job goroutine's start and
// wake-ups cost, so an asynchronous Submit still returns at once.
const inlineMax = 256 << 10

// mayInline reports whether Submit may copy reqs on the calling goroutine:
// the caller waits for them right after (CallerWaits), or they are small.
func (t *Transport) mayInline(reqs []*core.Request) bool {
	if t.hooks.noInline.Load() {
		return false
	}
	if reqs[0].CallerWaits() {
		return true
	}
	var n uint64
	for _, r := range reqs {
		if n += r.Len; n > inlineMax {
			return false
		}
	}
	return true
}

// Cancel marks the requests; a job completes those it has not copied yet
// with ErrCanceled, and stops waiting for a lease nobody needs any more.
func (t *Transport) Cancel(reqs []*core.Request) {
	set := make(map[*core.Request]struct{}, len(reqs))
	for _, r := range reqs {
		set[r] = struct{}{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for j := range t.jobs {
		hit := false
		for i, r := range j.reqs {
			if _, ok := set[r]; ok {
				j.cancel[i].Store(true)
				hit = true
			}
		}
		if hit && j.deferred {
			t.undeferLocked(j) // completes the canceled requests now, not when its waiter comes
		}
		if hit {
			select {
			case j.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Uninstall tears down in an order that never pulls memory from under a
// copy:
//
//  1. as initiator: jobs stop before their next copy step (what has not
//     been copied completes with ErrUninstalled), waiters wake, dials and
//     handshakes are cut; then it waits for the copies in progress (one
//     step each) to release their leases;
//  2. as target: the listener closes, new leases are refused (Closed),
//     standing grants are revoked (waiting for the peers' acknowledgement,
//     at most UnregisterTimeout), and it waits for peers to release the
//     leases they hold, at most until UnregisterTimeout;
//  3. it closes every connection (releasing what leases remain), which
//     unmaps every mapping and closes every received descriptor, and
//     waits for every goroutine.
func (t *Transport) Uninstall() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.closing.Store(true)
	close(t.done)
	for _, j := range t.queued {
		if j.deferred {
			t.undeferLocked(j) // before Wait below; it completes with ErrUninstalled
		}
	}
	for nc := range t.dials {
		_ = nc.Close()
	}
	for t.copying > 0 {
		t.copyIdle.Wait()
	}
	ln := t.ln
	t.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}

	if t.e != nil {
		// New leases are refused from here (Closed), so no standing grant
		// is made any more; take back those held.
		t.revokeGrants(func(*core.Region) bool { return true })
		drain := time.Now().Add(t.e.Options().UnregisterTimeout)
		for t.leases.Load() > 0 && time.Now().Before(drain) {
			time.Sleep(time.Millisecond)
		}
	}

	t.mu.Lock()
	var closers []func()
	for sc := range t.servers {
		closers = append(closers, sc.close)
	}
	for c := range t.conns {
		c := c
		closers = append(closers, func() { c.fail(status.Errorf(status.Closed, "shm transport uninstalled")) })
	}
	t.mu.Unlock()
	for _, f := range closers {
		f()
	}
	t.wg.Wait()
	t.mu.Lock()
	t.clients = map[*core.Peer]*client{}
	t.free = nil
	t.mu.Unlock()
	return nil
}

// ListenerStats reports the listener's accept loop; false before Install
// and after Uninstall.
func (t *Transport) ListenerStats() (core.ListenerStats, bool) {
	t.mu.Lock()
	ln, closed := t.ln, t.closed
	t.mu.Unlock()
	if ln == nil || closed {
		return core.ListenerStats{}, false
	}
	return ln.Stats(), true
}

// Stats reports what the transport holds; the first six, grants and
// grants_cached return to zero when it is idle (no connection) and after
// Uninstall.
func (t *Transport) Stats() map[string]int64 {
	t.mu.Lock()
	clientConns, serverConns, jobs := len(t.conns), len(t.servers), len(t.jobs)
	t.mu.Unlock()
	return map[string]int64{
		"connections":        int64(clientConns + serverConns),
		"leases":             t.leases.Load(),
		"mappings":           t.mappings.Load(),
		"fds":                t.fds.Load(),
		"goroutines":         t.goroutines.Load(),
		"jobs":               int64(jobs),
		"client_connections": int64(clientConns),
		"server_connections": int64(serverConns),
		"mapped_bytes":       t.mappedBytes.Load(),
		"bytes":              t.bytesMapped.Load() + t.bytesPVM.Load(),
		"bytes_mapped":       t.bytesMapped.Load(),
		"bytes_process_vm":   t.bytesPVM.Load(),
		"requests":           t.requests.Load(),
		"refused":            t.refused.Load(),
		"fallbacks":          t.fallbacks.Load(),
		"leases_expired":     t.expired.Load(),
		"orphan_grants":      t.orphans.Load(),
		"revoked":            t.revoked.Load(),
		"invalidated":        t.invalidated.Load(),
		"fds_received":       t.fdsReceived.Load(),
		"fds_sent":           t.fdsSent.Load(),
		"grants":             t.grantsHeld.Load(),
		"grants_cached":      t.grantsCached.Load(),
		"grant_hits":         t.grantHits.Load(),
		"copies_inline":      t.copiesInline.Load(),
		"copies_helped":      t.copiesHelped.Load(),
		"pvm_handed_off":     t.pvmHandedOff.Load(),
		"jobs_deferred":      t.jobsDeferred.Load(),
		"defer_expired":      t.deferExpiredN.Load(),
		"grant_misses":       t.grantMisses.Load(),
		"grants_revoked":     t.grantsRevoked.Load(),
		"revokes_sent":       t.revokesSent.Load(),
		"revokes_acked":      t.revokesAcked.Load(),
		"revoke_timeouts":    t.revokeTimeouts.Load(),
	}
}
