//go:build linux

package shm

import (
	"bytes"
	"crypto/rand"
	"fmt"
	mrand "math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// span is one request of a test batch: buffer buf of the peer at remote,
// the local buffer at local.
type span struct {
	buf           int
	op            core.Op
	local, remote uint64
	n             uint64
}

// slots places n spans in disjoint slots on both sides, at unaligned
// offsets, with lengths in [1, maxLen]; local slots are shuffled.
func slots(rng *mrand.Rand, n int, size, maxLen uint64, bufs []int, ops []core.Op) []span {
	slot := size / uint64(n)
	perm := rng.Perm(n)
	out := make([]span, n)
	for i := range out {
		roff := uint64(rng.Intn(64))
		loff := uint64(rng.Intn(64))
		ln := 1 + uint64(rng.Int63n(int64(min(maxLen, slot-64))))
		out[i] = span{
			buf: bufs[i%len(bufs)], op: ops[(i/len(bufs))%len(ops)],
			local: uint64(perm[i])*slot + loff, remote: uint64(i)*slot + roff, n: ln,
		}
	}
	return out
}

// Two processes, both copy paths (the peer's memfd allocation mapped here,
// and its Go heap through process_vm), READ and WRITE, batches of 1 to
// 1024, lengths of 1 byte to 64 MiB, unaligned on both sides; every byte
// checked (WRITE by the peer's sha256, READ against the known content).
func TestTransferMatrix(t *testing.T) {
	const size = 64<<20 + 8192
	peer := startPeer(t, peertest.Buffer{Size: size, Perm: rw, Alloc: true}, peertest.Buffer{Size: size, Perm: rw})
	e, tr := newEngine(t, core.Options{DefaultTimeout: 30 * time.Second})
	seg := openSeg(t, e, peer.Name)
	local := localBuf(t, e, size)
	// The model of the peer's memory: its content, read whole and checked
	// against its own sha256 (cheaper than regenerating the pattern).
	models := make([][]byte, 2)
	for b := range models {
		models[b] = make([]byte, size)
		code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
			Remote: peer.Buffers[b].Addr, Len: size}}, core.TransferOptions{})
		require.Equal(t, status.OK, code, "%v", err)
		copy(models[b], local)
		require.Equal(t, sum(t, peer, b), peertest.Sum(models[b]))
	}
	rng := mrand.New(mrand.NewSource(1))
	names := []string{"memfd", "heap"}

	layouts := []struct {
		name string
		gen  func(buf int, op core.Op) []span
	}{
		{"1x1B", func(b int, op core.Op) []span { return []span{{b, op, 7, 3, 1}} }},
		{"1024x<=8KiB", func(b int, op core.Op) []span {
			return slots(rng, 1024, size, 8<<10, []int{b}, []core.Op{op})
		}},
		{"128x64KiB+1", func(b int, op core.Op) []span {
			return slots(rng, 128, size, 64<<10+1, []int{b}, []core.Op{op})
		}},
		{"1x64MiB", func(b int, op core.Op) []span { return []span{{b, op, 5, 3, 64 << 20}} }},
	}
	check := func(t *testing.T, spans []span) {
		reqs := make([]core.TransferRequest, len(spans))
		for i, s := range spans {
			reqs[i] = core.TransferRequest{Op: s.op, Local: host.Addr(local) + s.local, Segment: seg,
				Remote: peer.Buffers[s.buf].Addr + s.remote, Len: s.n}
		}
		_, _ = rand.Read(local)
		code, st, err := run(t, e, reqs, core.TransferOptions{})
		require.Equal(t, status.OK, code, "%v", err)
		written := map[int]bool{}
		for i, s := range spans {
			require.Equal(t, ID, st[i].Transport)
			require.Equal(t, s.n, st[i].Bytes)
			require.Zero(t, st[i].Flags)
			if s.op == core.OpRead {
				require.True(t, bytes.Equal(local[s.local:s.local+s.n], models[s.buf][s.remote:s.remote+s.n]),
					"request %d: read data differs", i)
			} else {
				copy(models[s.buf][s.remote:], local[s.local:s.local+s.n])
				written[s.buf] = true
			}
		}
		for b := range written {
			require.Equal(t, peertest.Sum(models[b]), sum(t, peer, b), "peer buffer %d after the writes", b)
		}
	}
	for b, name := range names {
		for _, op := range []core.Op{core.OpWrite, core.OpRead} {
			for _, l := range layouts {
				t.Run(fmt.Sprintf("%s/%s/%s", name, opName(op), l.name), func(t *testing.T) {
					check(t, l.gen(b, op))
				})
			}
		}
	}
	// Both buffers and both directions in one batch.
	t.Run("mixed/256", func(t *testing.T) {
		check(t, slots(rng, 256, size, 100<<10, []int{0, 1}, []core.Op{core.OpRead, core.OpWrite}))
	})

	st := tr.Stats()
	require.Positive(t, st["bytes_mapped"])
	require.Positive(t, st["bytes_process_vm"])
	require.EqualValues(t, 1, st["mappings"], "the peer's one allocation, mapped once")
	require.EqualValues(t, 1, st["connections"])
	require.Zero(t, st["fds"], "descriptors are closed once mapped")
	require.Zero(t, st["fallbacks"])
}
