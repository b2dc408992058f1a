package host

// Raw addresses of registered memory (which the Go runtime does not own)
// become byte slices here, in one audited place.

import (
	"fmt"
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

// Fault is the error of a memory fault that Copy or Guard caught: status
// InvalidArgument (the caller's memory is gone), and a type of its own so
// that a caller whose guard also covers its own code can tell a fault
// from its other errors and report it loudly (a fault there may be a bug).
type Fault struct {
	Addr uintptr // the faulting address
}

func (f *Fault) Error() string {
	return fmt.Sprintf("registered memory at %#x is not mapped (freed or unmapped without being unregistered)", f.Addr)
}

// Unwrap gives the fault its status code.
func (f *Fault) Unwrap() error { return status.ErrInvalidArgument }

func faultError(r any) error {
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		return &Fault{Addr: f.Addr()}
	}
	panic(r) // not a memory fault: a bug, let the caller's recovery see it
}
