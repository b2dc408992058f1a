package host

// Raw addresses of registered memory (which the Go runtime does not own)
// become byte slices here, in one audited place.

import (
	"runtime/debug"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

// Bytes returns the n bytes at addr as a slice. addr must point to memory
// that stays mapped while the slice is used; the engine guarantees that by
// holding the region (Engine.Acquire) for the duration of a transfer.
func Bytes(addr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	// Reinterpret instead of converting uintptr -> unsafe.Pointer, which vet
	// flags: the address is foreign memory the GC never moves or frees.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Addr returns the address of the first byte of b.
func Addr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

// Copy copies src into dst like the builtin, but a fault on either side
// (registered memory that the owner unmapped without unregistering) is an
// error instead of a crash of the whole process.
func Copy(dst, src []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = faultError(r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return copy(dst, src), nil
}

// Guard runs f with faults on foreign memory turned into an error; for
// code paths that touch registered memory in other ways than Copy (a
// socket read into it, a checksum).
func Guard(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = faultError(r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return f()
}

func faultError(r any) error {
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		return status.Errorf(status.InvalidArgument,
			"registered memory at %#x is not mapped (freed or unmapped without being unregistered)", f.Addr())
	}
	panic(r) // not a memory fault: a bug, let the caller's recovery see it
}
