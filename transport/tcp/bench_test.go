package tcp_test

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// BenchmarkTransfer moves batches of 128 requests to and from a peer in
// another process over loopback, one batch at a time, and reports GB/s
// (1e9 bytes per second), the CPU time both processes spent per GB, and
// the batch latency's p50 and p99.
//
//	go test -run '^$' -bench Transfer -benchtime 2s ./transport/tcp/
//	bench/go/tcp_iperf3.sh 3   # the same, between iperf3 runs
//
// TENT_BENCH_STREAMS sets tcp.Options.Streams; TENT_BENCH_SPAN_MIB the
// memory (on each side) that the requests cycle through, 128 MiB by
// default, so that large blocks come from and go to memory, not cache.
func BenchmarkTransfer(b *testing.B) {
	span := 128 << 20 // requests cycle through this much memory (at least one block)
	if mib, _ := strconv.Atoi(os.Getenv("TENT_BENCH_SPAN_MIB")); mib > 0 {
		span = mib << 20
	}
	const maxSize = 64 << 20
	bufSize := max(span, maxSize)
	peer := peertest.Start(b, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: uint64(bufSize), Perm: rw}}})
	streams, _ := strconv.Atoi(os.Getenv("TENT_BENCH_STREAMS")) // 0: the default
	e, tr := newEngineWith(b, core.Options{}, tcp.Options{Streams: streams})
	local := register(b, e, bufSize, 0)
	random(local)
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(b, err)
	remote := peer.Buffers[0].Addr

	for _, op := range []core.Op{core.OpWrite, core.OpRead} {
		for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, maxSize} {
			name := map[core.Op]string{core.OpWrite: "write", core.OpRead: "read"}[op]
			b.Run(fmt.Sprintf("%s/%s", name, sizeName(size)), func(b *testing.B) {
				benchBatches(b, e, seg, peer.PID, op, host.Addr(local), remote, max(span, size), size, 128)
			})
		}
	}
	b.Run("write/4KiB/batch1", func(b *testing.B) {
		defer reportCallerReads(b, tr)()
		benchBatches(b, e, seg, peer.PID, core.OpWrite, host.Addr(local), remote, span, 4<<10, 1)
	})
	b.Run("read/4KiB/batch1", func(b *testing.B) {
		defer reportCallerReads(b, tr)()
		benchBatches(b, e, seg, peer.PID, core.OpRead, host.Addr(local), remote, span, 4<<10, 1)
	})
	// A C caller's goroutine is locked to its thread (a cgo callback):
	// its wake-up is a thread's, not a goroutine's.
	b.Run("write/4KiB/batch1/locked", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer reportCallerReads(b, tr)()
		benchBatches(b, e, seg, peer.PID, core.OpWrite, host.Addr(local), remote, span, 4<<10, 1)
	})
	for _, op := range []core.Op{core.OpWrite, core.OpRead} {
		name := map[core.Op]string{core.OpWrite: "write", core.OpRead: "read"}[op]
		b.Run(name+"/64KiB/threads2", func(b *testing.B) {
			benchThreads(b, e, seg, peer.PID, op, host.Addr(local), remote, span, 64<<10, 128, 2)
		})
	}
}

// reportCallerReads reports, when the returned function runs, the share
// of replies that the waiting caller read itself (Transport.Help) rather
// than the connection's reader goroutine.
func reportCallerReads(b *testing.B, tr *tcp.Transport) func() {
	c0, r0, k0 := tr.Stats()["replies_by_caller"], tr.Stats()["replies_by_reader"], tr.Stats()["read_side_kicks"]
	return func() {
		c, r, k := tr.Stats()["replies_by_caller"]-c0, tr.Stats()["replies_by_reader"]-r0, tr.Stats()["read_side_kicks"]-k0
		if c+r > 0 {
			b.ReportMetric(100*float64(c)/float64(c+r), "caller-read-%")
			b.ReportMetric(100*float64(k)/float64(c+r), "kicks-%")
		}
	}
}

// benchThreads is benchBatches from several goroutines at once, each on
// its own part of the memory, b.N batches in all.
func benchThreads(b *testing.B, e *core.Engine, seg *core.Segment, peerPID int, op core.Op, local, remote uint64, span, size, batch, threads int) {
	part := uint64(span / threads)
	lats := make([][]time.Duration, threads)
	b.SetBytes(int64(size * batch))
	b.ResetTimer()
	cpu0 := cpuTime(os.Getpid()) + cpuTime(peerPID)
	start := time.Now()
	var wg sync.WaitGroup
	for th := 0; th < threads; th++ {
		reqs := make([]core.TransferRequest, batch)
		for i := range reqs {
			off := uint64(th)*part + uint64(i*size)%(part-uint64(size)+1)
			reqs[i] = core.TransferRequest{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Len: uint64(size)}
		}
		n := b.N / threads
		if th < b.N%threads {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				t0 := time.Now()
				bt, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute, Waiting: true})
				if err != nil {
					b.Error(err)
					return
				}
				if code, err := bt.Wait(-1); code != status.OK {
					b.Error(err)
					return
				}
				e.ReleaseBatch(bt)
				lats[th] = append(lats[th], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime(os.Getpid()) + cpuTime(peerPID) - cpu0
	b.StopTimer()
	lat := slices.Concat(lats...)
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(cpu.Seconds()/(float64(size*batch)*float64(b.N)/1e9), "cpu-s/GB")
	b.ReportMetric(float64(size*batch)*float64(b.N)/el.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func benchBatches(b *testing.B, e *core.Engine, seg *core.Segment, peerPID int, op core.Op, local, remote uint64, span, size, batch int) {
	reqs := make([]core.TransferRequest, batch)
	for i := range reqs {
		off := uint64(i*size) % uint64(span-size+1)
		reqs[i] = core.TransferRequest{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Len: uint64(size)}
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(size * batch))
	b.ResetTimer()
	cpu0 := cpuTime(os.Getpid()) + cpuTime(peerPID)
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		bt, err := e.Submit(reqs, core.TransferOptions{Timeout: time.Minute, Waiting: true})
		if err != nil {
			b.Fatal(err)
		}
		if code, err := bt.Wait(-1); code != status.OK {
			b.Fatal(err)
		}
		e.ReleaseBatch(bt)
		lat = append(lat, time.Since(t0))
	}
	el := time.Since(start)
	cpu := cpuTime(os.Getpid()) + cpuTime(peerPID) - cpu0
	b.StopTimer()
	// CPU seconds (both processes) per GB moved: what a busy machine
	// changes least.
	b.ReportMetric(cpu.Seconds()/(float64(size*batch)*float64(b.N)/1e9), "cpu-s/GB")
	slices.Sort(lat)
	b.ReportMetric(float64(size*batch)*float64(b.N)/el.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// cpuTime returns the user+system time of process pid so far.
func cpuTime(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which is in parentheses): state is field 3,
	// utime and stime are fields 14 and 15, in clock ticks (USER_HZ, 100).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
