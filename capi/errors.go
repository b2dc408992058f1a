package main

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

// fail records err as the calling thread's last error and returns its code.
// An error without a code, or with code OK, is an internal error: a failure
// must never look like success to C.
func fail(err error) C.tent_status {
	code := status.CodeOf(err)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if code == status.OK || code == status.Pending {
		code = status.Internal
		msg = fmt.Sprintf("internal error: failure reported without an error code: %q", msg)
	} else if !knownCode(code) {
		msg = fmt.Sprintf("internal error: failure with status code %d, which tent.h does not define: %s", int32(code), msg)
		code = status.Internal
	}
	setLastError(msg)
	return C.tent_status(code)
}

// knownCode reports whether c is a status tent.h defines. A code from
// anywhere else (a peer's bytes that a decoder let through, a bug) must not
// reach C, whose callers switch on the documented values.
func knownCode(c status.Code) bool {
	_, ok := status.Lookup(c)
	return ok
}

// requestCode is the tent_status of one request's outcome: its code, or
// TENT_ERR_INTERNAL for one tent.h does not define.
func requestCode(c status.Code) C.tent_status {
	if !knownCode(c) {
		return C.TENT_ERR_INTERNAL
	}
	return C.tent_status(c)
}

// setLastError copies msg into the caller's thread-local last-error buffer.
func setLastError(msg string) {
	if msg == "" {
		msg = "(no message)"
	}
	// The C side copies at once; the string's bytes need not outlive the call.
	C.tentshim_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// recoverStatus is deferred first by every export:
//
//	defer recoverStatus(&st, debug.SetPanicOnFault(true))
//
// A panic that escaped an export would kill the host process (Python,
// vLLM); it becomes TENT_ERR_INTERNAL with the stack in the message instead.
// SetPanicOnFault turns a fault on a bad caller pointer into a panic too
// (reported as TENT_ERR_INVALID_ARGUMENT: only caller memory can fault
// here); recoverStatus restores the goroutine's previous setting.
func recoverStatus(st *C.tent_status, panicOnFault bool) {
	debug.SetPanicOnFault(panicOnFault)
	r := recover()
	if r == nil {
		return
	}
	if fault, ok := r.(interface{ Addr() uintptr }); ok {
		*st = fail(status.Errorf(status.InvalidArgument,
			"invalid memory at %#x read or written through a pointer argument (%v)", fault.Addr(), r))
		return
	}
	*st = fail(status.Errorf(status.Internal, "internal error: panic: %v\n%s", r, debug.Stack()))
}

// ok is the return of a successful export. The shim already cleared the
// last error on entry.
func ok() C.tent_status { return C.TENT_OK }
