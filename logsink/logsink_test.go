package logsink_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/logsink"
)

func TestLevelThreshold(t *testing.T) {
	var buf bytes.Buffer
	s := logsink.New(logsink.Warn, &buf)
	log := s.Logger()
	log.Info("hidden")
	log.Warn("shown", "peer", "a:1")
	require.NotContains(t, buf.String(), "hidden")
	require.Contains(t, buf.String(), "level=WARN msg=shown peer=a:1\n")

	require.True(t, s.SetLevel(logsink.Debug))
	require.Equal(t, logsink.Debug, s.Level())
	log.Debug("now shown")
	require.Contains(t, buf.String(), "msg=\"now shown\"")

	require.True(t, s.SetLevel(logsink.Off))
	buf.Reset()
	log.Error("nothing")
	require.Empty(t, buf.String())
	require.False(t, log.Enabled(context.Background(), slog.LevelError))

	require.False(t, s.SetLevel(logsink.Level(7)))
	require.False(t, s.SetLevel(logsink.Level(-1)))
	require.Equal(t, logsink.Off, s.Level(), "an invalid level changes nothing")
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]logsink.Level{
		"debug": logsink.Debug, "INFO": logsink.Info, "warn": logsink.Warn, "warning": logsink.Warn,
		" error ": logsink.Error, "off": logsink.Off,
	} {
		got, err := logsink.ParseLevel(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "verbose", "3"} {
		_, err := logsink.ParseLevel(bad)
		require.ErrorContains(t, err, "unknown log level", bad)
	}
}

func TestCallbackGetsLevelAndBareLine(t *testing.T) {
	var buf bytes.Buffer
	s := logsink.New(logsink.Debug, &buf)
	type line struct {
		l   logsink.Level
		msg string
	}
	var got []line
	s.SetCallback(func(l logsink.Level, msg string) { got = append(got, line{l, msg}) })
	log := s.Logger().With("engine", "e1")
	log.Debug("d")
	log.Info("i")
	log.Warn("w")
	log.Error("e", "why", "x y")
	require.Equal(t, []line{
		{logsink.Debug, "msg=d engine=e1"}, {logsink.Info, "msg=i engine=e1"},
		{logsink.Warn, "msg=w engine=e1"}, {logsink.Error, "msg=e engine=e1 why=\"x y\""},
	}, got)
	require.Empty(t, buf.String(), "a callback replaces the writer")

	s.SetCallback(nil)
	log.Info("back")
	require.Contains(t, buf.String(), "msg=back engine=e1")
	require.Len(t, got, 4)
}

// TestSerialized checks that a callback is never entered twice at once and
// that no line is lost or torn, with many goroutines logging.
func TestSerialized(t *testing.T) {
	s := logsink.New(logsink.Debug, nil)
	var inside, n int
	s.SetCallback(func(_ logsink.Level, msg string) {
		inside++
		if inside != 1 {
			panic("callback entered concurrently")
		}
		if !strings.HasPrefix(msg, "msg=line ") {
			panic("torn line: " + msg)
		}
		n++
		inside--
	})
	log := s.Logger()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				log.Info("line", "g", g, "i", i)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 8*200, n)
}

// TestReplaceWaitsForWriter: once SetWriter returns, the old writer is not
// written to again.
func TestReplaceWaitsForWriter(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := logsink.New(logsink.Debug, nil)
	s.SetCallback(func(logsink.Level, string) {
		close(entered)
		<-release
	})
	go s.Logger().Info("slow")
	<-entered
	replaced := make(chan struct{})
	var buf bytes.Buffer
	go func() {
		s.SetWriter(&buf)
		close(replaced)
	}()
	select {
	case <-replaced:
		t.Fatal("SetWriter returned while the old callback was running")
	default:
	}
	close(release)
	<-replaced
	s.Logger().Info("new")
	require.Contains(t, buf.String(), "msg=new")
}
