// Command capi is libtent.so: the C ABI of include/tent.h over package core.
// Build it with
//
//	go build -buildmode=c-shared \
//	  -ldflags=-extldflags=-Wl,--version-script=capi/exports.map \
//	  -o build/libtent.so ./capi
//
// (the Makefile does), so that only the tent_* functions are exported.
//
// # Layers
//
//   - shim.c defines every public function with the header's exact
//     signature. It clears the thread's last error, fails fast with
//     TENT_ERR_FORKED in a forked child (pthread_atfork; the Go runtime
//     does not survive fork, so the child never enters Go), converts handle
//     pointers to integer ids and every other pointer to an integer address,
//     and calls the Go export. Functions that never fail
//     (versions, status texts, transport names, tent_last_error) are plain
//     C and leave the last error alone.
//
//   - The //export tentgo_* functions (engine.go, register.go, ...) take
//     and return ids, never pointers, so Go never forms a fake pointer.
//     Each starts with
//
//     defer recoverStatus(&st, debug.SetPanicOnFault(true))
//
//     so a panic becomes TENT_ERR_INTERNAL with the stack in the message,
//     and a fault on a bad caller pointer becomes TENT_ERR_INVALID_ARGUMENT,
//     instead of killing the host process. They report failures through
//     fail(err), which stores err's message in the caller's thread-local
//     last error and returns status.CodeOf(err).
//
//   - library.go holds the process-wide state (handle table, local peers,
//     transports); util.go the shared helpers:
//     lookupEngine/lookupRegion, engine.addChild (children of an engine
//     die with it),
//     checkStructSize (versioned structs), copyOut (string results with
//     TENT_ERR_BUFFER_TOO_SMALL and the needed length).
//
// Caller memory (cmem.go): Go never holds a caller's pointer as a pointer.
// Every input struct, array and string is copied in with a fault-guarded
// read after checkAddr refused NULL-page and overflowing addresses (structs
// into mirrors whose pointer fields are uintptr); arrays are read in chunks
// of at most TENT_MAX_BATCH entries, validated as they come. Every
// out-parameter, handles included, is probed for writability before the
// export creates anything, and written last with a fault-guarded copy; if
// that write fails the export undoes what it created.
//
// # Adding a function
//
// Write tentgo_<name> in a Go file of this package (its cgo preamble is
// just #include "shim.h"), following tentgo_register; add the wrapper to
// shim.c following tent_register; add the name to exports.map and
// tests/c/symbols.h, and a case for each pointer parameter to
// tests/c/test_badinput.c (the suite fails without them). Check
// out-parameters with requireOut, optionalOut or sizedOut (cmem.go), so
// NULL is refused as everywhere else. New handle kinds get a parent
// (their engine) so tent_engine_destroy frees them.
//
// # Tests
//
// cgo is not allowed in _test.go files, so the C glue the Go tests need
// lives in capi/internal/capitest, a package only these tests import: it
// calls the public C functions, so the tests exercise the same path as C
// callers, and nothing of it is in libtent.so. The library has no test
// hooks: the tests reach each export's panic recovery through a handle
// table entry no export can use (TestPanicBecomesInternal), and check
// statically that every export defers the recovery first
// (TestEveryExportRecoversFirst). The C tests in tests/c call libtent.so
// itself; tests/c/test_badinput.c runs every function with bad pointers
// and counts, one process per case.
package main
