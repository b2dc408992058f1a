package main

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tent-dev/tent/logsink"
	"github.com/tent-dev/tent/status"
)

// Environment variables read when the library loads.
const (
	envLogLevel = "TENT_LOG"
	envLogFile  = "TENT_LOG_FILE"
)

// logs is the process's one log sink; every engine logs through it. The
// library owns it here, at the boundary: library packages only ever get a
// *slog.Logger.
var logs = openProcessLog(os.Getenv, os.Stderr)

// processLog is the sink and where its lines go without a callback
// (TENT_LOG_FILE, else stderr; fixed at load).
type processLog struct {
	*logsink.Sink
	defaultOut io.Writer
}

// openProcessLog builds the sink from the environment: warnings and
// errors to stderr unless TENT_LOG and TENT_LOG_FILE say otherwise. A bad
// value is reported as a warning through the sink, and the default kept.
func openProcessLog(getenv func(string) string, stderr io.Writer) processLog {
	p := processLog{Sink: logsink.New(logsink.Warn, stderr), defaultOut: stderr}
	var problems []string
	if v := getenv(envLogLevel); v != "" {
		if l, err := logsink.ParseLevel(v); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v; keeping %s", envLogLevel, err, logsink.Warn))
		} else {
			p.SetLevel(l)
		}
	}
	if path := getenv(envLogFile); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v; logging to stderr", envLogFile, err))
		} else {
			// Never closed: the library logs until the process exits.
			p.SetWriter(f)
			p.defaultOut = f
		}
	}
	for _, msg := range problems {
		p.Logger().Warn(msg)
	}
	return p
}

//export tentgo_log_set_level
func tentgo_log_set_level(level C.int) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	if !logs.SetLevel(logsink.Level(level)) {
		return fail(status.Errorf(status.InvalidArgument,
			"log level %d: want TENT_LOG_DEBUG (%d) .. TENT_LOG_OFF (%d)", int(level), logsink.Debug, logsink.Off))
	}
	return ok()
}

//export tentgo_log_get_level
func tentgo_log_get_level() (level C.int) {
	defer func() {
		if recover() != nil {
			level = C.int(logsink.Off) // nothing to report a failure through
		}
	}()
	return C.int(logs.Level())
}

//export tentgo_log_set_callback
func tentgo_log_set_callback(fn, user C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	if fn == 0 {
		logs.SetWriter(logs.defaultOut)
		return ok()
	}
	// fn is called on every later line, on any thread: a pointer that is
	// not code would crash the process then, far from the mistake.
	if err := checkCode(uintptr(fn), "fn"); err != nil {
		return fail(err)
	}
	logs.SetCallback(func(l logsink.Level, line string) {
		// The C string lives for the call only, as the header says.
		msg := C.CString(line)
		defer C.free(unsafe.Pointer(msg))
		C.tentshim_call_log(fn, C.int(l), msg, user)
	})
	return ok()
}

// checkCode checks that a is inside an executable mapping of this process
// (/proc/self/maps). Without /proc it checks only that a is not in the
// NULL page.
func checkCode(a uintptr, what string) error {
	if err := checkAddr(a, 1, what); err != nil {
		return err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(maps), "\n") {
		// "start-end perms offset dev inode path"
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		lo, hi, found := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !found || err1 != nil || err2 != nil || uint64(a) < start || uint64(a) >= end {
			continue
		}
		if strings.Contains(fields[1], "x") {
			return nil
		}
		return status.Errorf(status.InvalidArgument, "%s is %#x: not code (its mapping is %s)", what, a, fields[1])
	}
	return status.Errorf(status.InvalidArgument, "%s is %#x: not code (no mapping there)", what, a)
}
