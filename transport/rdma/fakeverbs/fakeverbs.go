package fakeverbs

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

typedef int (*counts_fn)(int *, int);

// Reads the counters of the library at path if this process has it loaded.
static const char *read_counts(const char *path, int *out, int n) {
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) return "not loaded in this process";
	counts_fn f = (counts_fn)dlsym(h, "fakeverbs_counts");
	if (f == NULL) {
		dlclose(h);
		return "no fakeverbs_counts: not the fake library";
	}
	f(out, n);
	dlclose(h);
	return NULL;
}
*/
import "C"

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"github.com/tent-dev/tent/internal/cshared"
)

// Env names the fake reads.
const (
	DevicesEnv   = "FAKEVERBS_DEVICES"
	StateEnv     = "FAKEVERBS_STATE"
	FailEnv      = "FAKEVERBS_FAIL"
	LinkLayerEnv = "FAKEVERBS_LINK_LAYER"
	SysfsEnv     = "FAKEVERBS_SYSFS"
	CUDAEnv      = "FAKEVERBS_CUDA"
	PeerMemEnv   = "FAKEVERBS_PEERMEM"
)

// sourceDir is csrc next to this file, found at run time so that tests of
// any package (and helper processes) can build the fake.
func sourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "csrc")
}

// BuildTo compiles the fake into out (a path ending in libibverbs.so.1 by
// convention), exporting the versioned symbols the real library exports.
func BuildTo(out string) error {
	dir := sourceDir()
	return cshared.Build(cshared.Library{
		Source: filepath.Join(dir, "fakeverbs.c"),
		Out:    out,
		Soname: "libibverbs.so.1",
		Libs:   []string{"-Wl,--version-script=" + filepath.Join(dir, "fakeverbs.map"), "-lpthread"},
	})
}

// Build compiles the fake into a fresh temporary directory of t and returns
// the library's path. Each call gives a separate library (separate state
// once loaded).
func Build(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "libibverbs.so.1")
	if err := BuildTo(out); err != nil {
		t.Fatalf("building the fake libibverbs: %v", err)
	}
	return out
}

// Live is the number of live objects of each kind in one process's fake.
type Live struct {
	Contexts, PDs, MRs, CQs, QPs, DeviceLists int
}

// Zero reports whether nothing is alive.
func (l Live) Zero() bool { return l == Live{} }

// Counts reads the live-object counters of the fake at path as loaded in
// this process (an error when it is not loaded).
func Counts(path string) (Live, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var v [6]C.int
	if reason := C.read_counts(cpath, &v[0], 6); reason != nil {
		return Live{}, fmt.Errorf("fakeverbs counts of %s: %s", path, C.GoString(reason))
	}
	return Live{Contexts: int(v[0]), PDs: int(v[1]), MRs: int(v[2]), CQs: int(v[3]), QPs: int(v[4]), DeviceLists: int(v[5])}, nil
}
