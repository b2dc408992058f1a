// Package cuda binds the CUDA driver API without a CUDA toolkit: it
// dlopen()s libcuda.so.1 at run time and resolves the entry points it uses
// with dlsym, declaring the few types, enum values and struct layouts it
// needs itself (tent_cuda.h). A build machine needs no CUDA, and a process
// without a GPU runs with GPU features disabled.
//
// # Loading
//
// Load(path) loads a driver library once per path (the result, failure
// included, is cached; the library is never unloaded) and calls cuInit.
// Default() loads $TENT_CUDA_DRIVER, else libcuda.so.1, and caches the
// answer. Failures are status errors, never a crash or an exit:
//
//   - no library: status.Unsupported, "no CUDA driver (libcuda.so.1 not
//     found): GPU features disabled";
//   - no device (cuInit or cuDeviceGetCount says CUDA_ERROR_NO_DEVICE, or 0
//     devices): status.Unsupported, "no GPU: ...";
//   - a library lacking a required entry point, or whose cuInit fails
//     otherwise: status.Unsupported.
//
// Optional entry points only disable their feature (Features): the virtual
// memory management API (VMM: cuMemCreate, cuMemMap, ... — all or nothing),
// cuMemRetainAllocationHandle, fabric handles (VMM and a CUDA 12.3+ driver),
// cuLaunchHostFunc, cuPointerGetAttributes, cuDeviceGetUuid.
//
// # Errors
//
// A failed driver call is returned as a status error whose code is
// Result.Code() of the CUresult (CUDA_ERROR_INVALID_VALUE is
// status.InvalidArgument, CUDA_ERROR_OUT_OF_MEMORY status.NoMemory,
// CUDA_ERROR_NOT_SUPPORTED status.Unsupported, most others
// status.TransportError) and whose text names the call and the driver's
// name of the error:
//
//	cuMemMap(0x7f0000000000, 2097152, offset 0, 0x1234): CUDA_ERROR_INVALID_VALUE
//
// errors.As(err, &e) with e a *cuda.Error gives the call, the CUresult and
// the driver's name and description. When making the needed context current
// fails, the call reads "cuCtxSetCurrent (for ...)".
//
// # Contexts and threads
//
// tent uses the devices' primary contexts, shared with the CUDA runtime
// (PyTorch) in the same process. The Driver retains a device's primary
// context the first time a call needs it and keeps it until Close. Calls
// naming a device (MemAlloc, NewStream, CreateMapping, ImportMapping, ...)
// run in that device's context; calls naming none (Reserve, Map, Release,
// Memcpy, ...) run in the lowest device's context already retained, else
// device 0's. Device queries and pointer queries need no context.
//
// Goroutines move between OS threads, so a context cannot be made current
// from Go and relied on in a later call. Every C wrapper therefore makes the
// context current, calls the driver and restores the thread's previous
// current context, all inside one cgo call. The caller's thread (a Python
// thread calling into libtent, say) keeps the context it had.
//
// Streams and events belong to the device they were made on; their methods
// run in its context. Asynchronous copies take host addresses as uintptr:
// pinned or registered memory that stays valid until the copy is done,
// never Go memory. Stream.LaunchHostFunc runs a Go function on a driver
// thread when the work queued before it is done; it must be quick and must
// not call CUDA (it can signal a channel).
//
// # Lifetimes
//
// Who releases what, and in which order:
//
//   - An AllocHandle (Create, ImportFD, ImportFabric,
//     RetainAllocationHandle) is released with Release exactly once. The
//     memory lives on while a mapping of it remains, so the handle may be
//     released right after Map.
//   - A mapping (Map) is undone with Unmap of the whole mapped range, before
//     the reservation it lies in is freed.
//   - A reservation (Reserve) is freed with AddressFree of the whole
//     reserved range, after its mappings are unmapped.
//   - ExportFD returns a file descriptor the caller owns (close-on-exec
//     set): close it once it has been sent. ImportFD does not take the fd: the
//     caller closes it, and may do so right after the import.
//   - A Mapping (ImportMapping, ImportFabricMapping, CreateMapping) records
//     what it holds: the handle (HasHandle), the fd (FD, owned: ImportMapping
//     takes ownership of the fd it is given), the reservation (Addr,
//     Reserved), the mapped size (Mapped) and the device. Its Release undoes
//     exactly those steps in the order unmap, release handle, free
//     reservation, close fd; it is idempotent, and a step that fails stays
//     recorded for the next Release (the reservation is not freed while its
//     mapping could not be unmapped). A failed ImportMapping has already
//     undone its steps and closed the fd. CloseFD closes the fd early, so
//     that many long-lived mappings do not use up file descriptors.
//   - Streams and events are destroyed with Destroy (idempotent); MemAlloc
//     memory is freed with MemFree.
//   - Driver.Close releases the primary contexts, after everything above;
//     it is meant for tests and shutdown. The library itself is never
//     unloaded.
//
// # Testing without a GPU
//
// Package fakecuda is a fake driver (libfakecuda.so, built from C by the
// tests with gcc) that implements these entry points on host memory, with
// memfd-backed allocations that can be shared across processes, counters of
// live objects and fault injection. Load it with Load(fake.Path), or give a
// child process fake.Env() (TENT_CUDA_DRIVER) and use Default there.
//
// Package nvmlinfo discovers the GPU topology with NVML (go-nvml); package
// fakenvml is a fake NVML library for tests.
package cuda
