// Package logsink is tent's log output: a log/slog handler whose level can
// be changed at any time (one atomic load decides whether a record is
// wanted, so a disabled line costs nothing beyond that), writing to one
// replaceable destination — a writer (stderr by default, or a file) or a
// callback that gets each formatted line with its level.
//
// A Sink serializes its output: records are formatted and delivered one at
// a time, so a writer never sees interleaved lines and a callback is never
// called concurrently with itself. When SetWriter or SetCallback returns,
// the previous destination is not in use and will not be used again, so the
// caller may close or free it.
//
// The package keeps no state of its own: whoever owns the process (the C
// library, a test) creates the one Sink and hands Logger() to the engines.
package logsink
