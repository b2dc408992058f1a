// Package host is host memory as a memory kind ("cpu"): detection (any
// address no other kind claims), NUMA node checks, allocations that
// same-host peers can map (sealed memfds), and fault-safe copies.
package host
