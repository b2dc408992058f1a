package core_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/logsink"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// lines collects what a sink's callback receives.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(_ logsink.Level, s string) {
	l.mu.Lock()
	l.all = append(l.all, s)
	l.mu.Unlock()
}

// matching returns the lines containing every part.
func (l *lines) matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, s := range l.all {
		for _, p := range parts {
			if !strings.Contains(s, p) {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

func debugLogger(t *testing.T) (*slog.Logger, *lines) {
	t.Helper()
	got := &lines{}
	s := logsink.New(logsink.Debug, nil)
	s.SetCallback(got.add)
	return s.Logger(), got
}

func TestLoggerDefaultsToDiscard(t *testing.T) {
	e, err := core.New(core.Options{Transports: []string{}})
	require.NoError(t, err)
	defer e.Close()
	require.NotNil(t, e.Logger())
	require.False(t, e.Logger().Enabled(context.Background(), slog.LevelError))
}

// pair makes an initiator with the given movers, a target, one registered
// page each, and a segment on the target.
func logPair(t *testing.T, log *slog.Logger, movers ...core.Transport) (*core.Engine, *core.Segment, core.TransferRequest) {
	t.Helper()
	a, err := core.New(core.Options{Transports: []string{}, Logger: log, LocalPeers: thisProcess})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	for _, m := range movers {
		require.NoError(t, a.Install(m))
	}
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
	return a, seg, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: host.Addr(dst), Len: 4096}
}

func TestLogsTransportChoiceOncePerEpochAndTeardown(t *testing.T) {
	log, got := debugLogger(t)
	m := coretest.NewMover("fake")
	a, seg, req := logPair(t, log, m)
	for i := 0; i < 3; i++ {
		b, err := a.Submit([]core.TransferRequest{req}, core.TransferOptions{})
		require.NoError(t, err)
		<-b.Done()
		a.ReleaseBatch(b)
	}
	peer := "peer=" + seg.Peer().Name()
	require.Len(t, got.matching("transport chosen", peer, "transport=fake", "reason=\"first eligible"), 1,
		"one line per transport and epoch, not per batch: %v", got.all)
	require.Len(t, got.matching("segment opened", peer), 1)

	require.NoError(t, a.Close())
	require.Len(t, got.matching("transport uninstalled", "transport=fake"), 1)
	require.Len(t, got.matching("engine closed", "engine="+a.Name()), 1)
}

func TestLogsRetryWithReason(t *testing.T) {
	log, got := debugLogger(t)
	bad, good := coretest.NewMover("bad"), coretest.NewMover("good")
	bad.FailWith(errors.New("wire cut"))
	a, _, req := logPair(t, log, bad, good)
	b, err := a.Submit([]core.TransferRequest{req}, core.TransferOptions{})
	require.NoError(t, err)
	<-b.Done()
	c, err := b.Wait(0)
	require.NoError(t, err)
	require.Equal(t, status.OK, c)
	require.Len(t, got.matching("retrying request on the next transport", "from=bad", "to=good", "wire cut"), 1, "%v", got.all)
}

func TestLogsDeadlineExpiry(t *testing.T) {
	log, got := debugLogger(t)
	m := coretest.NewMover("fake")
	m.Hold()
	a, _, req := logPair(t, log, m)
	b, err := a.Submit([]core.TransferRequest{req}, core.TransferOptions{Timeout: time.Millisecond})
	require.NoError(t, err)
	<-b.Done()
	c, _ := b.Wait(0)
	require.Equal(t, status.Timeout, c)
	require.Len(t, got.matching("batch deadline exceeded", "timeout=1ms", "pending=1"), 1, "%v", got.all)
	m.ReleaseAll()
}

// unavailableFake installs but reports it cannot serve.
type unavailableFake struct{ *coretest.Fake }

func (unavailableFake) Unavailable() string { return "no such hardware" }

func TestUnavailableTransportIsLeftOut(t *testing.T) {
	log, got := debugLogger(t)
	e, err := core.New(core.Options{Transports: []string{}, Logger: log})
	require.NoError(t, err)
	defer e.Close()
	f := unavailableFake{coretest.NewFake("gpu")}
	require.NoError(t, e.Install(f), "a transport this machine lacks is not an error")
	require.Empty(t, e.Transports())
	require.Equal(t, map[string]string{"gpu": "no such hardware"}, e.Stats().Unavailable)
	require.Equal(t, 1, f.Calls(coretest.MethodUninstall), "what it acquired at Install is released")
	require.Len(t, got.matching("transport unavailable", "transport=gpu", "no such hardware"), 1)
	d, err := e.Descriptor()
	require.NoError(t, err)
	for _, ep := range d.Endpoints {
		require.NotEqual(t, "gpu", ep.Transport)
	}
}
