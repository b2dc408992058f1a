//go:build linux

package shm

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// BenchmarkShm moves batches of 128 requests between this process and a
// peer process, through the peer's memfd allocation (mapped) and its Go
// heap (process_vm). Every iteration also runs the reference, a plain
// copy() over the same layout in this process, right after the batch, so
// both see the same machine load; it reports the transfer's GB/s, the
// reference's memcpy-GB/s and their ratio (%memcpy). ns/op counts the
// transfer only. Request i of a batch is at offset (i*size) mod 256 MiB on
// both sides, so small sizes stay cache-resident exactly as the reference
// does.
//
//	go test -run '^$' -bench BenchmarkShm -benchtime 2s ./transport/shm/
func BenchmarkShm(b *testing.B) {
	const (
		span  = 256 << 20
		batch = 128
	)
	peer := startPeer(b, peertest.Buffer{Size: span, Perm: rw, Alloc: true}, peertest.Buffer{Size: span, Perm: rw})
	e, tr := newEngine(b, core.Options{DefaultTimeout: time.Minute})
	seg := openSeg(b, e, peer.Name)
	local := localBuf(b, e, span)
	other := make([]byte, span)
	copy(other, local)

	for _, size := range []uint64{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		name := fmt.Sprintf("%dKiB", size>>10)
		if size >= 1<<20 {
			name = fmt.Sprintf("%dMiB", size>>20)
		}
		off := func(i int) uint64 { return (uint64(i) * size) % span }
		memcpy := func() {
			for i := 0; i < batch; i++ {
				o := off(i)
				copy(other[o:o+size], local[o:o+size])
			}
		}
		for buf, path := range []string{"mapped", "process_vm"} {
			for _, op := range []core.Op{core.OpWrite, core.OpRead} {
				b.Run(fmt.Sprintf("%s/%s/%s", path, opName(op), name), func(b *testing.B) {
					reqs := make([]core.TransferRequest, batch)
					for i := range reqs {
						o := off(i)
						reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(local) + o, Segment: seg,
							Remote: peer.Buffers[buf].Addr + o, Len: size}
					}
					once := func() { runBatch(b, e, reqs) }
					once() // connection, mapping, page tables
					memcpy()
					before := tr.Stats()
					b.SetBytes(int64(batch * size))
					b.ReportAllocs()
					var tx, mc time.Duration
					b.ResetTimer()
					for n := 0; n < b.N; n++ {
						t0 := time.Now()
						once()
						t1 := time.Now()
						b.StopTimer()
						memcpy()
						mc += time.Since(t1)
						tx += t1.Sub(t0)
						b.StartTimer()
					}
					b.StopTimer()
					bytes := float64(batch*size) * float64(b.N)
					b.ReportMetric(bytes/tx.Seconds()/1e9, "GB/s")
					b.ReportMetric(bytes/mc.Seconds()/1e9, "memcpy-GB/s")
					b.ReportMetric(100*mc.Seconds()/tx.Seconds(), "%memcpy")
					after := tr.Stats()
					key := "bytes_mapped"
					if path == "process_vm" {
						key = "bytes_process_vm"
					}
					if moved := after[key] - before[key]; moved != int64(b.N)*int64(batch*size) {
						b.Fatalf("%s moved %d bytes, want %d", key, moved, int64(b.N)*int64(batch*size))
					}
				})
			}
		}
	}
}

// BenchmarkShmRoundTrip is the fixed cost of a same-host batch of one
// WRITE into the peer's memfd allocation (8 bytes and 4 KiB), submit to
// completion (the lease round trip to the target process, the copy, the
// release).
//
//	go test -run '^$' -bench ShmRoundTrip ./transport/shm/
func BenchmarkShmRoundTrip(b *testing.B) {
	peer := startPeer(b, peertest.Buffer{Size: 1 << 20, Perm: rw, Alloc: true})
	e, _ := newEngine(b, core.Options{DefaultTimeout: time.Minute})
	seg := openSeg(b, e, peer.Name)
	local := localBuf(b, e, 1<<20)
	for _, size := range []uint64{8, 4 << 10} {
		name := fmt.Sprintf("%dB", size)
		if size >= 1<<10 {
			name = fmt.Sprintf("%dKiB", size>>10)
		}
		b.Run(name, func(b *testing.B) {
			reqs := []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(local), Segment: seg,
				Remote: peer.Buffers[0].Addr, Len: size}}
			runBatch(b, e, reqs) // connection, mapping
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				runBatch(b, e, reqs)
			}
		})
	}
}

// runBatch submits reqs and waits for them, failing b unless all succeed.
func runBatch(b *testing.B, e *core.Engine, reqs []core.TransferRequest) {
	bt, err := e.Submit(reqs, core.TransferOptions{})
	if err != nil {
		b.Fatal(err)
	}
	<-bt.Done()
	if c, _, err := bt.Status(nil); c != status.OK {
		b.Fatalf("batch: %v", err)
	}
	e.ReleaseBatch(bt)
}

// BenchmarkShmBatch128 is the per-request cost of a batch of 128 requests
// of 4 KiB to a peer process under standing grants: WRITE and READ, into
// the peer's memfd allocation (mapped) and its Go heap (process_vm),
// submit to completion. It reports ns/req (ns/op over 128), the figure to
// set beside a 4 KiB memcpy. The requests lie adjacent (each continues the
// one before it on both sides, so the mapped copy merges them into steps
// of mergeMax and process_vm into one iovec), and under apart/ in the
// order of the sweep's shuffled layout (the even blocks, then the odd: no
// request continues another, each is a step and an iovec of its own).
//
//	go test -run '^$' -bench 'ShmBatch128$' -benchmem ./transport/shm/
func BenchmarkShmBatch128(b *testing.B) {
	const (
		size  = 4 << 10
		batch = 128
		span  = batch * size
	)
	peer := startPeer(b, peertest.Buffer{Size: span, Perm: rw, Alloc: true}, peertest.Buffer{Size: span, Perm: rw})
	e, tr := newEngine(b, core.Options{DefaultTimeout: time.Minute})
	seg := openSeg(b, e, peer.Name)
	local := localBuf(b, e, span)
	for _, layout := range []string{"", "apart/"} {
		for buf, path := range []string{"mapped", "process_vm"} {
			for _, op := range []core.Op{core.OpWrite, core.OpRead} {
				b.Run(layout+path+"/"+opName(op), func(b *testing.B) {
					reqs := make([]core.TransferRequest, batch)
					for i := range reqs {
						blk := i
						if layout != "" {
							blk = shuffled(i, batch)
						}
						o := uint64(blk) * size
						reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(local) + o, Segment: seg,
							Remote: peer.Buffers[buf].Addr + o, Len: size}
					}
					runBatch(b, e, reqs) // connection, mapping, standing grant
					before := tr.Stats()
					b.SetBytes(batch * size)
					b.ReportAllocs()
					b.ResetTimer()
					for n := 0; n < b.N; n++ {
						runBatch(b, e, reqs)
					}
					b.StopTimer()
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/batch, "ns/req")
					after := tr.Stats()
					key := "bytes_mapped"
					if path == "process_vm" {
						key = "bytes_process_vm"
					}
					if moved := after[key] - before[key]; moved != int64(b.N)*batch*size {
						b.Fatalf("%s moved %d bytes, want %d", key, moved, int64(b.N)*batch*size)
					}
					if after["grant_misses"] != before["grant_misses"] {
						b.Fatalf("%d batches asked for a lease, want none under the standing grant",
							after["grant_misses"]-before["grant_misses"])
					}
				})
			}
		}
	}
}

// shuffled is the block of request i of n in the sweep's shuffled layout:
// the even blocks in order, then the odd ones.
func shuffled(i, n int) int {
	if h := (n + 1) / 2; i >= h {
		return 2*(i-h) + 1
	}
	return 2 * i
}

// BenchmarkShmBatch128Wait is BenchmarkShmBatch128 as a C caller runs it:
// on a goroutine locked to its thread (a cgo call's), tent_transfer's
// Submit and then tent_batch_wait's Wait, untimed (-1, the C++ twin) or in
// the Python layer's 200 ms slices. It reports ns/req and helped, the
// fraction of batches the waiting thread copied itself (copies_helped).
//
//	go test -run '^$' -bench ShmBatch128Wait -benchmem ./transport/shm/
func BenchmarkShmBatch128Wait(b *testing.B) {
	const (
		size  = 4 << 10
		batch = 128
		span  = batch * size
	)
	peer := startPeer(b, peertest.Buffer{Size: span, Perm: rw, Alloc: true}, peertest.Buffer{Size: span, Perm: rw})
	e, tr := newEngine(b, core.Options{DefaultTimeout: time.Minute})
	seg := openSeg(b, e, peer.Name)
	local := localBuf(b, e, span)
	for buf, path := range []string{"mapped", "process_vm"} {
		for _, op := range []core.Op{core.OpWrite, core.OpRead} {
			for _, wait := range []time.Duration{-1, 200 * time.Millisecond} {
				name := "untimed"
				if wait > 0 {
					name = "timed"
				}
				b.Run(path+"/"+opName(op)+"/"+name, func(b *testing.B) {
					reqs := make([]core.TransferRequest, batch)
					for i := range reqs {
						o := uint64(i) * size
						reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(local) + o, Segment: seg,
							Remote: peer.Buffers[buf].Addr + o, Len: size}
					}
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					once := func() {
						bt, err := e.Submit(reqs, core.TransferOptions{})
						if err != nil {
							b.Fatal(err)
						}
						if c, err := bt.Wait(wait); c != status.OK {
							b.Fatalf("batch: %v", err)
						}
						e.ReleaseBatch(bt)
					}
					once() // connection, mapping, standing grant
					before := tr.Stats()
					b.SetBytes(batch * size)
					b.ReportAllocs()
					b.ResetTimer()
					for n := 0; n < b.N; n++ {
						once()
					}
					b.StopTimer()
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/batch, "ns/req")
					after := tr.Stats()
					b.ReportMetric(float64(after["copies_helped"]-before["copies_helped"])/float64(b.N), "helped")
				})
			}
		}
	}
}
