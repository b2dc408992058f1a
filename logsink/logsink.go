package logsink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
)

// Level is a sink's threshold. The values are the C header's TENT_LOG_*.
type Level int32

const (
	Debug Level = iota
	Info
	Warn
	Error
	Off
)

var levelNames = [...]string{"debug", "info", "warn", "error", "off"}

func (l Level) String() string {
	if l.Valid() {
		return levelNames[l]
	}
	return fmt.Sprintf("Level(%d)", int32(l))
}

// Valid reports whether l is one of Debug..Off.
func (l Level) Valid() bool { return l >= Debug && l <= Off }

// ParseLevel reads "debug", "info", "warn" (or "warning"), "error" or
// "off", in any case.
func ParseLevel(s string) (Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return Debug, nil
	case "info":
		return Info, nil
	case "warn", "warning":
		return Warn, nil
	case "error":
		return Error, nil
	case "off", "none":
		return Off, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn, error or off)", s)
}

// slogLevel is the lowest slog level l lets through.
func (l Level) slogLevel() slog.Level {
	switch l {
	case Debug:
		return slog.LevelDebug
	case Info:
		return slog.LevelInfo
	case Warn:
		return slog.LevelWarn
	case Error:
		return slog.LevelError
	}
	return slog.Level(math.MaxInt32) // Off: nothing is that severe
}

// LevelOf is the Level of a record of slog level l: what a callback is told.
func LevelOf(l slog.Level) Level {
	switch {
	case l < slog.LevelInfo:
		return Debug
	case l < slog.LevelWarn:
		return Info
	case l < slog.LevelError:
		return Warn
	}
	return Error
}

// Callback receives one formatted line (no trailing newline). The string
// is only valid during the call.
type Callback func(level Level, line string)

// Sink is a level and a destination; see the package documentation.
type Sink struct {
	min atomic.Int64 // the slog level of the threshold

	mu  sync.Mutex // serializes output and destination changes
	w   io.Writer
	fn  Callback
	cur slog.Level // the level of the record being written
}

// New returns a sink at level, writing to w.
func New(level Level, w io.Writer) *Sink {
	s := &Sink{w: w}
	s.SetLevel(level)
	return s
}

// SetLevel changes the threshold; it takes effect for the next record.
// An invalid level is ignored and reported as false.
func (s *Sink) SetLevel(l Level) bool {
	if !l.Valid() {
		return false
	}
	s.min.Store(int64(l.slogLevel()))
	return true
}

// Level returns the threshold.
func (s *Sink) Level() Level {
	switch m := slog.Level(s.min.Load()); {
	case m <= slog.LevelDebug:
		return Debug
	case m <= slog.LevelInfo:
		return Info
	case m <= slog.LevelWarn:
		return Warn
	case m <= slog.LevelError:
		return Error
	}
	return Off
}

// Enabled reports whether a record of slog level l would be written.
func (s *Sink) Enabled(l slog.Level) bool { return int64(l) >= s.min.Load() }

// SetWriter sends lines (each ending in a newline) to w from now on.
func (s *Sink) SetWriter(w io.Writer) {
	s.mu.Lock()
	s.w, s.fn = w, nil
	s.mu.Unlock()
}

// SetCallback sends lines to fn from now on (without time and level: the
// level is fn's argument). nil goes back to the writer.
func (s *Sink) SetCallback(fn Callback) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
}

// Logger returns a logger writing through s.
func (s *Sink) Logger() *slog.Logger {
	all := slog.Level(math.MinInt32) // the sink decides, in Enabled
	return slog.New(&handler{
		sink: s,
		full: slog.NewTextHandler(sinkWriter{s}, &slog.HandlerOptions{Level: all}),
		bare: slog.NewTextHandler(sinkWriter{s}, &slog.HandlerOptions{Level: all, ReplaceAttr: dropTimeAndLevel}),
	})
}

// dropTimeAndLevel shapes a callback's lines: the host's logging adds its
// own time stamp, and the level travels as an argument.
func dropTimeAndLevel(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
		return slog.Attr{}
	}
	return a
}

// write delivers one formatted record; called by the text handler with
// s.mu held (handler.Handle takes it).
func (s *Sink) write(p []byte) {
	if s.fn != nil {
		s.fn(LevelOf(s.cur), strings.TrimSuffix(string(p), "\n"))
		return
	}
	if s.w != nil {
		_, _ = s.w.Write(p) // nowhere to report a failing log writer
	}
}

// sinkWriter is the text handlers' output: the sink, under its lock.
type sinkWriter struct{ s *Sink }

func (w sinkWriter) Write(p []byte) (int, error) {
	w.s.write(p)
	return len(p), nil
}

// handler checks the sink's level first, then formats with slog's text
// handler while holding the sink's lock, so that the line reaches the
// destination current at that moment, with its level.
type handler struct {
	sink *Sink
	full slog.Handler // time, level, message, attributes: for writers
	bare slog.Handler // message and attributes: for callbacks
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return h.sink.Enabled(l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	if !h.sink.Enabled(r.Level) {
		return nil
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	h.sink.cur = r.Level
	if h.sink.fn != nil {
		return h.bare.Handle(ctx, r)
	}
	return h.full.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{sink: h.sink, full: h.full.WithAttrs(as), bare: h.bare.WithAttrs(as)}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{sink: h.sink, full: h.full.WithGroup(name), bare: h.bare.WithGroup(name)}
}
