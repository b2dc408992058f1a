//go:build linux

package shm

import (
	"bytes"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// splitInto cuts a process_vm call in two halves of equal bytes (the odd
// byte in the second), cutting the iovec that straddles the middle; the
// two halves cover exactly the original ranges, in order, with the owners
// of the pieces they came from.
func TestSplitInto(t *testing.T) {
	mem := make([]byte, 1<<16)
	base := uintptr(unsafe.Pointer(&mem[0]))
	for _, lens := range [][]int{{1, 1}, {2}, {3}, {100, 1}, {1, 100}, {10, 10, 10, 10}, {7, 9, 13, 1, 1, 40}, {4096}} {
		var b, h pvmBatch
		var off int
		for i, l := range lens {
			var lv unix.Iovec
			lv.Base = &mem[off]
			lv.SetLen(l)
			b.local = append(b.local, lv)
			b.remote = append(b.remote, unix.RemoteIovec{Base: 0x10000 + uintptr(off), Len: l})
			b.owner = append(b.owner, int32(i))
			b.last = append(b.last, int32(i))
			b.bytes += uint64(l)
			off += l
		}
		total := b.bytes
		b.splitInto(&h)
		require.Equal(t, total/2, b.bytes, "%v", lens)
		require.Equal(t, total-total/2, h.bytes, "%v", lens)

		// Walk both halves: contiguous pieces from offset 0 to the end,
		// each owned by the iovec it came from.
		pos := 0
		for _, half := range []*pvmBatch{&b, &h} {
			sum := 0
			require.Len(t, half.remote, len(half.local))
			require.Len(t, half.owner, len(half.local))
			for k := range half.local {
				l := int(half.local[k].Len)
				require.Positive(t, l)
				require.Equal(t, base+uintptr(pos), uintptr(unsafe.Pointer(half.local[k].Base)), "%v", lens)
				require.Equal(t, 0x10000+uintptr(pos), half.remote[k].Base)
				require.Equal(t, l, half.remote[k].Len)
				owner, start := 0, 0
				for owner < len(lens) && start+lens[owner] <= pos {
					start += lens[owner]
					owner++
				}
				require.EqualValues(t, owner, half.owner[k], "%v: piece at %d", lens, pos)
				require.LessOrEqual(t, pos+l, start+lens[owner], "a piece stays inside its iovec")
				pos += l
				sum += l
			}
			require.EqualValues(t, half.bytes, sum)
		}
		require.Equal(t, off, pos)
	}
}

// A process_vm call split over two threads where one half fails: the
// requests of that half fail with TransportError, those of the other half
// complete with their data, and the failure counts once.
func TestSplitHalfFails(t *testing.T) {
	const (
		n    = 128
		blk  = 16 << 10 // 2 MiB in all: split in two halves of 64 requests
		size = n * blk
	)
	require.GreaterOrEqual(t, uint64(size), pvmSplitMin)
	peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw})
	e, tr := newEngine(t, core.Options{})
	seg := openSeg(t, e, peer.Name)
	local := localBuf(t, e, size)
	reqs := make([]core.TransferRequest, n)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpRead, Local: host.Addr(local) + uint64(i*blk), Segment: seg,
			Remote: peer.Buffers[0].Addr + uint64(i*blk), Len: blk}
	}
	code, _, err := run(t, e, reqs, core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", err)
	model := bytes.Clone(local)
	require.Equal(t, sum(t, peer, 0), peertest.Sum(model))

	var calls atomic.Int32
	hook := func(core.Op) error {
		if calls.Add(1) == 1 {
			return unix.EIO
		}
		return nil
	}
	tr.hooks.processVM.Store(&hook)
	clear(local)
	code, st, _ := run(t, e, reqs, core.TransferOptions{})
	require.Equal(t, status.TransportError, code)
	require.EqualValues(t, 2, calls.Load(), "two halves, one call each")
	failed := 0
	for i, s := range st {
		if s.Code != status.OK {
			require.Equal(t, status.TransportError, s.Code, "request %d", i)
			failed++
			continue
		}
		require.Equal(t, model[i*blk:(i+1)*blk], local[i*blk:(i+1)*blk], "request %d", i)
	}
	require.Equal(t, n/2, failed)
	require.True(t, st[0].Code != st[n-1].Code, "one half failed, the other did not")
	require.Zero(t, tr.Stats()["fallbacks"], "EIO is not a refusal")
}

// Consecutive requests of one direction that are contiguous on both sides
// share one process_vm iovec; a gap on either side, a request of the other
// direction between them, or the end of a call starts a new one. After a
// partial transfer of a shared iovec, only the requests whose bytes were
// not copied fail.
func TestPVMMergesContiguousRequests(t *testing.T) {
	const blk = 4 << 10
	mem := make([]byte, 8*blk)
	base := host.Addr(mem)
	at := func(op core.Op, l, r uint64) *core.Request {
		return &core.Request{Op: op, Local: base + l*blk, Remote: 0x100000 + r*blk, Len: blk}
	}
	j := &job{reqs: []*core.Request{
		at(core.OpWrite, 0, 0),
		at(core.OpWrite, 1, 1), // continues 0
		at(core.OpWrite, 2, 3), // remote gap
		at(core.OpWrite, 4, 4), // local gap
		at(core.OpRead, 5, 5),  // the other direction
		at(core.OpWrite, 6, 6), // contiguous, but not after request 3
		at(core.OpWrite, 7, 7), // continues 5
	}}
	j.errs = make([]error, len(j.reqs))
	for i := range j.reqs {
		j.addPVM(i)
	}
	w, r := &j.pv[core.OpWrite], &j.pv[core.OpRead]
	require.Equal(t, []int32{0, 2, 3, 5}, w.owner)
	require.Equal(t, []int32{1, 2, 3, 6}, w.last)
	require.Equal(t, []int32{4}, r.owner)
	require.EqualValues(t, 2*blk, w.local[0].Len)
	require.EqualValues(t, 2*blk, w.remote[0].Len)
	require.EqualValues(t, 6*blk, w.bytes)
	for k := range w.local {
		require.Equal(t, uintptr(j.reqs[w.owner[k]].Local), uintptr(unsafe.Pointer(w.local[k].Base)))
		require.Equal(t, uintptr(j.reqs[w.owner[k]].Remote), w.remote[k].Base)
	}

	// The kernel copied request 0 and one byte of request 1, then failed.
	w.local[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(w.local[0].Base), blk+1))
	w.local[0].SetLen(blk - 1)
	w.remote[0].Base += blk + 1
	w.remote[0].Len = blk - 1
	boom := status.Errorf(status.TransportError, "boom")
	j.failFrom(w, 0, boom)
	require.NoError(t, j.errs[0], "copied in full")
	for _, i := range []int{1, 2, 3, 5, 6} {
		require.ErrorIs(t, j.errs[i], boom, "request %d", i)
	}
	require.NoError(t, j.errs[4], "the other direction")
}

// One mapping reference serves the requests of a run into one
// allocation, but a mapping dropped between two of them is not used for
// the next: that request goes through process_vm, the dropped mapping is
// unmapped once the reference is given back, and every byte lands once.
func TestMappingDroppedMidRun(t *testing.T) {
	const n = 8192
	p := newGrantPair(t, core.Options{}, n)
	r, err := p.target.Alloc(n, "", rw) // mapped
	require.NoError(t, err)
	base := map[string]int64{}
	primeGrant(t, p, r, n, base)
	mem := host.Bytes(r.Addr, n)
	require.EqualValues(t, 1, p.tr.Stats()["mappings"])
	before := p.tr.Stats()

	var calls atomic.Int32
	hook := func() {
		if calls.Add(1) != 1 {
			return
		}
		// Past the first request's checks: drop the mapping as a revoke
		// would, while this copy holds its reference.
		p.tr.mu.Lock()
		for c := range p.tr.conns {
			c.mu.Lock()
			for _, m := range c.maps {
				c.dropLocked(m)
			}
			c.mu.Unlock()
		}
		p.tr.mu.Unlock()
		require.EqualValues(t, 1, p.tr.Stats()["mappings"], "not unmapped under the copy")
	}
	p.tr.hooks.inCachedCopy.Store(&hook)
	defer p.tr.hooks.inCachedCopy.Store(nil)
	copy(p.local, peertest.Pattern(51, n))
	code, _, werr := run(t, p.e, apart(p, r, 2, n/2), core.TransferOptions{})
	require.Equal(t, status.OK, code, "%v", werr)
	want := peertest.Pattern(51, n)
	require.True(t, bytes.Equal(want[n/2:], mem[:n/2]))
	require.True(t, bytes.Equal(want[:n/2], mem[n/2:]))
	st := p.tr.Stats()
	require.EqualValues(t, n/2, st["bytes_mapped"]-before["bytes_mapped"], "the first request through the mapping")
	require.EqualValues(t, n/2, st["bytes_process_vm"]-before["bytes_process_vm"], "the second one not")
	require.Zero(t, st["mappings"], "unmapped when the copy gave its reference back")
}
