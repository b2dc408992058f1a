//go:build !tentinvariants

package slab

// invariants is off: Alloc and Free never touch block memory.
const invariants = false

func poison([]byte) {}

func checkPoison([]byte) (int, bool) { return -1, true }
