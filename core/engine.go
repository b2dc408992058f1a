package core

import (
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/internal/netaddr"
	"github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Options configure an engine. The zero value means defaults.
type Options struct {
	// Name is the segment name peers use to open this engine. Empty means
	// the listener's "host:port".
	Name string
	// ListenAddr is where the engine accepts peers; default "127.0.0.1:0".
	ListenAddr string
	// Metadata is the directory's URL, "p2p" (default) or
	// "etcd://host:port[,host:port...]": what Directory opens, and what
	// logs and stats show.
	Metadata       string
	MetadataPrefix string
	// Directory opens the engine's directory (etcd.Open, ...); nil means
	// the p2p directory, which needs no service.
	Directory DirectoryFactory
	// Available is the transports this engine may install, each declared
	// by its package's spec (tcp.Spec(...)): name, id, rank, channel kinds
	// and the transport's own options. An engine is built with no
	// transport it is not given here.
	Available []TransportSpec
	// Transports names the ones to install, in preference order; nil means
	// all of Available in rank order.
	Transports []string
	// Secret, when set, is required of every peer (HMAC challenge-response).
	Secret []byte
	// DefaultTimeout bounds every request without its own deadline.
	DefaultTimeout time.Duration
	// UnregisterTimeout bounds how long unregistering waits for transfers.
	UnregisterTimeout time.Duration
	// MaxUnauthenticated bounds, per listener (the engine's and each
	// transport's), the connections between accept and the end of their
	// handshake; past it the oldest of them is closed. Default 64.
	MaxUnauthenticated int
	// MaxConnsPerPeer and MaxConns bound, per listener, the connections
	// one peer (a remote IP; a process on the shm and cuda sockets) and
	// all peers together hold open; past either a new connection is
	// closed at accept. Defaults 256 and 4096: a peer engine uses a
	// handful (tcp 4 data connections, one control, one per other
	// transport), so the defaults leave room for many engines per host.
	MaxConnsPerPeer, MaxConns int
	// HandshakeTimeout bounds how long an accepted connection may take to
	// finish its handshake. Default 10 s.
	HandshakeTimeout time.Duration
	// Logger receives the engine's and its transports' log lines; nil
	// discards them. Nothing is logged per request at Info or above.
	Logger *slog.Logger
	// Memory lists the kinds of memory the engine can register, detect,
	// allocate and stage besides host memory, which it always has (e.g.
	// memory/cuda's GPU memory). Nil means host memory only.
	Memory []memory.Kind
	// LocalPeers is the set of engines this one reaches directly, without
	// the network, and that reach it so; nil means a set of its own.
	LocalPeers *LocalPeers
}

const (
	DefaultTimeout           = 30 * time.Second
	DefaultUnregisterTimeout = 5 * time.Second
)

func (o *Options) withDefaults() Options {
	c := *o
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.Metadata == "" {
		c.Metadata = "p2p"
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	if c.UnregisterTimeout <= 0 {
		c.UnregisterTimeout = DefaultUnregisterTimeout
	}
	if c.MaxUnauthenticated <= 0 {
		c.MaxUnauthenticated = acceptloop.DefaultMaxUnauthenticated
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = acceptloop.DefaultHandshakeTimeout
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = acceptloop.DefaultMaxConnsPerPeer
	}
	if c.MaxConns <= 0 {
		c.MaxConns = acceptloop.DefaultMaxConns
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LocalPeers == nil {
		c.LocalPeers = NewLocalPeers()
	}
	return c
}

// Engine registers memory and moves it. All methods are safe for concurrent
// use. Close releases everything; afterwards every method fails with
// ErrClosed.
type Engine struct {
	opts          Options
	available     *transportSet
	name          string
	incarnation   uint64
	ln            *listener
	dir           Directory
	scope         string // dir's scope: where engines of this process find e by name
	byAddress     bool   // ... and by listen address
	localPeers    *LocalPeers
	notes         *notifyQueue
	senders       senderGate   // holds a notification to its connection's name
	links         *links       // control links to peers
	subscribers   *subscribers // served control connections told of changes
	mem           *memory.Layer
	machine       string       // MachineID, read once at creation
	duplicateDone atomic.Int64 // completions reported twice (transport bugs)
	slabs         slabs        // Request values of released batches, for reuse
	log           *slog.Logger // Options.Logger with the engine's name
	// acquiredHook, nil outside tests, runs in Submit right after request
	// i took its local region from Acquire (a test starts an unregister
	// there, while the request's run owes its uses).
	acquiredHook atomic.Pointer[func(i int)]

	mu          sync.Mutex
	closed      bool
	index       *index
	regions     map[*Region]struct{}
	transports  []*installed
	moversCache atomic.Pointer[[]*installed] // the Movers of transports, rebuilt on change
	generation  uint64
	watchers    []func()
	peers       map[string]*Peer
	segments    map[*Segment]struct{}
	batches     map[*Batch]struct{}
	inflight    int64
	allocs      map[*Allocation]struct{}
	nextAlloc   uint64
	installing  map[string]bool // names reserved by Installs in progress
	draining    sync.WaitGroup  // Uninstalls still tearing transports down

	descMu    sync.Mutex
	descGen   uint64
	descCache *wire.SegmentDesc

	unavailable map[string]string // transports that installed but cannot serve here: why

	descBytes []byte
}

// New creates an engine and installs its transports. If one fails to
// install, those already installed are uninstalled and the error returned.
func New(o Options) (*Engine, error) {
	opts := o.withDefaults()
	if err := checkListenAddr(opts); err != nil {
		return nil, err
	}
	mem, err := newMemoryLayer(opts.Memory)
	if err != nil {
		return nil, err
	}
	available, err := newTransportSet(opts.Available)
	if err != nil {
		return nil, err
	}
	if opts.Transports == nil {
		opts.Transports = available.names()
	}
	e := &Engine{
		opts: opts, index: newIndex(), regions: map[*Region]struct{}{},
		notes: newNotifyQueue(), peers: map[string]*Peer{}, segments: map[*Segment]struct{}{},
		batches: map[*Batch]struct{}{}, links: newLinks(), subscribers: newSubscribers(),
		allocs:     map[*Allocation]struct{}{},
		installing: map[string]bool{}, mem: mem, localPeers: opts.LocalPeers, machine: readMachineID(), available: available,
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	e.incarnation = binary.LittleEndian.Uint64(seed[:]) | 1
	e.log = opts.Logger // until the name is known (the engine's listener logs through it)
	ln, err := newListener(opts.ListenAddr, e.ListenerConfig("engine", false), opts.Secret)
	if err != nil {
		return nil, err
	}
	e.ln = ln
	e.name = opts.Name
	if e.name == "" {
		e.name = ln.addr()
	}
	e.log = opts.Logger.With("engine", e.name)
	ln.setName(e.name)
	ln.setLogger(e.log)
	ln.handle(KindControl, e.serveControl)
	if err := e.installAll(); err != nil {
		ln.close()
		return nil, err
	}
	dir, err := openDirectory(e)
	if err != nil {
		e.uninstallAll()
		ln.close()
		return nil, err
	}
	e.dir = dir
	e.scope, e.byAddress = dir.Scope()
	ln.start()
	// Published first: a directory that refuses the name (etcd, when
	// another engine holds it) fails creation before this process's
	// engines can reach this one by it.
	if err := e.publish(); err != nil {
		_ = e.Close()
		return nil, err
	}
	if err := e.localPeers.add(e); err != nil {
		_ = e.Close()
		return nil, err
	}
	attrs := []any{"listen", ln.addr(), "metadata", opts.Metadata, "transports", transportNames(e.Transports())}
	if un := e.Unavailable(); len(un) > 0 {
		attrs = append(attrs, "unavailable", un)
	}
	e.log.Info("engine created", attrs...)
	return e, nil
}

func transportNames(ts []Transport) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name()
	}
	return out
}

// checkListenAddr checks the form of the listen address and the length of
// the name. It puts no limit on where an engine listens: an engine stays on
// loopback unless asked otherwise because the default address is
// "127.0.0.1:0" (withDefaults); an explicit address, a public one too, is
// the caller's decision.
func checkListenAddr(o Options) error {
	if strings.TrimSpace(o.ListenAddr) == "" {
		return status.Errorf(status.InvalidArgument, "empty listen address")
	}
	if err := netaddr.CheckListen(o.ListenAddr); err != nil {
		return status.Errorf(status.InvalidArgument, "listen address %q: %v", o.ListenAddr, err)
	}
	if len(o.Name) > wire.MaxNameLen {
		return status.Errorf(status.InvalidArgument, "engine name of %d bytes exceeds %d", len(o.Name), wire.MaxNameLen)
	}
	return nil
}

func (e *Engine) installAll() error {
	opts := e.opts
	seen := map[string]bool{}
	for _, name := range opts.Transports {
		if seen[name] {
			e.uninstallAll()
			return status.Errorf(status.InvalidArgument, "transport %q listed twice", name)
		}
		seen[name] = true
		spec, ok := e.available.lookup(name)
		if !ok {
			e.uninstallAll()
			return status.Errorf(status.NotFound, "unknown transport %q (available: %v)", name, e.available.names())
		}
		if err := e.Install(spec.New()); err != nil {
			e.uninstallAll()
			return err
		}
	}
	return nil
}

// Name is the engine's segment name.
func (e *Engine) Name() string { return e.name }

// Incarnation is random per engine; a restarted peer has a new one.
func (e *Engine) Incarnation() uint64 { return e.incarnation }

// Options returns the engine's options with defaults filled in.
func (e *Engine) Options() Options { return e.opts }

// Logger is where the engine and its transports log (Options.Logger, with
// the engine's name attached). Transports take it at Install. Per-request
// lines belong at Debug, behind Enabled, so a disabled logger costs the
// transfer path nothing.
func (e *Engine) Logger() *slog.Logger { return e.log }

// Install adds a transport to a running engine. Memory registered before is
// not offered to it; install transports before registering. Its id and
// channel kinds are those of the spec of its name in Options.Available; a
// transport without one reports TransportNone and may serve no channel
// kind.
func (e *Engine) Install(t Transport) error {
	name := t.Name()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return status.Errorf(status.Closed, "engine is closed")
	}
	// The name is reserved under the lock before the transport is called, so
	// two concurrent Installs of one name cannot both pass the check.
	taken := e.installing[name]
	for _, in := range e.transports {
		taken = taken || in.t.Name() == name
	}
	if taken {
		e.mu.Unlock()
		return status.Errorf(status.InvalidArgument, "transport %q already installed", name)
	}
	e.installing[name] = true
	e.mu.Unlock()

	err := safeCall(name+" install", func() error { return t.Install(e) })
	e.mu.Lock()
	delete(e.installing, name)
	if err == nil && e.closed {
		e.mu.Unlock()
		_ = safeCall(name+" uninstall", t.Uninstall) // never under e.mu: it may wait for users of it
		return status.Errorf(status.Closed, "engine closed during install")
	}
	if err == nil {
		if why := unavailable(t); why != "" {
			// Installed, but it could never serve a request here: it stays
			// out of Transports and the descriptor, and Stats says why.
			if e.unavailable == nil {
				e.unavailable = map[string]string{}
			}
			e.unavailable[name] = why
			e.mu.Unlock()
			_ = safeCall(name+" uninstall", t.Uninstall)
			e.log.Info("transport unavailable", "transport", name, "reason", why)
			return nil
		}
		delete(e.unavailable, name)
		spec, _ := e.available.lookup(name)
		_, forgets := t.(Forgetter)
		_, byRegion := t.(RegionEligible)
		e.transports = append(e.transports, &installed{t: t, id: spec.ID, forgets: forgets, byRegion: byRegion})
		e.refreshMovers()
		e.generation++ // the descriptor lists a new endpoint
	}
	e.mu.Unlock()
	if err == nil {
		e.log.Debug("transport installed", "transport", name)
		e.notifyChange()
	} else {
		e.log.Warn("transport failed to install", "transport", name, "err", err)
	}
	return err
}

// unavailable asks a transport that implements Availability why it cannot
// serve; "" means it can (and is what every other transport gets).
func unavailable(t Transport) string {
	a, ok := t.(Availability)
	if !ok {
		return ""
	}
	var why string
	if err := safeCall(t.Name()+" availability", func() error { why = a.Unavailable(); return nil }); err != nil {
		return err.Error()
	}
	return why
}

// Unavailable maps each transport that was asked for but cannot serve on
// this machine (cuda without a driver or a GPU) to the reason.
func (e *Engine) Unavailable() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]string, len(e.unavailable))
	for k, v := range e.unavailable {
		out[k] = v
	}
	return out
}

// refreshMovers rebuilds the list the transfer path reads without the
// engine lock. Call with e.mu held.
func (e *Engine) refreshMovers() {
	ms := make([]*installed, 0, len(e.transports))
	for _, in := range e.transports {
		if _, ok := in.t.(Mover); ok {
			ms = append(ms, in)
		}
	}
	e.moversCache.Store(&ms)
}

// Available lists the names of the transports this engine may install
// (Options.Available), in rank order.
func (e *Engine) Available() []string { return e.available.names() }

// TransportID is the id of the named transport in request statuses, or
// TransportNone if the engine has no spec of that name.
func (e *Engine) TransportID(name string) uint32 {
	spec, _ := e.available.lookup(name)
	return spec.ID
}

// Transports lists the installed transports in preference order.
func (e *Engine) Transports() []Transport {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Transport, len(e.transports))
	for i, in := range e.transports {
		out[i] = in.t
	}
	return out
}

// Uninstall removes the named transport, or every transport when name is
// empty, after the calls inside it have returned; the transport then
// releases everything it holds. Uninstalling an unknown or already
// uninstalled transport fails with ErrNotFound.
func (e *Engine) Uninstall(name string) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return status.Errorf(status.Closed, "engine is closed")
	}
	var victims []*installed
	kept := e.transports[:0:0]
	for _, in := range e.transports {
		if name == "" || in.t.Name() == name {
			victims = append(victims, in)
		} else {
			kept = append(kept, in)
		}
	}
	if name != "" && len(victims) == 0 {
		e.mu.Unlock()
		return status.Errorf(status.NotFound, "transport %q is not installed", name)
	}
	e.transports = kept
	e.refreshMovers()
	e.generation++ // the descriptor no longer lists it
	// Close waits for this teardown too: it may still hold memory.
	e.draining.Add(1)
	e.mu.Unlock()
	defer e.draining.Done()
	e.notifyChange()
	return e.uninstall(victims)
}

func (e *Engine) uninstall(victims []*installed) error {
	var first error
	for i := len(victims) - 1; i >= 0; i-- {
		in := victims[i]
		if !in.gate.close() {
			continue
		}
		err := safeCall(in.t.Name()+" uninstall", in.t.Uninstall)
		if err != nil {
			e.log.Warn("transport uninstall failed", "transport", in.t.Name(), "err", err)
			if first == nil {
				first = err
			}
		} else {
			e.log.Debug("transport uninstalled", "transport", in.t.Name())
		}
	}
	return first
}

func (e *Engine) uninstallAll() {
	e.mu.Lock()
	victims := e.transports
	e.transports = nil
	e.refreshMovers()
	e.mu.Unlock()
	_ = e.uninstall(victims)
}

// Close uninstalls every transport (which completes the requests they
// hold, with ErrClosed), fails requests never handed to a transport, waits
// (up to Options.UnregisterTimeout) until no transfer of this or another
// engine uses this engine's memory, then drops every region, segment and
// connection and frees allocations. An allocation still in use at that
// point is left mapped, and Close reports ErrBusy: unmapping it under a
// running copy could corrupt whatever the address is reused for. Closing
// twice returns ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return status.Errorf(status.Closed, "engine is already closed")
	}
	e.closed = true
	e.links.refuse()
	victims := e.transports
	e.transports = nil
	e.refreshMovers()
	batches := make([]*Batch, 0, len(e.batches))
	for b := range e.batches {
		batches = append(batches, b)
	}
	regions := make([]*Region, 0, len(e.regions))
	for r := range e.regions {
		r.closing.Store(true) // no new transfer may start on it
		regions = append(regions, r)
	}
	e.mu.Unlock()

	e.localPeers.remove(e)
	_ = e.dir.Close()
	e.log.Debug("engine closing", "batches", len(batches), "regions", len(regions))
	// Movers first: a batch becomes final only once they let go of it.
	err := e.uninstall(victims)
	e.draining.Wait()
	for _, b := range batches {
		b.expire(status.Closed, "engine destroyed while the batch was in flight")
	}
	e.ln.close()
	e.notes.close()

	// Peers (another engine of this process, a tcp handler) may still be
	// copying into or out of this engine's regions.
	busy := map[*Region]bool{}
	deadline := time.Now().Add(e.opts.UnregisterTimeout)
	for _, r := range regions {
		for r.users.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if r.users.Load() > 0 {
			busy[r] = true
		}
	}

	e.mu.Lock()
	for _, r := range regions {
		if _, ok := e.regions[r]; ok {
			e.index.remove(r.span)
			delete(e.regions, r)
		}
	}
	allocs := e.allocs
	e.allocs = map[*Allocation]struct{}{}
	e.segments = map[*Segment]struct{}{}
	e.peers = map[string]*Peer{}
	e.mu.Unlock()
	e.links.closeAll()
	e.slabs.drop()
	for a := range allocs {
		if inUse(busy, a) {
			continue
		}
		if ferr := a.release(); ferr != nil && err == nil {
			err = ferr
		}
	}
	e.links.wait()
	if len(busy) > 0 && err == nil {
		err = status.Errorf(status.Busy,
			"engine closed, but %d region(s) were still used by transfers after %v; their allocations stay mapped",
			len(busy), e.opts.UnregisterTimeout)
	}
	if err != nil {
		e.log.Warn("engine closed with an error", "err", err)
	} else {
		e.log.Info("engine closed")
	}
	return err
}

func inUse(busy map[*Region]bool, a *Allocation) bool {
	for r := range busy {
		if r.Alloc == a {
			return true
		}
	}
	return false
}

// Closed reports whether Close has been called.
func (e *Engine) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Generation increases with every registration change.
func (e *Engine) Generation() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.generation
}

// Watch calls f (without engine locks held) after every registration change.
func (e *Engine) Watch(f func()) {
	e.mu.Lock()
	e.watchers = append(e.watchers, f)
	e.mu.Unlock()
}

func (e *Engine) notifyChange() {
	e.mu.Lock()
	ws := e.watchers
	e.mu.Unlock()
	for _, f := range ws {
		f()
	}
	e.subscribers.wake()
	// Waits until a directory that stores descriptors holds the change,
	// within its bound; past it the directory goes on in the background
	// and the change stands (see Publisher).
	_ = e.publish()
}

// Regions returns a snapshot of the registered regions, ordered by address.
func (e *Engine) Regions() []*Region {
	e.mu.Lock()
	out := make([]*Region, 0, len(e.regions))
	for r := range e.regions {
		out = append(out, r)
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// Stats counts what an engine holds; leak checks compare it to a baseline.
type Stats struct {
	Regions          int
	RegisteredBytes  uint64
	Reservations     int
	Segments         int
	Batches          int
	RequestsInFlight int64
	Allocations      int
	Peers            int
	ControlLinks     int
	Connections      int // accepted connections being served
	Notifications    int // received, not yet taken
	Transports       map[string]map[string]int64
	// Metadata is the directory's counters (nil for p2p, which keeps none).
	Metadata map[string]int64
	// Listeners counts, for the engine's listener ("engine") and each
	// installed transport with a listener of its own, what its accept loop
	// has seen: accept errors, handshakes, evictions, timeouts.
	Listeners map[string]ListenerStats
	// Unavailable: transports asked for that cannot serve here, and why.
	Unavailable map[string]string
	// DuplicateCompletions counts requests a transport reported done twice
	// for one attempt (a transport bug; the second report is ignored).
	DuplicateCompletions int64
	// NotifySenderRefused counts notifications refused because the sender
	// they named was not the one their connection's handshake gave.
	NotifySenderRefused int64
}

// Stats returns the engine's current counts.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	s := Stats{
		Regions:          e.index.committed,
		RegisteredBytes:  e.index.bytes,
		Reservations:     e.index.reserved,
		Segments:         len(e.segments),
		Batches:          len(e.batches),
		RequestsInFlight: e.inflight,
		Allocations:      len(e.allocs),
		Peers:            len(e.peers),
		ControlLinks:     e.links.len(),
		Transports:       map[string]map[string]int64{},
		Listeners:        map[string]ListenerStats{},

		DuplicateCompletions: e.duplicateDone.Load(),
		NotifySenderRefused:  e.senders.refused.Load(),
	}
	ts := e.transports
	s.Unavailable = make(map[string]string, len(e.unavailable))
	for k, v := range e.unavailable {
		s.Unavailable[k] = v
	}
	e.mu.Unlock()
	if ds, ok := e.dir.(DirectoryStats); ok {
		s.Metadata = ds.Stats()
	}
	s.Connections = e.ln.connCount()
	s.Listeners["engine"] = e.ln.stats()
	s.Notifications = e.notes.len()
	for _, in := range ts {
		if in.gate.enter() {
			var st map[string]int64
			_ = safeCall(in.t.Name()+" stats", func() error {
				st = in.t.Stats()
				if lr, ok := in.t.(ListenerReporter); ok {
					if ls, ok := lr.ListenerStats(); ok {
						s.Listeners[in.t.Name()] = ls
					}
				}
				return nil
			})
			in.gate.exit()
			s.Transports[in.t.Name()] = st
		}
	}
	return s
}

// checkIndex verifies the index invariants (for tests).
func (e *Engine) checkIndex() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.index.check()
}
