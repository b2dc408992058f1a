package cuda

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Name is the transport's name in Options.Transports, endpoints and
// attachments.
const Name = "cuda"

// streamsPerDevice is the size of the stream pool of each device.
const streamsPerDevice = 4

// Transport moves data to and from GPU memory with the CUDA driver: see
// the package documentation.
type Transport struct {
	mu        sync.Mutex
	e         *core.Engine
	d         *cu.Driver // nil: no driver, the transport is inert
	noDriver  error
	installed bool
	closed    bool
	down      atomic.Bool // closed, readable without mu
	gen       uint64      // bumped by every Install and Uninstall
	unhandle  func()      // removes our handler from the engine's listener

	runs    sync.WaitGroup // Submit goroutines
	readers sync.WaitGroup // session reader goroutines

	// initiator side
	cache    map[importKey]*entry
	sessions map[sessKey]*session
	dialing  map[net.Conn]struct{}
	peers    map[*core.Peer]peerView
	pools    map[int]*streamPool
	active   map[*core.Request]bool // requests held; true once canceled
	uuids    []string               // device uuid by ordinal
	uuidDev  map[string]int
	failed   []*cu.Mapping // releases that failed; retried by Uninstall

	// target side
	srv     *server
	exports map[uint64]*export // by allocation id

	importsTotal    atomic.Int64
	importFailures  atomic.Int64
	liveMappings    atomic.Int64
	exportsTotal    atomic.Int64
	exportFailures  atomic.Int64
	leasesTotal     atomic.Int64
	leasesDenied    atomic.Int64
	copies          atomic.Int64
	bytes           atomic.Int64
	releaseFailures atomic.Int64

	noInvalidate atomic.Bool // tests: ignore revocations and descriptor changes
	// stageHook, when set (fault injection in tests), is called at stages
	// of a batch: "leased" after the lease and imports, before any copy is
	// queued, and "queued" after the copies are queued, before waiting.
	stageHook atomic.Pointer[func(stage string)]
}

// New returns an uninstalled transport.
func New() *Transport { return &Transport{} }

func (t *Transport) Name() string { return Name }

// Install finds the CUDA driver (cuda.Default). Without one the transport
// installs inert: never eligible, no endpoint, "gpus": 0 in Stats. With
// one it starts its Unix listener, takes KindCUDA connections of the
// engine's listener, and turns on location detection. Installing again
// after Uninstall starts afresh.
func (t *Transport) Install(e *core.Engine) error {
	d, derr := driverOf(e)
	t.mu.Lock()
	if t.installed && !t.closed {
		t.mu.Unlock()
		return status.Errorf(status.InvalidArgument, "cuda transport is already installed")
	}
	t.e, t.installed, t.closed, t.d, t.noDriver, t.srv = e, true, false, nil, nil, nil
	t.down.Store(false)
	t.gen++
	t.cache = map[importKey]*entry{}
	t.sessions = map[sessKey]*session{}
	t.dialing = map[net.Conn]struct{}{}
	t.peers = map[*core.Peer]peerView{}
	t.pools = map[int]*streamPool{}
	t.active = map[*core.Request]bool{}
	t.exports = map[uint64]*export{}
	t.uuids, t.uuidDev = nil, map[string]int{} // t.failed survives: Uninstall retries it
	if derr != nil {
		t.noDriver = derr
		t.mu.Unlock()
		return nil
	}
	t.mu.Unlock()

	uuids := make([]string, d.DeviceCount())
	for i := range uuids {
		if info, err := d.Device(i); err == nil {
			uuids[i] = info.UUID
		}
	}
	// serveTCP finds no server until t.srv is set below, so connections
	// handed over before then are dropped, not served half-installed.
	unhandle, err := e.HandleConn(KindCUDA, func(c net.Conn, _ string) { t.serveTCP(c) })
	if err != nil {
		t.mu.Lock()
		t.closed = true
		t.down.Store(true)
		t.mu.Unlock()
		return err
	}
	srv, err := newServer(t, e)
	if err != nil {
		unhandle()
		t.mu.Lock()
		t.closed = true
		t.down.Store(true)
		t.mu.Unlock()
		return err
	}
	t.mu.Lock()
	t.d, t.srv, t.uuids = d, srv, uuids
	for i, u := range uuids {
		if u != "" {
			t.uuidDev[u] = i
		}
	}
	t.unhandle = unhandle
	t.mu.Unlock()
	return nil
}

// Unavailable is why the transport cannot serve here (no driver, no GPU,
// a driver too old), or "". The engine then uninstalls it and reports the
// reason in Stats().Unavailable instead of listing an inert transport.
func (t *Transport) Unavailable() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.d == nil && t.noDriver != nil {
		return t.noDriver.Error()
	}
	return ""
}

func (t *Transport) serveTCP(c net.Conn) {
	t.mu.Lock()
	srv, closed := t.srv, t.closed
	t.mu.Unlock()
	if srv != nil && !closed {
		srv.serveTCP(c)
	}
}

// Driver returns the driver in use, or nil and the reason there is none.
func (t *Transport) Driver() (*cu.Driver, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.d, t.noDriver
}

func (t *Transport) uuidOf(dev int, isCUDA bool) string {
	if !isCUDA {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if dev >= 0 && dev < len(t.uuids) {
		return t.uuids[dev]
	}
	return ""
}

// Uninstall fails the requests that have not started copying with
// core.ErrUninstalled, waits for the copies in flight, then releases every
// import (unmap, release handle, free reservation, close fd), stream,
// event, lease, connection and listener, and waits for its goroutines.
func (t *Transport) Uninstall() error {
	t.mu.Lock()
	if !t.installed || t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.down.Store(true)
	t.gen++ // no cache entry of before is valid any more
	sessions := make([]*session, 0, len(t.sessions))
	for _, s := range t.sessions {
		sessions = append(sessions, s)
	}
	for c := range t.dialing {
		c.Close()
	}
	srv := t.srv
	unhandle := t.unhandle
	t.mu.Unlock()
	if unhandle != nil {
		unhandle() // no new lease connections from the engine's listener
	}

	// Aborting the sessions wakes the batches waiting for a lease or an
	// import; they see the transport closed and fail their requests. The
	// connections stay open, and the target keeps the leases, until the
	// copies already queued are done.
	for _, s := range sessions {
		s.abort(core.ErrUninstalled)
	}
	t.runs.Wait() // every batch has synced its copies and called Done
	for _, s := range sessions {
		s.fail(core.ErrUninstalled)
	}
	t.readers.Wait()

	var errs []error
	t.mu.Lock()
	pools := t.pools
	t.pools = map[int]*streamPool{}
	ents := t.cache
	t.cache = map[importKey]*entry{}
	failed := t.failed
	t.failed = nil
	t.mu.Unlock()
	for _, p := range pools {
		for _, s := range p.streams {
			if err := s.Synchronize(); err != nil {
				errs = append(errs, err)
			}
			if err := s.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
		for _, ev := range p.events {
			if err := ev.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, ent := range ents {
		if m := ent.take(); m != nil {
			failed = append(failed, m)
		}
	}
	// Entries killed earlier but still referenced were released by their
	// last user; the ones whose release failed are retried here.
	for _, m := range failed {
		if err := t.releaseMapping(m); err != nil {
			errs = append(errs, err)
		}
	}
	if srv != nil {
		srv.close() // the sessions it serves release their leases
	}
	t.mu.Lock()
	t.sessions = map[sessKey]*session{}
	t.peers = map[*core.Peer]peerView{}
	t.active = map[*core.Request]bool{}
	t.exports = map[uint64]*export{}
	t.srv = nil
	t.mu.Unlock()
	if len(errs) > 0 {
		return status.Errorf(status.Internal, "cuda transport uninstall: %w", errors.Join(errs...))
	}
	return nil
}

// releaseMapping releases an import; a failure keeps it for a retry at
// Uninstall (Mapping.Release redoes only the steps that failed).
func (t *Transport) releaseMapping(m *cu.Mapping) error {
	if err := m.Release(); err != nil {
		t.releaseFailures.Add(1)
		t.mu.Lock()
		t.failed = append(t.failed, m)
		t.mu.Unlock()
		return err
	}
	t.liveMappings.Add(-1)
	return nil
}

// RegisterMemory records the engine's GPU allocations as exportable. (The
// engine's GPU memory has already checked locations given explicitly
// against the driver: memory/cuda's Verify.)
func (t *Transport) RegisterMemory(regions []*core.Region) error {
	t.mu.Lock()
	d := t.d
	t.mu.Unlock()
	if d == nil {
		return nil
	}
	var exs []*export
	for _, r := range regions {
		if r.Alloc == nil || !r.Loc.IsCUDA() {
			continue
		}
		rec := lookupAlloc(r.Alloc)
		if rec == nil {
			continue
		}
		ex := &export{region: r, rec: rec}
		if rec.Fabric && r.HandleShareable() {
			// The descriptor is a bearer capability: whoever reads it
			// can import the allocation read-write.
			if fh, err := rec.Mapping.ExportFabric(); err == nil {
				ex.attach = encodeFabric(r.Len, fh)
			}
		}
		exs = append(exs, ex)
	}
	t.mu.Lock()
	for _, ex := range exs {
		t.exports[ex.region.Alloc.ID] = ex
	}
	t.mu.Unlock()
	return nil
}

// UnregisterMemory forgets the exports of the regions and tells the peers
// that imported them to let go (their imports keep the memory alive).
func (t *Transport) UnregisterMemory(regions []*core.Region) error {
	t.mu.Lock()
	var gone []uint64
	for _, r := range regions {
		if r.Alloc == nil {
			continue
		}
		if ex := t.exports[r.Alloc.ID]; ex != nil && ex.region == r {
			delete(t.exports, r.Alloc.ID)
			gone = append(gone, r.Alloc.ID)
		}
	}
	srv := t.srv
	t.mu.Unlock()
	if srv != nil && len(gone) > 0 {
		srv.revoke(gone)
	}
	return nil
}

// Endpoints publishes the Unix endpoint when a driver was found.
func (t *Transport) Endpoints() []wire.Endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.srv == nil || t.closed {
		return nil
	}
	return []wire.Endpoint{{Transport: Name, Addr: t.srv.addr}}
}

// Fabric attachment: u8 version (1), u64 allocation size, 64-byte
// CUmemFabricHandle.
const fabricAttachLen = 1 + 8 + cu.FabricHandleSize

func encodeFabric(size uint64, fh cu.FabricHandle) []byte {
	b := make([]byte, fabricAttachLen)
	b[0] = 1
	binary.LittleEndian.PutUint64(b[1:], size)
	copy(b[9:], fh[:])
	return b
}

// fabricAttachment returns the fabric handle a region's descriptor
// carries, if any.
func fabricAttachment(rd *wire.RegionDesc) (cu.FabricHandle, uint64, bool) {
	for _, a := range rd.Attachments {
		if a.Transport == Name && len(a.Data) == fabricAttachLen && a.Data[0] == 1 {
			var fh cu.FabricHandle
			copy(fh[:], a.Data[9:])
			return fh, binary.LittleEndian.Uint64(a.Data[1:]), true
		}
	}
	return cu.FabricHandle{}, 0, false
}

// Attachments publishes the fabric handle of an engine GPU allocation
// that has one, for peers on other nodes of the NVLink fabric.
func (t *Transport) Attachments(r *core.Region) []wire.Attachment {
	if r.Alloc == nil || !r.Loc.IsCUDA() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ex := t.exports[r.Alloc.ID]; ex != nil && ex.region == r && ex.attach != nil {
		return []wire.Attachment{{Transport: Name, Data: ex.attach}}
	}
	return nil
}

func isCUDALoc(loc string) bool { return loc == "cuda" || strings.HasPrefix(loc, "cuda:") }

// Eligible: a driver is present, one side is GPU memory, and the peer is
// in this process, or on this host with a cuda endpoint (remote GPU
// memory the peer allocated with tent_alloc for remote read and write:
// the only memory whose handle it exports), or elsewhere on the NVLink
// fabric (a region with a fabric handle). Other remote GPU memory is left
// to transports that stage through host memory (tcp).
// ForgetsRequests: a job completes each request once (job.finish, guarded
// by done[i], removing it from active before Done) and reads a request
// only before finishing it (core.Forgetter).
func (t *Transport) ForgetsRequests() {}

// EligibleByRegion: Eligible looks only at the peer, its descriptor, the
// regions and this transport's own state (core.RegionEligible).
func (t *Transport) EligibleByRegion() {}

func (t *Transport) Eligible(r *core.Request) bool {
	if t.down.Load() {
		return false
	}
	t.mu.Lock()
	ok := t.d != nil && t.installed && !t.closed
	t.mu.Unlock()
	if !ok || r.LocalRegion == nil {
		return false
	}
	localCUDA := r.LocalRegion.Loc.IsCUDA()
	remoteCUDA := isCUDALoc(r.RemoteRegion.Location)
	if !localCUDA && !remoteCUDA {
		return false
	}
	if r.Peer != nil && r.Peer.Local() != nil {
		return true
	}
	// Another process: only GPU memory the peer allocated with tent_alloc
	// can be imported; the rest (cudaMalloc memory, host memory) is left
	// to transports that stage through host memory (tcp).
	if !remoteCUDA || r.Desc == nil {
		return false
	}
	if r.LocalRegion != nil && r.Desc.MachineID == r.LocalRegion.Engine().MachineID() && t.endpoint(r.Desc, Name) != "" {
		// Only read-write allocations are exported (an imported handle
		// grants both); the rest is left to the staging transports.
		return r.RemoteRegion.AllocID != 0 && r.RemoteRegion.Perm&wire.PermMask == wire.PermMask
	}
	_, _, fab := fabricAttachment(r.RemoteRegion)
	return fab && t.endpoint(r.Desc, wire.ControlEndpoint) != ""
}

// ListenerStats reports the same-host listener's accept loop; false while
// none runs (not installed, or no driver).
func (t *Transport) ListenerStats() (core.ListenerStats, bool) {
	t.mu.Lock()
	srv, closed := t.srv, t.closed
	t.mu.Unlock()
	if srv == nil || closed {
		return core.ListenerStats{}, false
	}
	return srv.ln.Stats(), true
}

// Stats reports what the transport holds; every count but the totals
// returns to zero after Uninstall.
func (t *Transport) Stats() map[string]int64 {
	t.mu.Lock()
	m := map[string]int64{"gpus": 0}
	if t.d != nil && !t.closed {
		m["gpus"] = int64(t.d.DeviceCount())
	}
	streams, events := 0, 0
	for _, p := range t.pools {
		streams += len(p.streams)
		events += len(p.events)
	}
	m["streams"] = int64(streams)
	m["events"] = int64(events)
	m["cached_imports"] = int64(len(t.cache))
	m["sessions"] = int64(len(t.sessions))
	m["exports"] = int64(len(t.exports))
	m["inflight"] = int64(len(t.active))
	srv := t.srv
	t.mu.Unlock()
	m["mappings"] = t.liveMappings.Load()
	if srv != nil {
		m["server_conns"] = int64(srv.connCount())
		m["leases"] = srv.leases.Load()
	} else {
		m["server_conns"], m["leases"] = 0, 0
	}
	m["imports_total"] = t.importsTotal.Load()
	m["import_failures"] = t.importFailures.Load()
	m["exports_total"] = t.exportsTotal.Load()
	m["export_failures"] = t.exportFailures.Load()
	m["leases_total"] = t.leasesTotal.Load()
	m["leases_denied"] = t.leasesDenied.Load()
	m["copies"] = t.copies.Load()
	m["bytes"] = t.bytes.Load()
	m["release_failures"] = t.releaseFailures.Load()
	return m
}
