package cuda

import (
	"runtime/debug"
	"time"

	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// hook calls the transport's stage hook, if one is set (see stageHook).
func (t *Transport) hook(stage string) {
	if h := t.stageHook.Load(); h != nil {
		(*h)(stage)
	}
}

// Submit takes the requests and moves them on a goroutine of its own.
func (t *Transport) Submit(reqs []*core.Request) {
	t.mu.Lock()
	if t.closed || !t.installed || t.d == nil {
		t.mu.Unlock()
		for _, r := range reqs {
			r.Done(0, core.ErrUninstalled)
		}
		return
	}
	for _, r := range reqs {
		t.active[r] = false
	}
	t.runs.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.runs.Done()
		t.run(reqs)
	}()
}

// Cancel marks requests canceled; those that have not started copying
// fail with status.Canceled.
func (t *Transport) Cancel(reqs []*core.Request) {
	t.mu.Lock()
	for _, r := range reqs {
		if _, ok := t.active[r]; ok {
			t.active[r] = true
		}
	}
	t.mu.Unlock()
}

// startable says why r must not start copying: the transport is being
// uninstalled, or its batch was destroyed.
func (t *Transport) startable(r *core.Request) error {
	if t.down.Load() {
		return core.ErrUninstalled
	}
	t.mu.Lock()
	canceled := t.active[r]
	t.mu.Unlock()
	if canceled {
		return status.Errorf(status.Canceled, "batch destroyed while in flight")
	}
	if time.Now().After(r.Deadline) {
		return status.Errorf(status.Timeout, "cuda: deadline passed before the copy started")
	}
	return nil
}

// job is one Submit call: the requests and which of them are done.
type job struct {
	t    *Transport
	reqs []*core.Request
	done []bool
}

func (j *job) finish(i int, n uint64, err error) {
	if j.done[i] {
		return
	}
	j.done[i] = true
	r := j.reqs[i]
	t := j.t
	t.mu.Lock()
	delete(t.active, r)
	t.mu.Unlock()
	if err == nil {
		t.copies.Add(1)
		t.bytes.Add(int64(n))
	}
	r.Done(n, err)
}

func (t *Transport) run(reqs []*core.Request) {
	j := &job{t: t, reqs: reqs, done: make([]bool, len(reqs))}
	defer func() {
		if p := recover(); p != nil {
			err := status.Errorf(status.Internal, "cuda transport panicked: %v\n%s", p, debug.Stack())
			for i := range reqs {
				func() {
					defer func() { _ = recover() }()
					j.finish(i, 0, err)
				}()
			}
		}
	}()
	// Group by peer and descriptor, keeping order.
	type gk struct {
		p *core.Peer
		d *wire.SegmentDesc
	}
	groups := map[gk][]int{}
	var order []gk
	for i, r := range reqs {
		k := gk{r.Peer, r.Desc}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	for _, k := range order {
		if target := k.p.Local(); target != nil {
			j.local(target, groups[k])
		} else {
			j.remote(k.p, k.d, groups[k])
		}
	}
}

// xfer is one copy to queue.
type xfer struct {
	i        int
	dst, src uint64
	n        uint64
	dev      int
	err      error
}

// newXfer is the copy that serves request i, r, whose remote range starts
// at address remote in this process: into local memory for a READ, out of
// it for a WRITE.
func newXfer(i int, r *core.Request, remote uint64, dev int) *xfer {
	x := &xfer{i: i, n: r.Len, dev: dev}
	if r.Op == core.OpRead {
		x.dst, x.src = r.Local, remote
	} else {
		x.dst, x.src = remote, r.Local
	}
	return x
}

// copyAll queues the copies on the streams of their devices and waits for
// them. A copy not queued because the transport is going away fails with
// core.ErrUninstalled; the queued ones are always waited for.
func (j *job) copyAll(xs []*xfer) {
	t := j.t
	type used struct {
		s  *cu.Stream
		xs []*xfer
	}
	var order []*used
	byStream := map[*cu.Stream]*used{}
	for _, x := range xs {
		r := j.reqs[x.i]
		if x.err = t.startable(r); x.err != nil {
			continue
		}
		s, err := t.stream(x.dev)
		if err != nil {
			x.err = err
			continue
		}
		if err := s.Memcpy(x.dst, x.src, x.n); err != nil {
			x.err = err
			continue
		}
		u := byStream[s]
		if u == nil {
			u = &used{s: s}
			byStream[s] = u
			order = append(order, u)
		}
		u.xs = append(u.xs, x)
	}
	t.hook("queued")
	for _, u := range order {
		deadline := j.reqs[u.xs[0].i].Deadline
		if err := t.fence(u.s, deadline); err != nil {
			for _, x := range u.xs {
				x.err = err
			}
		}
	}
}

// local serves requests to an engine of this process: the target checks
// and holds each range (Acquire), the copy engine copies, unified
// addressing tells the directions apart.
func (j *job) local(target *core.Engine, idx []int) {
	t := j.t
	type held struct {
		x      *xfer
		region *core.Region
	}
	var hs []held
	var xs []*xfer
	for _, i := range idx {
		r := j.reqs[i]
		if err := t.startable(r); err != nil {
			j.finish(i, 0, err)
			continue
		}
		access := core.AccessRemoteWrite
		if r.Op == core.OpRead {
			access = core.AccessRemoteRead
		}
		region, err := target.Acquire(r.Remote, r.Len, access)
		if err != nil {
			j.finish(i, 0, err)
			continue
		}
		x := newXfer(i, r, r.Remote, t.copyDevice(r.LocalRegion.Loc, region.Loc, ""))
		hs = append(hs, held{x, region})
		xs = append(xs, x)
	}
	if len(xs) == 0 {
		return
	}
	t.hook("leased")
	j.copyAll(xs)
	for _, h := range hs {
		target.Release(h.region)
	}
	for _, x := range xs {
		j.finish(x.i, x.n, x.err)
	}
}

// copyDevice is the device whose stream copies (and to which an import is
// made accessible): the local GPU's, else the device of the remote memory
// (its local ordinal, found by uuid for another process), else 0.
func (t *Transport) copyDevice(local, remote core.Location, remoteUUID string) int {
	if local.IsCUDA() {
		return local.Device
	}
	if remoteUUID != "" {
		t.mu.Lock()
		dev, ok := t.uuidDev[remoteUUID]
		t.mu.Unlock()
		if ok {
			return dev
		}
		return 0
	}
	if remote.IsCUDA() && remote.Device >= 0 {
		return remote.Device
	}
	return 0
}

// remote moves the requests idx to the GPU memory of another process:
// it checks what this transport can reach, leases every range from the
// target, imports (or finds) the allocations that hold them, copies, and
// releases the leases before reporting.
func (j *job) remote(p *core.Peer, desc *wire.SegmentDesc, idx []int) {
	t := j.t
	if desc == nil {
		for _, i := range idx {
			j.finish(i, 0, status.Errorf(status.Internal, "cuda: request without a descriptor"))
		}
		return
	}
	t.observe(p, desc)
	if len(idx) == 0 {
		return
	}
	sameHost := desc.MachineID == j.reqs[idx[0]].LocalRegion.Engine().MachineID() && t.endpoint(desc, Name) != ""
	todo := j.reachable(desc, idx, sameHost)
	if len(todo) == 0 {
		return
	}
	deadline := j.reqs[todo[0]].Deadline
	for _, i := range todo[1:] {
		if d := j.reqs[i].Deadline; d.Before(deadline) {
			deadline = d
		}
	}
	s, err := t.session(desc, !sameHost, deadline)
	if err != nil {
		j.failAll(todo, err)
		return
	}
	grants, leases := j.leaseAll(s, todo, deadline)
	defer func() {
		for _, id := range leases {
			s.release(id)
		}
	}()
	xs, refs := j.importAll(s, desc, todo, grants, sameHost, deadline)
	defer func() {
		for _, ent := range refs {
			t.unref(ent)
		}
	}()
	if len(xs) == 0 {
		return
	}
	t.hook("leased")
	j.copyAll(xs)
	// The copies are done: give the ranges back before reporting, so a
	// caller that unregisters at the target right after does not wait.
	for _, id := range leases {
		s.release(id)
	}
	leases = nil
	for _, x := range xs {
		j.finish(x.i, x.n, x.err)
	}
}

// failAll fails the requests is with err (ErrUninstalled once the
// transport is going down).
func (j *job) failAll(is []int, err error) {
	if j.t.down.Load() {
		err = core.ErrUninstalled
	}
	for _, i := range is {
		j.finish(i, 0, err)
	}
}

// reachable fails the requests of idx this transport cannot move to the
// peer's memory (host memory of another process, GPU memory it did not
// allocate with tent_alloc, another host without a fabric handle) and
// returns the others.
func (j *job) reachable(desc *wire.SegmentDesc, idx []int, sameHost bool) []int {
	t := j.t
	var todo []int
	for _, i := range idx {
		r := j.reqs[i]
		if err := t.startable(r); err != nil {
			j.finish(i, 0, err)
			continue
		}
		rr := r.RemoteRegion
		switch {
		case !isCUDALoc(rr.Location):
			j.finish(i, 0, status.Errorf(status.Unsupported,
				"cuda: moving GPU memory to or from host memory of another process is not supported (%s's region [%#x, %#x) is %s)",
				desc.Name, rr.Addr, rr.End(), rr.Location))
			continue
		case rr.AllocID == 0:
			j.finish(i, 0, status.Errorf(status.Unsupported,
				"cuda: %s's GPU region [%#x, %#x) was registered, not allocated by tent_alloc: only engine-allocated GPU memory (cuMemCreate) can be mapped by another process; plain cuMemAlloc/cudaMalloc memory cannot",
				desc.Name, rr.Addr, rr.End()))
			continue
		}
		if !sameHost {
			if _, _, ok := fabricAttachment(rr); !ok {
				j.finish(i, 0, status.Errorf(status.Unsupported,
					"cuda: %s is on another host and its region [%#x, %#x) has no fabric handle (multi-node NVLink)",
					desc.Name, rr.Addr, rr.End()))
				continue
			}
		}
		todo = append(todo, i)
	}
	return todo
}

// leaseAll asks the target for a lease on every range of todo (in chunks
// of maxRanges). Refused ranges fail with the target's code; the others
// get their grant. The caller releases the returned leases.
func (j *job) leaseAll(s *session, todo []int, deadline time.Time) (map[int]grant, []uint64) {
	grants := make(map[int]grant, len(todo))
	var leases []uint64
	for start := 0; start < len(todo); start += maxRanges {
		chunk := todo[start:min(start+maxRanges, len(todo))]
		ranges := make([]leaseRange, len(chunk))
		for k, i := range chunk {
			r := j.reqs[i]
			ranges[k] = leaseRange{addr: r.Remote, len: r.Len, write: r.Op == core.OpWrite}
		}
		id, gs, err := s.lease(ranges, deadline)
		if err != nil {
			j.failAll(chunk, err)
			continue
		}
		if id != 0 {
			leases = append(leases, id)
		}
		for k, i := range chunk {
			if gs[k].err != nil {
				j.finish(i, 0, gs[k].err) // the target's refusal, with its code
				continue
			}
			grants[i] = gs[k]
		}
	}
	return grants, leases
}

// importAll imports (or finds in the cache) the allocation of every
// granted request, with one reference per request that the caller drops,
// and returns the copies to run. The allocation and its extent come from
// the grant, not from the possibly stale descriptor.
func (j *job) importAll(s *session, desc *wire.SegmentDesc, todo []int, grants map[int]grant, sameHost bool,
	deadline time.Time) (xs []*xfer, refs []*entry) {
	t := j.t
	for _, i := range todo {
		g, ok := grants[i]
		if !ok {
			continue
		}
		r := j.reqs[i]
		if !g.cuda || g.alloc == 0 {
			j.finish(i, 0, status.Errorf(status.NotRegistered,
				"cuda: %s's memory at [%#x, %#x) is no longer engine-allocated GPU memory (reallocated?)",
				desc.Name, r.Remote, r.Remote+r.Len))
			continue
		}
		dev := t.copyDevice(r.LocalRegion.Loc, core.Location{}, g.uuid)
		key := importKey{inc: desc.Incarnation, alloc: g.alloc, dev: dev}
		var get func() (*cu.Mapping, error)
		if sameHost {
			get = func() (*cu.Mapping, error) { return t.importFD(s, g, dev, deadline) }
		} else {
			get = func() (*cu.Mapping, error) { return t.importFabric(desc, r.RemoteRegion, g, dev) }
		}
		ent, m, err := t.acquireEntry(key, g.base, g.size, get, deadline)
		if err != nil {
			j.failAll([]int{i}, err)
			continue
		}
		refs = append(refs, ent)
		if r.Remote < ent.base || r.Len > ent.size || r.Remote-ent.base > ent.size-r.Len {
			j.finish(i, 0, status.Errorf(status.Protocol, "cuda: [%#x, +%d) lies outside %s's allocation %d [%#x, +%d)",
				r.Remote, r.Len, desc.Name, g.alloc, ent.base, ent.size))
			continue
		}
		ptr := m.Ptr()
		if ptr == 0 {
			j.finish(i, 0, status.Errorf(status.Internal, "cuda: import of allocation %d is not mapped", g.alloc))
			continue
		}
		xs = append(xs, newXfer(i, r, ptr+(r.Remote-ent.base), dev))
	}
	return xs, refs
}

func (t *Transport) importFD(s *session, g grant, dev int, deadline time.Time) (*cu.Mapping, error) {
	fd, base, size, err := s.importFD(g.alloc, deadline)
	if err != nil {
		return nil, err
	}
	if base != g.base || size != g.size {
		closeFDs([]int{fd})
		return nil, status.Errorf(status.Protocol, "cuda: %s exported allocation %d as [%#x, +%d), leased as [%#x, +%d)",
			s.name, g.alloc, base, size, g.base, g.size)
	}
	m, err := t.d.ImportMapping(fd, size, dev)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cuda: importing %s's allocation %d: %w", s.name, g.alloc, err)
	}
	if err := m.CloseFD(); err != nil {
		_ = m.Release()
		return nil, err
	}
	return m, nil
}

// importFabric imports allocation g.alloc of a target on another node
// from the fabric handle in its descriptor.
func (t *Transport) importFabric(desc *wire.SegmentDesc, rr *wire.RegionDesc, g grant, dev int) (*cu.Mapping, error) {
	if rr.AllocID != g.alloc || rr.Addr != g.base {
		return nil, status.Errorf(status.NotRegistered,
			"cuda: %s reallocated the memory at [%#x, +%d) (allocation %d is now %d); retry with its new descriptor",
			desc.Name, rr.Addr, rr.Len, rr.AllocID, g.alloc)
	}
	fh, size, ok := fabricAttachment(rr)
	if !ok || size != g.size {
		return nil, status.Errorf(status.Protocol, "cuda: %s's fabric attachment for allocation %d does not match", desc.Name, g.alloc)
	}
	m, err := t.d.ImportFabricMapping(fh, size, dev)
	if err != nil {
		return nil, status.Errorf(status.CodeOf(err), "cuda: importing %s's allocation %d (fabric): %w", desc.Name, g.alloc, err)
	}
	return m, nil
}
