package tcp_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/memory"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/status"
)

// BenchmarkTransfer moves batches of 128 requests to and from a peer in
// another process over loopback, one batch at a time, and reports GB/s
// (1e9 bytes per second) and the batch latency's p50 and p99.
//
//	go test -run '^$' -bench Transfer -benchtime 2s ./transport/tcp/
func BenchmarkTransfer(b *testing.B) {
	const span = 256 << 20 // requests wrap around within this much memory
	peer := peertest.Start(b, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: span, Perm: rw}}})
	streams, _ := strconv.Atoi(os.Getenv("TENT_BENCH_STREAMS")) // 0: the default
	e, _ := newEngine(b, core.Options{TCPStreams: streams})
	local := register(b, e, span, 0)
	random(local)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(b, err)
	remote := peer.Buffers[0].Addr

	for _, op := range []core.Op{core.OpWrite, core.OpRead} {
		for _, size := range []int{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
			name := map[core.Op]string{core.OpWrite: "write", core.OpRead: "read"}[op]
			b.Run(fmt.Sprintf("%s/%s", name, sizeName(size)), func(b *testing.B) {
				benchBatches(b, e, seg, op, memory.Addr(local), remote, span, size, 128)
			})
		}
	}
	b.Run("write/4KiB/batch1", func(b *testing.B) {
		benchBatches(b, e, seg, core.OpWrite, memory.Addr(local), remote, span, 4<<10, 1)
	})
}

func benchBatches(b *testing.B, e *core.Engine, seg *core.Segment, op core.Op, local, remote uint64, span, size, batch int) {
	reqs := make([]core.TransferRequest, batch)
	for i := range reqs {
		off := uint64(i*size) % uint64(span-size+1)
		reqs[i] = core.TransferRequest{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Len: uint64(size)}
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(size * batch))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		bt, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		<-bt.Done()
		if code, err := bt.Wait(0); code != status.OK {
			b.Fatal(err)
		}
		e.ReleaseBatch(bt)
		lat = append(lat, time.Since(t0))
	}
	el := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(size*batch)*float64(b.N)/el.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
