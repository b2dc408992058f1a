package core_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// helpingMover holds what it is given and completes it only when a
// waiting caller lends it its goroutine (Help): a Wait that did not call
// Help would never return.
type helpingMover struct {
	*coretest.Mover
	mu          sync.Mutex
	callerWaits []bool // CallerWaits of each request, as Submit saw it
	helped      int
	untils      []time.Time // until of each Help
}

func (m *helpingMover) Submit(reqs []*core.Request) {
	m.mu.Lock()
	for _, r := range reqs {
		m.callerWaits = append(m.callerWaits, r.CallerWaits())
	}
	m.mu.Unlock()
	m.Mover.Submit(reqs)
}

// Help completes the held requests when the wait has no limit; a timed
// wait it keeps to the end of its time, completing nothing, as a mover
// whose work would not finish by until must.
func (m *helpingMover) Help(r *core.Request, done <-chan struct{}, until time.Time) {
	m.mu.Lock()
	m.helped++
	m.untils = append(m.untils, until)
	m.mu.Unlock()
	if !until.IsZero() {
		select {
		case <-done:
		case <-time.After(time.Until(until)):
		}
		return
	}
	m.ReleaseAll()
	<-done
}

func helperPair(t *testing.T) (*core.Engine, *helpingMover, []core.TransferRequest, string) {
	a, err := core.New(core.Options{Transports: []string{}, LocalPeers: thisProcess})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	m := &helpingMover{Mover: coretest.NewMover("helping")}
	m.Hold()
	require.NoError(t, a.Install(m))
	b, err := core.New(core.Options{Transports: []string{}, LocalPeers: thisProcess})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	src, dst := make([]byte, 4096), make([]byte, 4096)
	_, err = a.Register(core.RegionDesc{Addr: host.Addr(src), Len: 4096}, 0)
	require.NoError(t, err)
	_, err = b.Register(core.RegionDesc{Addr: host.Addr(dst), Len: 4096}, core.PermRemoteWrite)
	require.NoError(t, err)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	go func() {
		for range m.Entered() {
		}
	}()
	return a, m, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 4096}}, b.Name()
}

// Wait without a timeout lends the waiting goroutine to a mover that can
// use it (Helper); a request of a Waiting batch routed on the submitting
// goroutine tells the mover so (CallerWaits), one of another batch does
// not. (Requests routed off the caller's goroutine, after a descriptor
// fetch or for a retry, have it cleared: route and Done.)
func TestWaitLendsTheCallerToAHelper(t *testing.T) {
	a, m, req, _ := helperPair(t)
	for i, waiting := range []bool{true, false, true} {
		b, err := a.Submit(req, core.TransferOptions{Waiting: waiting, Timeout: time.Minute})
		require.NoError(t, err)
		code, err := b.Wait(-1)
		require.Equal(t, status.OK, code, "%v", err)
		a.ReleaseBatch(b)
		m.mu.Lock()
		require.Equal(t, i+1, m.helped)
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	require.Equal(t, []bool{true, false, true}, m.callerWaits)
}

// Wait with a timeout lends the goroutine too, bounded by the timeout:
// Help is told when the wait gives up, and the wait still returns
// Timeout at its end when Help completed nothing.
func TestWaitWithTimeoutHelpsUntilItsTimeout(t *testing.T) {
	a, m, req, _ := helperPair(t)
	b, err := a.Submit(req, core.TransferOptions{Timeout: time.Minute})
	require.NoError(t, err)
	before := time.Now()
	code, _ := b.Wait(10 * time.Millisecond)
	after := time.Now()
	require.Equal(t, status.Timeout, code)
	m.mu.Lock()
	require.Equal(t, 1, m.helped)
	until := m.untils[0]
	m.mu.Unlock()
	require.False(t, until.Before(before.Add(10*time.Millisecond)), "until %v is before the wait's end", until)
	require.False(t, until.After(after), "until %v is after Wait returned", until)
	code, err = b.Wait(-1) // helped without a limit: completes
	require.Equal(t, status.OK, code, "%v", err)
	a.ReleaseBatch(b)
	m.mu.Lock()
	require.Equal(t, 2, m.helped)
	require.True(t, m.untils[1].IsZero())
	m.mu.Unlock()
}
