// Package fakecuda is a fake CUDA driver for tests on machines without a
// GPU, and the Go helpers that build, load and control it.
//
// # The library
//
// fakecuda.c is plain C, built into a tiny shared library that exports the
// driver entry points tent's cuda package resolves (cuInit, cuMemCreate,
// cuMemMap, cuMemcpyHtoD_v2, ...) and implements them on host memory:
//
//	gcc -shared -fPIC -O1 -o libfakecuda.so fakecuda.c -lpthread
//
// (fakecuda.mk has a make rule; Build and New run gcc, or $CC.) The
// "//go:build ignore" line at its top keeps cgo from compiling it into this
// package. Compiling with -DFAKECUDA_NO_VMM, -DFAKECUDA_NO_RETAIN or
// -DFAKECUDA_NO_HOSTFN leaves groups of symbols out, like an old driver
// (Without).
//
// What it does:
//
//   - N fake devices (default 2), compute capability 9.0, 80 GiB each,
//     PCI bus ids 0000:1A:00.0, 0000:1B:00.0, ... Before cuInit every call
//     but cuInit, cuDriverGetVersion and cuGetError* answers
//     CUDA_ERROR_NOT_INITIALIZED; with 0 devices cuInit answers
//     CUDA_ERROR_NO_DEVICE.
//   - Primary contexts are reference counted; the current context is
//     per thread. cuMemAlloc, cuMemFree, the copies and stream and event
//     creation need a current context (CUDA_ERROR_INVALID_CONTEXT), which
//     checks that tent makes one current in the same cgo call.
//   - cuMemCreate makes a memfd of the size (a multiple of the
//     granularity, default 2 MiB) named after the device and handle types;
//     exporting as a POSIX fd returns a dup of it; importing an fd dups it
//     into a new allocation handle (any fd that is not such a memfd is
//     CUDA_ERROR_INVALID_VALUE). So allocations can be shared across
//     processes (SCM_RIGHTS, exec.Cmd.ExtraFiles).
//   - Fabric handles work only when enabled (FAKECUDA_FABRIC=1 or
//     Fabric(true)); otherwise cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC and
//     fabric exports answer CUDA_ERROR_NOT_SUPPORTED and the device attribute
//     says unsupported. A fake fabric handle is 64 bytes holding a magic,
//     the exporter's pid and memfd number and the allocation id; it is
//     imported by opening /proc/<pid>/fd/<fd>, so it works in another process
//     of the same user while the exporter holds the allocation.
//   - cuMemAddressReserve is an mmap(PROT_NONE); cuMemMap an
//     mmap(MAP_FIXED|MAP_SHARED) of the memfd at the reserved address, still
//     PROT_NONE; cuMemSetAccess an mprotect; cuMemUnmap maps PROT_NONE back;
//     cuMemAddressFree munmaps. Copies are memmove (the asynchronous ones
//     too); streams and events are bookkeeping; cuEventQuery answers
//     CUDA_SUCCESS; cuLaunchHostFunc runs the function at once.
//   - cuMemGetHandleForAddressRange with a dmabuf fd handle returns a new
//     memfd named fakecuda-dmabuf:<addr>:<size> (hex) for a page-aligned
//     range inside one mapping or cuMemAlloc block; the fake libibverbs
//     reads the range back from the name (ibv_reg_dmabuf_mr), and
//     fakecuda_device_of tells it device memory (ibv_reg_mr).
//   - Pointer attributes come from the fake's tables: an address inside a
//     mapping or a cuMemAlloc block is device memory of its device.
//   - Everything runs under one mutex, so it is thread-safe.
//
// It validates arguments like the real driver where that is cheap, so that
// lifetime bugs in tent fail tests: releasing a released handle, unmapping
// what is not mapped (or part of a mapping), mapping outside a reservation
// or over a mapping, freeing a reservation that is not exactly one or that
// still has mappings (stricter than needed), copying to memory that is not
// mapped with access, destroying a stream or event twice, releasing a
// primary context more often than retained: each answers an error
// (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE,
// CUDA_ERROR_INVALID_CONTEXT) instead of crashing.
//
// # Environment (read when the library is loaded)
//
//	FAKECUDA_DEVICES         number of devices (default 2, at most 16)
//	FAKECUDA_GRANULARITY     allocation granularity in bytes, k/m suffix allowed
//	                         (default 2m; a power of two >= 4096)
//	FAKECUDA_FABRIC          1 enables fabric handles
//	FAKECUDA_DRIVER_VERSION  cuDriverGetVersion's answer (default 12080)
//	FAKECUDA_FAIL            failures to arm: fn:nth:err[:times][,...], e.g.
//	                         FAKECUDA_FAIL=cuMemMap:1:1 fails the first cuMemMap
//	                         with CUDA_ERROR_INVALID_VALUE
//
// # Counters and fault injection (fakecuda.h)
//
//	void fakecuda_counters(fakecuda_counters_t *out);
//	int  fakecuda_fail(const char *fn, int nth, int cuda_error);
//	int  fakecuda_fail_times(const char *fn, int nth, int times, int cuda_error);
//	void fakecuda_clear_failures(void);
//	void fakecuda_reset(void);
//	void fakecuda_config(int devices, unsigned long long granularity, int fabric);
//	void fakecuda_describe(char *buf, int len);
//
// The counters of live objects are: allocation handles not yet released,
// physical allocations (alive while a handle or a mapping holds them),
// address reservations, mappings, file descriptors the fake holds (one memfd
// per allocation), streams, events, primary context retains and cuMemAlloc
// blocks; the running totals are exported fds, calls and injected failures
// fired. fakecuda_fail makes the nth call from now (1: the next) to fn fail
// with cuda_error before it does anything; fn is the symbol name, a
// trailing "_v2" optional on both sides.
//
// # From Go
//
//	f := fakecuda.New(t, fakecuda.Granularity(64<<10)) // a fresh instance
//	d, err := cuda.Load(f.Path)                         // tent's bindings on it
//	defer d.Close()
//	f.Fail("cuMemMap", 1, 1)                            // next cuMemMap: INVALID_VALUE
//	...
//	f.AssertClean(t)                                    // no live objects but contexts
//
// New compiles the library once per process (and variant) and loads a copy
// from t.TempDir(): every copy is a separate instance with its own state and
// counters, so tests do not see each other's objects. A child process gets
// the same fake with cmd.Env = append(os.Environ(), f.Env()...) and calls
// cuda.Default(); Open(path) reaches the control API of an already loaded
// instance (in the child: Open(d.Path())).
package fakecuda
