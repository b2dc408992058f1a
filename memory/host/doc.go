// Package host is host memory as a memory kind ("cpu"): detection (any
// address no other kind claims), NUMA node checks, allocations that
// same-host peers can map (sealed memfds), and fault-safe copies.
//
// It is also the one audited place where raw addresses of registered
// memory, which the Go runtime does not own, become byte slices (Bytes,
// Addr), and where touching them is guarded so that memory its owner
// unmapped without unregistering is an error instead of a crash of the
// process (Copy, Guard). Subpackage slab hands out blocks of host memory
// outside the Go heap.
package host
