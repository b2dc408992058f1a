package fakecuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "fakecuda.h"

typedef void (*fc_counters_fn)(fakecuda_counters_t *);
typedef int (*fc_fail_times_fn)(const char *, int, int, int);
typedef void (*fc_void_fn)(void);
typedef void (*fc_config_fn)(int, unsigned long long, int);
typedef void (*fc_describe_fn)(char *, int);

static void fc_counters(void *f, fakecuda_counters_t *out) { ((fc_counters_fn)f)(out); }
static int fc_fail_times(void *f, const char *fn, int nth, int times, int err) {
	return ((fc_fail_times_fn)f)(fn, nth, times, err);
}
static void fc_void(void *f) { ((fc_void_fn)f)(); }
static void fc_config(void *f, int devices, unsigned long long gran, int fabric) {
	((fc_config_fn)f)(devices, gran, fabric);
}
static void fc_describe(void *f, char *buf, int len) { ((fc_describe_fn)f)(buf, len); }

static void *fc_open(const char *path, char *err, int errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}
*/
import "C"

import (
	"embed"
	"fmt"
	"github.com/tent-dev/tent/internal/cshared"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

//go:embed fakecuda.c fakecuda.h
var sources embed.FS

// LibName is the file name Build and New give the library.
const LibName = "libfakecuda.so"

// Variants of the library, for testing how tent copes with older drivers:
// each leaves a group of symbols out.
const (
	WithoutVMM     = "FAKECUDA_NO_VMM"    // no cuMemCreate & co.
	WithoutRetain  = "FAKECUDA_NO_RETAIN" // no cuMemRetainAllocationHandle
	WithoutHostFns = "FAKECUDA_NO_HOSTFN" // no cuLaunchHostFunc
)

// Build compiles the fake driver into dir/libfakecuda.so with gcc ($CC if
// set), defining each of defines (WithoutVMM, ...), and returns its path.
func Build(dir string, defines ...string) (string, error) {
	for _, name := range []string{"fakecuda.c", "fakecuda.h"} {
		b, err := sources.ReadFile(name)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return "", err
		}
	}
	out := filepath.Join(dir, LibName)
	err := cshared.Build(cshared.Library{Source: filepath.Join(dir, "fakecuda.c"), Out: out, Defines: defines, Libs: []string{"-lpthread"}})
	if err != nil {
		return "", fmt.Errorf("fakecuda: %w", err)
	}
	return out, nil
}

var (
	buildMu    sync.Mutex
	buildCache = map[string][]byte{}
)

// image returns the compiled library for defines, building it once per
// process.
func image(defines []string) ([]byte, error) {
	key := append([]string(nil), defines...)
	sort.Strings(key)
	k := strings.Join(key, ",")
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[k]; ok {
		return b, nil
	}
	dir, err := os.MkdirTemp("", "fakecuda-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p, err := Build(dir, defines...)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	buildCache[k] = b
	return b, nil
}

// Fake is one loaded instance of the fake driver. Each library file is a
// separate instance with its own state, so every New gets a fresh fake.
type Fake struct {
	// Path of the library: pass it to cuda.Load, or set TENT_CUDA_DRIVER
	// to it (Env) in a child process.
	Path string

	devices     int
	granularity uint64
	fabric      bool

	h                                                           unsafe.Pointer
	counters, failTimes, clearFailures, reset, config, describe unsafe.Pointer
}

// Option configures New.
type Option func(*options)

type options struct {
	devices     int
	granularity uint64
	fabric      bool
	defines     []string
}

// Devices sets the number of fake devices (default 2; 0 makes cuInit
// answer CUDA_ERROR_NO_DEVICE).
func Devices(n int) Option { return func(o *options) { o.devices = n } }

// Granularity sets the allocation granularity (default 2 MiB; a power of
// two of at least 4096). Tests keep it small, e.g. 64 KiB.
func Granularity(g uint64) Option { return func(o *options) { o.granularity = g } }

// Fabric makes fabric handles work (off by default).
func Fabric(on bool) Option { return func(o *options) { o.fabric = on } }

// Without builds a variant lacking some symbols (WithoutVMM, ...).
func Without(defines ...string) Option {
	return func(o *options) { o.defines = append(o.defines, defines...) }
}

// New builds (once per process and variant) and loads a fresh instance of
// the fake driver from a copy in t.TempDir(). The instance stays loaded
// after the test (a CUDA driver is never unloaded), but its file goes.
func New(t testing.TB, opts ...Option) *Fake {
	t.Helper()
	o := options{devices: 2, granularity: 2 << 20}
	for _, opt := range opts {
		opt(&o)
	}
	img, err := image(o.defines)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), LibName)
	if err := os.WriteFile(path, img, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Config(o.devices, o.granularity, o.fabric)
	return f
}

// Open loads the fake driver at path (the same instance a cuda.Load of
// that path uses) to reach its control API; a child process uses it to
// read the counters of the fake it was started with.
func Open(path string) (*Fake, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [256]C.char
	h := C.fc_open(cpath, &errbuf[0], C.int(len(errbuf)))
	if h == nil {
		return nil, fmt.Errorf("fakecuda: dlopen %s: %s", path, C.GoString(&errbuf[0]))
	}
	f := &Fake{Path: path, h: h, devices: -1}
	for _, s := range []struct {
		name string
		p    *unsafe.Pointer
	}{
		{"fakecuda_counters", &f.counters},
		{"fakecuda_fail_times", &f.failTimes},
		{"fakecuda_clear_failures", &f.clearFailures},
		{"fakecuda_reset", &f.reset},
		{"fakecuda_config", &f.config},
		{"fakecuda_describe", &f.describe},
	} {
		cname := C.CString(s.name)
		*s.p = C.dlsym(h, cname)
		C.free(unsafe.Pointer(cname))
		if *s.p == nil {
			return nil, fmt.Errorf("fakecuda: %s lacks %s: not a fake driver", path, s.name)
		}
	}
	return f, nil
}

// Config is fakecuda_config: devices (negative keeps), granularity (0
// keeps) and fabric. Call it before cuda.Load.
func (f *Fake) Config(devices int, granularity uint64, fabric bool) {
	fab := 0
	if fabric {
		fab = 1
	}
	C.fc_config(f.config, C.int(devices), C.ulonglong(granularity), C.int(fab))
	if devices >= 0 {
		f.devices = devices
	}
	if granularity != 0 {
		f.granularity = granularity
	}
	f.fabric = fabric
}

// Env is the environment a child process needs to use this fake through
// cuda.Default: TENT_CUDA_DRIVER and the FAKECUDA_* settings.
func (f *Fake) Env() []string {
	env := []string{"TENT_CUDA_DRIVER=" + f.Path}
	if f.devices >= 0 {
		env = append(env, "FAKECUDA_DEVICES="+strconv.Itoa(f.devices))
	}
	if f.granularity != 0 {
		env = append(env, "FAKECUDA_GRANULARITY="+strconv.FormatUint(f.granularity, 10))
	}
	fab := "0"
	if f.fabric {
		fab = "1"
	}
	return append(env, "FAKECUDA_FABRIC="+fab)
}

// Counters mirrors fakecuda_counters_t.
type Counters struct {
	// live objects
	Handles      int64 // allocation handles not yet released
	Allocations  int64 // physical allocations alive
	Reservations int64 // address reservations not yet freed
	Mappings     int64 // mappings not yet unmapped
	FDs          int64 // file descriptors the fake holds
	Streams      int64
	Events       int64
	Contexts     int64 // primary context retains not yet released
	MemAllocs    int64 // cuMemAlloc blocks not yet freed

	// running totals
	ExportedFDs int64
	Calls       int64
	Failures    int64 // injected failures that fired
}

// Counters reads the fake's counters.
func (f *Fake) Counters() Counters {
	var c C.fakecuda_counters_t
	C.fc_counters(f.counters, &c)
	return Counters{
		Handles: int64(c.handles), Allocations: int64(c.allocations), Reservations: int64(c.reservations),
		Mappings: int64(c.mappings), FDs: int64(c.fds), Streams: int64(c.streams), Events: int64(c.events),
		Contexts: int64(c.contexts), MemAllocs: int64(c.mem_allocs),
		ExportedFDs: int64(c.exported_fds), Calls: int64(c.calls), Failures: int64(c.failures),
	}
}

// Leaks describes the live objects other than primary contexts ("" when
// there are none): contexts stay retained until cuda.Driver.Close.
func (c Counters) Leaks() string {
	var parts []string
	add := func(name string, v int64) {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, v))
		}
	}
	add("handles", c.Handles)
	add("allocations", c.Allocations)
	add("reservations", c.Reservations)
	add("mappings", c.Mappings)
	add("fds", c.FDs)
	add("streams", c.Streams)
	add("events", c.Events)
	add("mem_allocs", c.MemAllocs)
	return strings.Join(parts, " ")
}

// Describe lists the fake's live objects, one a line.
func (f *Fake) Describe() string {
	buf := make([]C.char, 1<<16)
	C.fc_describe(f.describe, &buf[0], C.int(len(buf)))
	return C.GoString(&buf[0])
}

// Fail makes the nth call (1: the next) from now to the CUDA function fn
// ("cuMemMap"; a trailing _v2 is optional) fail with CUresult cudaErr.
func (f *Fake) Fail(fn string, nth int, cudaErr int) { f.FailTimes(fn, nth, 1, cudaErr) }

// FailTimes makes `times` consecutive calls to fn fail, from the nth on.
func (f *Fake) FailTimes(fn string, nth, times int, cudaErr int) {
	cfn := C.CString(fn)
	defer C.free(unsafe.Pointer(cfn))
	if C.fc_fail_times(f.failTimes, cfn, C.int(nth), C.int(times), C.int(cudaErr)) != 0 {
		panic(fmt.Sprintf("fakecuda: cannot arm failure %s:%d:%d (table full or bad arguments)", fn, nth, cudaErr))
	}
}

// ClearFailures drops every armed failure.
func (f *Fake) ClearFailures() { C.fc_void(f.clearFailures) }

// Reset frees every live object and zeroes the counters (configuration
// and cuInit state stay). A cuda.Driver on this fake holds contexts: Close
// it before Reset.
func (f *Fake) Reset() { C.fc_void(f.reset) }

// AssertClean fails t when the fake has live objects other than primary
// contexts.
func (f *Fake) AssertClean(t testing.TB) {
	t.Helper()
	if leaks := f.Counters().Leaks(); leaks != "" {
		t.Errorf("fakecuda: live objects: %s\n%s", leaks, f.Describe())
	}
}
