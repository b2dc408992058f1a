package local

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// Transport copies between engines of one process.
type Transport struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup

	copies atomic.Int64
	bytes  atomic.Int64
}

// New returns an uninstalled local transport.
func New() *Transport { return &Transport{} }

func (t *Transport) Name() string                          { return Name }
func (t *Transport) Install(*core.Engine) error            { return nil }
func (t *Transport) RegisterMemory([]*core.Region) error   { return nil }
func (t *Transport) UnregisterMemory([]*core.Region) error { return nil }

// Eligible: the peer lives in this process and both sides are host memory
// (GPU memory needs the cuda transport's copy engine).
// ForgetsRequests: each request is copied and completed once, on the
// goroutine that copies it, and not looked at afterwards (core.Forgetter).
func (t *Transport) ForgetsRequests() {}

// EligibleByRegion: Eligible looks only at the peer and the regions
// (core.RegionEligible).
func (t *Transport) EligibleByRegion() {}

func (t *Transport) Eligible(r *core.Request) bool {
	return r.Peer.Local() != nil && !r.LocalRegion.Loc.IsCUDA() &&
		!strings.HasPrefix(r.RemoteRegion.Location, "cuda")
}

// inlineLimit: batches up to this many bytes are copied on the caller's
// thread. A copy that small costs less than handing it to a goroutine and
// waking the caller back up, which dominated small synchronous transfers.
const inlineLimit = 256 << 10

func (t *Transport) Submit(reqs []*core.Request) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		for _, r := range reqs {
			r.Done(0, status.Errorf(status.Closed, "local transport uninstalled"))
		}
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	var total uint64
	for _, r := range reqs {
		total += r.Len
	}
	run := func() {
		defer t.wg.Done()
		for _, r := range reqs {
			r.Done(t.copy(r))
		}
	}
	if total <= inlineLimit {
		run()
		return
	}
	go run()
}

func (t *Transport) copy(r *core.Request) (uint64, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return 0, status.Errorf(status.Closed, "local transport uninstalled")
	}
	target := r.Peer.Local()
	if target == nil {
		return 0, status.Errorf(status.TransportError, "peer %s is no longer in this process", r.Peer.Name())
	}
	access := core.AccessRemoteWrite
	if r.Op == core.OpRead {
		access = core.AccessRemoteRead
	}
	// The target checks the range and permission itself and holds the
	// region for the copy, exactly as it would for a remote peer.
	region, err := target.Acquire(r.Remote, r.Len, access)
	if err != nil {
		return 0, err
	}
	defer target.Release(region)
	local := host.Bytes(r.Local, r.Len)
	remote := host.Bytes(r.Remote, r.Len)
	dst, src := remote, local
	if r.Op == core.OpRead {
		dst, src = local, remote
	}
	// Registered memory that its owner unmapped fails the request; it must
	// not take the process down.
	if _, err := host.Copy(dst, src); err != nil {
		return 0, err
	}
	t.copies.Add(1)
	t.bytes.Add(int64(r.Len))
	return r.Len, nil
}

// Uninstall waits for copies in progress; later requests fail.
func (t *Transport) Uninstall() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

func (t *Transport) Stats() map[string]int64 {
	return map[string]int64{"copies": t.copies.Load(), "bytes": t.bytes.Load()}
}
