package forward

/*
#cgo LDFLAGS: -ldl
#include "forward.h"
*/
import "C"

// LibraryName is the NVML library the forwarders open.
const LibraryName = C.TENT_NVML_LIBRARY

// LibraryState says whether the forwarders looked for the NVML library
// yet (Unopened) and whether they found it (Found, NotFound).
type LibraryState int

// The states of the NVML library as the forwarders see it.
const (
	Unopened LibraryState = -1
	NotFound LibraryState = 0
	Found    LibraryState = 1
)

// State reports what the first NVML call found: the library is opened
// once per process, when the first forwarder runs.
func State() LibraryState { return LibraryState(C.tent_nvml_library_state()) }
