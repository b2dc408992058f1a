//go:build linux

package shm

import (
	"sync/atomic"
	"testing"

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
// faulted: the step's requests are copied again one by one.
func TestFaultInAMergedStepFailsOnlyItsRequest(t *testing.T) {
	const size, count = 4096, 4
	const n = size * count
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw)
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	clear(mem)

	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	copy(buf, peertest.Pattern(63, n))
	lr, err := p.e.Register(core.RegionDesc{Addr: host.Addr(buf), Len: n}, rw)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.e.Unregister(lr))
		require.NoError(t, unix.Munmap(buf))
	})
	steps := countSteps(t, p.tr, func(step int32) {
		if step == 1 { // the merged step: its third page faults
			require.NoError(t, unix.Mprotect(buf[2*size:3*size], unix.PROT_NONE))
		}
	})
	reqs := make([]core.TransferRequest, count)
	for i := range reqs {
		o := uint64(i * size)
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(buf) + o, Segment: p.seg, Remote: r.Addr + o, Len: size}
	}
	code, st, werr := run(t, p.e, reqs, core.TransferOptions{})
	require.Equal(t, status.TransportError, code, "%v", werr)
	require.ErrorContains(t, werr, "memory fault")
	for i, want := range []status.Code{status.OK, status.OK, status.TransportError, status.OK} {
		require.Equal(t, want, st[i].Code, "request %d", i)
	}
	require.EqualValues(t, 1+count, steps.Load(), "the merged step, then one per request")
	want := peertest.Pattern(63, n)
	require.Equal(t, want[:2*size], mem[:2*size])
	require.Equal(t, want[3*size:], mem[3*size:])
}
