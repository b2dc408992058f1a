package tcp_test

import (
	"bytes"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// requireBaseline waits until the fd and goroutine counts are back to
// what they were.
func requireBaseline(t testing.TB, fds, goroutines int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, g := fdCount(t), runtime.NumGoroutine()
		if f <= fds && g <= goroutines {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("fds %d (baseline %d), goroutines %d (baseline %d)\n%s", f, fds, g, goroutines, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func requireIdle(t testing.TB, tr *tcp.Transport) {
	t.Helper()
	st := tr.Stats()
	for _, k := range []string{"connections", "server_connections", "goroutines", "requests_in_flight", "receive_buffers"} {
		require.Zero(t, st[k], "%s: %v", k, st)
	}
}

// load runs batches of mixed READs and WRITEs from two goroutines (on 32
// MiB of memory on each side) until
// stop is closed or the engine refuses them, and checks that every batch
// ends with an acceptable status.
func load(t testing.TB, e *core.Engine, seg *core.Segment, local, remote uint64, stop chan struct{}, ok ...status.Code) (wait func() int64) {
	var wg sync.WaitGroup
	var batches atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]core.TransferRequest, 16)
				for j := range reqs {
					n := uint64(1 << (10 + (i+j)%11)) // 1 KiB .. 1 MiB
					// Each worker has its own 16 MiB on each side.
					off := uint64(w)<<24 + uint64(j)<<20
					reqs[j] = core.TransferRequest{Op: core.Op((i + j + w) % 2), Local: local + off,
						Segment: seg, Remote: remote + off, Len: n}
				}
				b, err := e.Submit(reqs, core.TransferOptions{Timeout: 10 * time.Second})
				if err != nil {
					// Refused only once the engine is closed (with Closed, or
					// NotRegistered for local memory it has dropped).
					require.True(t, e.Closed(), "%v", err)
					return
				}
				code, err := b.Wait(-1)
				if code != status.OK {
					require.Contains(t, ok, code, "%v", err)
				}
				batches.Add(1)
				e.ReleaseBatch(b)
			}
		}()
	}
	return func() int64 { wg.Wait(); return batches.Load() }
}

// Uninstall and engine Close while transfers run, from another goroutine:
// requests in flight end (OK, or Closed, or Unsupported once no transport
// is left), the transport's counts go to zero, and fds and goroutines
// return to their baseline.
func TestTeardownUnderLoad(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"},
		Buffers: []peertest.Buffer{{Size: 32 << 20, Perm: rw}}})
	for _, how := range []string{"uninstall", "close"} {
		t.Run(how, func(t *testing.T) {
			fds, goroutines := fdCount(t), runtime.NumGoroutine()
			e, err := core.New(core.Options{Available: available(tcp.Options{}), Transports: []string{}})
			require.NoError(t, err)
			tr := tcp.New(tcp.Options{})
			require.NoError(t, e.Install(tr))
			local := register(t, e, 32<<20, 0)
			seg, err := e.OpenSegment(peer.Name)
			require.NoError(t, err)
			stop := make(chan struct{})
			wait := load(t, e, seg, host.Addr(local), peer.Buffers[0].Addr, stop,
				status.Closed, status.Unsupported)
			require.Eventually(t, func() bool { return tr.Stats()["bytes_received"] > 4<<20 }, 10*time.Second, time.Millisecond)
			done := make(chan error)
			go func() {
				if how == "uninstall" {
					done <- e.Uninstall("tcp")
				} else {
					done <- e.Close()
				}
			}()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal(how + " hangs")
			}
			requireIdle(t, tr)
			time.Sleep(50 * time.Millisecond) // the load goes on against the torn-down engine a while; any length does
			close(stop)
			require.Positive(t, wait())
			requireIdle(t, tr)
			if how == "uninstall" {
				require.NoError(t, e.Close())
			}
			require.Zero(t, e.Stats().RequestsInFlight)
			requireBaseline(t, fds, goroutines)
		})
	}
}

// The target side: Uninstall("tcp") alone stops serving (the engine's
// listener stays up) and closes the connections it served; the initiator's
// requests fail and it recovers once the target serves again.
func TestTargetUninstallUnderLoad(t *testing.T) {
	fds, goroutines := fdCount(t), runtime.NumGoroutine()
	a, err := core.New(core.Options{Available: available(tcp.Options{}), Transports: []string{"tcp"}})
	require.NoError(t, err)
	b, err := core.New(core.Options{Available: available(tcp.Options{}), Transports: []string{}})
	require.NoError(t, err)
	tb := tcp.New(tcp.Options{})
	require.NoError(t, b.Install(tb))
	src := alloc(t, a, 32<<20, 0)
	dst := alloc(t, b, 32<<20, rw)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	stop := make(chan struct{})
	// Unsupported: the target's descriptor stops listing tcp once it is
	// uninstalled, so requests routed after the change find no transport.
	wait := load(t, a, seg, host.Addr(src), host.Addr(dst), stop, status.TransportError, status.Unsupported)
	require.Eventually(t, func() bool { return tb.Stats()["bytes_received"] > 4<<20 }, 10*time.Second, time.Millisecond)
	require.NoError(t, b.Uninstall("tcp"))
	requireIdle(t, tb)
	// Nothing is served any more, yet the initiator neither hangs nor
	// crashes.
	time.Sleep(100 * time.Millisecond)
	requireIdle(t, tb)
	close(stop)
	wait()

	// Serving again (a fresh instance), the initiator recovers once the
	// change has reached it: b pushes it over the control link, and until
	// it arrives a's cached descriptor (refreshed during the load) may
	// still list no tcp endpoint (Unsupported).
	tb2 := tcp.New(tcp.Options{})
	require.NoError(t, b.Install(tb2))
	random(src)
	var code status.Code
	require.Eventually(t, func() bool {
		bt, serr := a.Submit([]core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
			Remote: host.Addr(dst), Len: 32 << 20}}, core.TransferOptions{Timeout: 10 * time.Second})
		if serr != nil {
			code, err = status.CodeOf(serr), serr
			return true
		}
		code, err = bt.Wait(-1)
		a.ReleaseBatch(bt)
		return code != status.Unsupported
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, src, dst)

	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireIdle(t, tb2)
	requireBaseline(t, fds, goroutines)
}

// Cancel (a batch destroyed in flight): the transport lets go of every
// request at once, and afterwards writes nothing into the local memory,
// although the peer's replies are still arriving.
func TestCancel(t *testing.T) {
	peer := startPeer(t, 16<<20)
	e, tr := newEngine(t, core.Options{})
	local := register(t, e, 64<<20, 0)
	seg := openSegment(t, e, peer.Name)
	for _, op := range []core.Op{core.OpRead, core.OpWrite} {
		reqs := make([]core.TransferRequest, 64)
		for i := range reqs {
			reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(local) + uint64(i)<<20, Segment: seg,
				Remote: peer.Buffers[0].Addr + uint64(i%16)<<20, Len: 1 << 20}
		}
		before := tr.Stats()["bytes_received"] + tr.Stats()["bytes_sent"]
		b, err := e.Submit(reqs, core.TransferOptions{Timeout: 20 * time.Second})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return tr.Stats()["bytes_received"]+tr.Stats()["bytes_sent"] > before+4<<20
		}, 10*time.Second, time.Millisecond)
		start := time.Now()
		require.True(t, b.Cancel())
		require.Less(t, time.Since(start), 2*time.Second)
		clear(local) // the race detector watches for any write from the transport
		code, _ := b.Wait(0)
		require.Equal(t, status.Canceled, code)
		e.ReleaseBatch(b)
		time.Sleep(100 * time.Millisecond) // replies keep arriving meanwhile; any length does
		require.True(t, bytes.Equal(local, make([]byte, len(local))), "local memory written after Cancel")
	}
	require.Eventually(t, func() bool { return tr.Stats()["requests_in_flight"] == 0 }, 5*time.Second, time.Millisecond)
	// The connections stayed in step: the next batch works.
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(local), Segment: seg,
		Remote: peer.Buffers[0].Addr, Len: 1 << 20}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
}

// Peers with different secrets cannot move data: neither the control link
// nor a data connection gets past the handshake, and the raw transport
// path fails with AuthFailed.
func TestAuthentication(t *testing.T) {
	peer := peertest.Start(t, peertest.Config{Transports: []string{"tcp"}, Secret: "s3cret",
		Buffers: []peertest.Buffer{{Size: 1 << 20, Perm: rw}}})
	sum := peerSum(t, peer, 0)
	for _, secret := range []string{"guess", ""} {
		e, tr := newEngine(t, core.Options{Secret: []byte(secret), DefaultTimeout: 2 * time.Second})
		_, err := e.OpenSegment(peer.Name)
		require.ErrorIs(t, err, status.ErrAuthFailed)
		_, err = e.Dial(peer.Name, tcp.KindData, time.Now().Add(2*time.Second))
		require.ErrorIs(t, err, status.ErrAuthFailed)
		src := register(t, e, 1<<20, 0)
		random(src)
		err = tr.Raw(peer.Name, 0, core.OpWrite, host.Addr(src), peer.Buffers[0].Addr, 1<<20, 2*time.Second)
		require.ErrorIs(t, err, status.ErrAuthFailed)
		require.Eventually(t, func() bool { return tr.Stats()["goroutines"] == 0 }, 5*time.Second, time.Millisecond)
		requireIdle(t, tr)
	}
	require.Equal(t, sum, peerSum(t, peer, 0))

	e, _ := newEngine(t, core.Options{Secret: []byte("s3cret")})
	seg, err := e.OpenSegment(peer.Name)
	require.NoError(t, err)
	src := register(t, e, 1<<20, 0)
	random(src)
	code, _, err := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg,
		Remote: peer.Buffers[0].Addr, Len: 1 << 20}}, 10*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, peertest.Sum(src), peerSum(t, peer, 0))
}

// Uninstall does not wait for a dial that hangs in the handshake: it
// cancels it, and the request fails with Closed.
func TestUninstallDuringDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	e, tr := newEngine(t, core.Options{})
	src := make([]byte, 64)
	done := make(chan error, 1)
	go func() {
		done <- tr.Raw(ln.Addr().String(), 1, core.OpWrite, host.Addr(src), 0x1000, 64, 30*time.Second)
	}()
	require.Eventually(t, func() bool { return tr.Stats()["dials"] == 1 }, 10*time.Second, time.Millisecond)
	// Accepted: the dial is done and the client waits in the handshake.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == 1
	}, 10*time.Second, time.Millisecond)
	start := time.Now()
	require.NoError(t, e.Uninstall("tcp"))
	require.Less(t, time.Since(start), 2*time.Second)
	select {
	case err := <-done:
		require.Equal(t, status.Closed, status.CodeOf(err), "%v", err)
	case <-time.After(2 * time.Second):
		t.Fatal("the request did not end")
	}
	requireIdle(t, tr)
}
