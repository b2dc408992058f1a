package verbs

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "loader.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// DefaultLibrary is the soname opened when Open is given no path.
const DefaultLibrary = "libibverbs.so.1"

// LibraryEnv names a path that Open uses instead of DefaultLibrary. Tests set
// it to the fake library, or to a missing file to see the "no library" path
// on a machine that has libibverbs installed.
const LibraryEnv = "TENT_RDMA_VERBS_LIBRARY"

// ErrNoDevice is what Devices returns when the library lists none.
var ErrNoDevice = errors.New("no RDMA device")

// Library is an opened libibverbs. Close releases it.
type Library struct {
	lib  C.tent_verbs_lib
	path string
}

// Open dlopens path (DefaultLibrary when empty). The error carries the
// loader's reason (no such file, missing symbol).
func Open(path string) (*Library, error) {
	if path == "" {
		path = DefaultLibrary
	}
	l := &Library{path: path}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if reason := C.tent_verbs_open(cpath, &l.lib); reason != nil {
		return nil, fmt.Errorf("%s: %s", path, C.GoString(reason))
	}
	return l, nil
}

// Devices lists the names of the devices the library reports, or ErrNoDevice.
func (l *Library) Devices() ([]string, error) {
	var n C.int
	list := C.tent_verbs_list(&l.lib, &n)
	if list == nil {
		return nil, fmt.Errorf("%s: ibv_get_device_list failed", l.path)
	}
	defer C.tent_verbs_free_list(&l.lib, list)
	names := make([]string, 0, int(n))
	for i := 0; i < int(n); i++ {
		names = append(names, C.GoString(C.tent_verbs_name(&l.lib, list, C.int(i))))
	}
	if len(names) == 0 {
		return nil, ErrNoDevice
	}
	return names, nil
}

// Close dlcloses the library.
func (l *Library) Close() { C.tent_verbs_close(&l.lib) }

// LibraryPath is the library Open should be given: LibraryEnv's value when
// set, else DefaultLibrary.
func LibraryPath(getenv func(string) string) string {
	if p := getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibrary
}
