package core_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/logsink"
	"github.com/tent-dev/tent/memory/host"
)

// BenchmarkSubmit128 measures the engine's own cost per batch of 128
// requests (checks, routing, completion) with a mover that completes at
// once, so no data moves: with no logger, and with the library's default
// (a sink at warn), which must cost the same.
func BenchmarkSubmit128(b *testing.B) {
	b.Run("log=off", func(b *testing.B) { benchSubmit128(b, nil) })
	b.Run("log=warn", func(b *testing.B) { benchSubmit128(b, logsink.New(logsink.Warn, io.Discard).Logger()) })
}

func benchSubmit128(b *testing.B, log *slog.Logger) {
	a, err := core.New(core.Options{Transports: []string{}, Logger: log, LocalPeers: thisProcess})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	m := coretest.NewMover("fake")
	_ = a.Install(m)
	t, _ := core.New(core.Options{Transports: []string{}, LocalPeers: thisProcess})
	defer t.Close()
	src := make([]byte, 128*4096)
	dst := make([]byte, 128*4096)
	if _, err := a.Register(core.RegionDesc{Addr: host.Addr(src), Len: uint64(len(src))}, 0); err != nil {
		b.Fatal(err)
	}
	if _, err := t.Register(core.RegionDesc{Addr: host.Addr(dst), Len: uint64(len(dst))}, core.PermRemoteWrite); err != nil {
		b.Fatal(err)
	}
	seg, err := a.OpenSegment(t.Name())
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]core.TransferRequest, 128)
	for i := range reqs {
		reqs[i] = core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i)*4096, Segment: seg,
			Remote: host.Addr(dst) + uint64(i)*4096, Len: 4096}
	}
	go func() {
		for range m.Entered() {
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch, err := a.Submit(reqs, core.TransferOptions{})
		if err != nil {
			b.Fatal(err)
		}
		<-batch.Done()
		a.ReleaseBatch(batch)
	}
}
