//go:build linux

package shm

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// countSteps counts the copy steps under standing grants (the hook runs
// once per step), running also before each when it is not nil.
func countSteps(t *testing.T, tr *Transport, also func(step int32)) *atomic.Int32 {
	var n atomic.Int32
	hook := func() {
		s := n.Add(1)
		if also != nil {
			also(s)
		}
	}
	tr.hooks.inCachedCopy.Store(&hook)
	t.Cleanup(func() { tr.hooks.inCachedCopy.Store(nil) })
	return &n
}

// Requests that continue each other on both sides, with one op, through
// one mapping, are copied in one step of at most mergeMax bytes; requests
// apart, or of the other op, are steps of their own. Every byte lands
// where its request says.
func TestContiguousRequestsShareACopyStep(t *testing.T) {
	const size, count = 4096, 160 // 640 KiB: a step of mergeMax and one of the rest
	const n = size * count
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw) // mapped
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	code, err := p.one(t, core.OpRead, 0, r.Addr, n) // the read grant too
	require.Equal(t, status.OK, code, "%v", err)
	mem := host.Bytes(r.Addr, n)

	cases := []struct {
		name  string
		reqs  []core.TransferRequest
		steps int32
	}{
		{"contiguous", writes(p, r, count, size), 2},
		{"apart", apart(p, r, 4, size), 4},
		{"two ops", func() []core.TransferRequest {
			reqs := writes(p, r, 4, size)
			reqs[2].Op, reqs[3].Op = core.OpRead, core.OpRead
			return reqs
		}(), 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clear(mem)
			copy(p.local, peertest.Pattern(61, n))
			want := make([]byte, n)
			for _, q := range tc.reqs {
				if q.Op == core.OpWrite {
					copy(want[q.Remote-r.Addr:], host.Bytes(q.Local, q.Len))
				}
			}
			before, misses := p.tr.Stats()["bytes_mapped"], p.tr.Stats()["grant_misses"]
			steps := countSteps(t, p.tr, nil)
			code, _, werr := run(t, p.e, tc.reqs, core.TransferOptions{})
			require.Equal(t, status.OK, code, "%v", werr)
			require.Equal(t, tc.steps, steps.Load())
			require.Equal(t, misses, p.tr.Stats()["grant_misses"], "every step under standing grants")
			var moved uint64
			for _, q := range tc.reqs {
				moved += q.Len
				if q.Op == core.OpRead {
					require.Equal(t, mem[q.Remote-r.Addr:][:q.Len], host.Bytes(q.Local, q.Len), "read into %#x", q.Local)
				}
			}
			require.Equal(t, want[:n/2], mem[:n/2]) // the reads' remote blocks hold zeros in both
			require.EqualValues(t, moved, p.tr.Stats()["bytes_mapped"]-before)
		})
	}
}

// A request canceled before its copy ends the step the requests before
// it share: it fails Canceled, lands nothing, and the one after it is a
// step of its own.
func TestCancelEndsAMergedStep(t *testing.T) {
	const size, count = 4096, 4
	const n = size * count
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	clear(mem)
	copy(p.local, peertest.Pattern(62, n))

	release, _ := holdJobs(t, p.tr)
	p.tr.hooks.noInline.Store(true)
	t.Cleanup(func() { p.tr.hooks.noInline.Store(false) })
	steps := countSteps(t, p.tr, nil)
	b, err := p.e.Submit(writes(p, r, count, size), core.TransferOptions{})
	require.NoError(t, err)
	var reqs []*core.Request
	p.tr.mu.Lock()
	for j := range p.tr.jobs {
		reqs = append(reqs, j.reqs...)
	}
	p.tr.mu.Unlock()
	require.Len(t, reqs, count)
	p.tr.Cancel(reqs[2:3])
	_, _ = b.Wait(-1) // this goroutine copies
	st := make([]core.RequestStatus, count)
	_, done, _ := b.Status(st)
	require.Equal(t, count, done)
	p.e.ReleaseBatch(b)
	release()
	for i, want := range []status.Code{status.OK, status.OK, status.Canceled, status.OK} {
		require.Equal(t, want, st[i].Code, "request %d", i)
	}
	require.EqualValues(t, 2, steps.Load(), "requests 0 and 1 in one step, 3 in another")
	want := peertest.Pattern(62, n)
	clear(want[2*size : 3*size])
	require.Equal(t, want, mem)
	requireJobsGone(t, p.tr)
}

// A memory fault in a merged step fails only the request whose memory
// faulted, in both directions: the step's requests are copied again one
// by one.
func TestFaultInAMergedStepFailsOnlyItsRequest(t *testing.T) {
	const size, count = 4096, 4
	const n = size * count
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	code, err := p.one(t, core.OpRead, 0, r.Addr, n) // the read grant too
	require.Equal(t, status.OK, code, "%v", err)
	mem := host.Bytes(r.Addr, n)

	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	lr, err := p.e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: n}, rw)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.e.Unregister(lr))
		require.NoError(t, unix.Munmap(buf))
	})
	for _, op := range []core.Op{core.OpWrite, core.OpRead} {
		t.Run(opName(op), func(t *testing.T) {
			src, dst := buf, mem // the bytes that move, and where they land
			if op == core.OpRead {
				src, dst = mem, buf
			}
			copy(src, peertest.Pattern(63, n))
			clear(dst)
			steps := countSteps(t, p.tr, func(step int32) {
				if step == 1 { // the merged step: the third page of the caller's buffer faults
					require.NoError(t, unix.Mprotect(buf[2*size:3*size], unix.PROT_NONE))
				}
			})
			reqs := make([]core.TransferRequest, count)
			for i := range reqs {
				o := uint64(i * size)
				reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(buf) + o, Segment: p.seg, Remote: r.Addr + o, Len: size}
			}
			code, st, werr := run(t, p.e, reqs, core.TransferOptions{})
			require.NoError(t, unix.Mprotect(buf[2*size:3*size], unix.PROT_READ|unix.PROT_WRITE))
			require.Equal(t, status.TransportError, code, "%v", werr)
			require.ErrorContains(t, werr, "memory fault")
			for i, want := range []status.Code{status.OK, status.OK, status.TransportError, status.OK} {
				require.Equal(t, want, st[i].Code, "request %d", i)
			}
			require.EqualValues(t, 1+count, steps.Load(), "the merged step, then one per request")
			want := peertest.Pattern(63, n)
			require.Equal(t, want[:2*size], dst[:2*size])
			require.Equal(t, want[3*size:], dst[3*size:])
		})
	}
}

// A request the target refused in its grant is never copied, though it
// continues the one before it on both sides: it ends the merged step, and
// the request after it starts the next one.
func TestRefusedRequestEndsAMergedStep(t *testing.T) {
	const size, count = 4096, 4
	tr := &Transport{}
	remote := make([]byte, size*count)
	local := peertest.Pattern(66, size*count)
	m := &mapping{alloc: 7, base: host.Addr(remote), size: size * count, writable: true, mem: remote}
	c := &conn{t: tr, cl: &client{name: "target"}, maps: map[uint64]*mapping{7: m}, dead: make(chan struct{})}
	j := &job{t: tr, c: c, cancel: make([]atomic.Bool, count), errs: make([]error, count), stop: time.Now().Add(time.Hour)}
	for i := range count {
		o := uint64(i * size)
		j.reqs = append(j.reqs, &core.Request{Op: core.OpWrite, Local: host.Addr(local) + o, Remote: m.base + o, Len: size})
		j.grant = append(j.grant, grantEntry{code: status.OK, alloc: 7})
	}
	j.grant[2] = grantEntry{code: status.NotRegistered, msg: "unregistered"}
	j.copyAll(0, count)
	for i, want := range []status.Code{status.OK, status.OK, status.NotRegistered, status.OK} {
		require.Equal(t, want, status.CodeOf(j.errs[i]), "request %d: %v", i, j.errs[i])
	}
	want := slices.Clone(local)
	clear(want[2*size : 3*size])
	require.Equal(t, want, remote, "nothing of the refused request landed")
	require.EqualValues(t, 3*size, tr.bytesMapped.Load())
	require.Zero(t, m.refs, "the mapping's reference given back")
}

// twoSteps is four 4 KiB writes into r's first four blocks that form two
// copy steps of two requests each: requests 0 and 1 read local blocks 2
// and 3, requests 2 and 3 local blocks 0 and 1, so request 2 does not
// continue request 1.
func twoSteps(p *grantPair, r *core.Region) []core.TransferRequest {
	const size = 4096
	reqs := writes(p, r, 4, size)
	for i, l := range []int{2, 3, 0, 1} {
		reqs[i].Local = host.Addr(p.local) + uint64(l*size)
	}
	return reqs
}

// heldRequests submits reqs with the job goroutines held and nothing
// copied inline, and returns the batch and its requests as this
// transport holds them: the caller's Wait copies them. release lets the
// job goroutines go.
func heldRequests(t *testing.T, p *grantPair, reqs []core.TransferRequest) (b *core.Batch, held []*core.Request, release func()) {
	t.Helper()
	release, _ = holdJobs(t, p.tr)
	p.tr.hooks.noInline.Store(true)
	t.Cleanup(func() { p.tr.hooks.noInline.Store(false) })
	b, err := p.e.Submit(reqs, core.TransferOptions{})
	require.NoError(t, err)
	p.tr.mu.Lock()
	for j := range p.tr.jobs {
		held = append(held, j.reqs...)
	}
	p.tr.mu.Unlock()
	require.Len(t, held, len(reqs))
	return b, held, release
}

// batchCodes waits for b (this goroutine copies it), releases it and
// returns its requests' codes.
func batchCodes(t *testing.T, p *grantPair, b *core.Batch) []status.Code {
	t.Helper()
	_, _ = b.Wait(-1)
	st := make([]core.RequestStatus, b.Len())
	_, done, _ := b.Status(st)
	require.Equal(t, b.Len(), done)
	p.e.ReleaseBatch(b)
	codes := make([]status.Code, len(st))
	for i := range st {
		codes[i] = st[i].Code
	}
	return codes
}

// A cancel that comes while a merged step copies does not stop that step
// (its requests passed their checks before it, as a single request does
// before its copy) and stops the requests of the steps after it.
func TestCancelDuringAMergedStep(t *testing.T) {
	const size, n = 4096, 4 * 4096
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	clear(mem)
	copy(p.local, peertest.Pattern(64, n))

	b, reqs, release := heldRequests(t, p, twoSteps(p, r))
	steps := countSteps(t, p.tr, func(step int32) {
		if step == 1 { // requests 0 and 1 passed their checks
			p.tr.Cancel(reqs[1:3])
		}
	})
	codes := batchCodes(t, p, b)
	require.Equal(t, []status.Code{status.OK, status.OK, status.Canceled, status.OK}, codes)
	require.EqualValues(t, 2, steps.Load(), "requests 0 and 1 in one step, 3 alone")
	local := peertest.Pattern(64, n)
	want := make([]byte, n)
	copy(want[0:], local[2*size:4*size])
	copy(want[3*size:], local[size:2*size])
	require.Equal(t, want, mem, "nothing of request 2 landed")
	release()
	requireJobsGone(t, p.tr)
}

// A revoke of the standing grant while a merged step copies waits for the
// run's copy, and fails the requests of the steps after it NotRegistered:
// none of their bytes moves.
func TestRevokeDuringAMergedStep(t *testing.T) {
	const size, n = 4096, 4 * 4096
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	copy(p.local, peertest.Pattern(65, n))

	b, _, release := heldRequests(t, p, twoSteps(p, r))
	unregistered := make(chan error, 1)
	steps := countSteps(t, p.tr, func(step int32) {
		if step == 1 {
			go func() { unregistered <- p.target.Unregister(r) }()
			// The grant is dead once the initiator dropped it from its
			// cache; the revoke then waits for this run.
			require.Eventually(t, func() bool { return p.tr.Stats()["grants_cached"] == 0 }, 10*time.Second, time.Millisecond)
		}
	})
	before := p.tr.Stats()
	codes := batchCodes(t, p, b)
	require.Equal(t, []status.Code{status.OK, status.OK, status.NotRegistered, status.NotRegistered}, codes)
	require.NoError(t, <-unregistered)
	require.EqualValues(t, 1, steps.Load())
	st := p.tr.Stats()
	require.EqualValues(t, 2*size, st["bytes_mapped"]-before["bytes_mapped"], "the first step's two requests only")
	require.Equal(t, before["bytes_process_vm"], st["bytes_process_vm"])
	release()
	requireJobsGone(t, p.tr)
}
