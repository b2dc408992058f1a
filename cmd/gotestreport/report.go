package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Skip is one test that called t.Skip.
type Skip struct {
	Package, Test, Reason string
}

// report turns events into go test's plain output. Output of a test is
// held until the test ends: printed if it failed (or skipped), dropped if
// it passed, as plain `go test` does.
type report struct {
	out     io.Writer
	pending map[string][]string // package + "\x00" + test -> output lines
	skips   []Skip
	failed  bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, pending: map[string][]string{}}
}

// Read consumes every event from in. Lines that are not JSON (go test
// writes some errors before any event) are printed as they are.
func (r *report) Read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(r.out, "%s\n", line)
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	key := e.Package + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Action == "build-fail":
		r.failed = true
	case e.Test == "" && e.Action == "output":
		// Package lines: keep "ok"/"FAIL"/"?" and anything unusual
		// (panics, timeouts); drop what only -v prints.
		if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
			fmt.Fprint(r.out, e.Output)
		}
	case e.Test == "" && e.Action == "skip":
		// A package with no test files: nothing was skipped.
	case e.Test == "" && e.Action == "fail":
		r.failed = true
		r.flushPackage(e.Package) // e.g. the output of a test that hung until the timeout
	case e.Action == "output":
		if !strings.HasPrefix(e.Output, "=== ") { // RUN/PAUSE/CONT/NAME: only -v prints them
			r.pending[key] = append(r.pending[key], e.Output)
		}
	case e.Action == "pass":
		delete(r.pending, key)
	case e.Action == "fail":
		r.failed = true
		r.flush(key)
	case e.Action == "skip":
		r.skips = append(r.skips, Skip{Package: e.Package, Test: e.Test, Reason: skipReason(r.pending[key])})
		r.flush(key)
	}
}

func (r *report) flush(key string) {
	for _, l := range r.pending[key] {
		fmt.Fprint(r.out, l)
	}
	delete(r.pending, key)
}

func (r *report) flushPackage(pkg string) {
	var keys []string
	for key := range r.pending {
		if strings.HasPrefix(key, pkg+"\x00") {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		r.flush(key)
	}
}

// skipReason is the message a test passed to t.Skip: the lines it logged
// ("    file_test.go:12: why"), without the "--- SKIP" line.
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		msg = append(msg, t)
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " / ")
}

// Skips are the tests that skipped, in the order they ended.
func (r *report) Skips() []Skip { return r.skips }

// Failed reports whether any test, package or build failed.
func (r *report) Failed() bool { return r.failed }
