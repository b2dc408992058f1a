// Package multihost tests engines on different "hosts" of one machine:
// network namespaces joined by a veth pair, each with its own address and
// machine id. It checks that traffic between them goes over tcp, that a
// wrong or missing secret is refused, and that no same-host capability
// (a memfd, a CUDA fd) ever reaches the other host, while an engine in
// the target's own namespace does get the memfd of a read-write
// allocation (so the counters can tell).
//
// The test needs root and iproute2 (`ip`) and is built with the
// "multihost" tag: make test-multihost. Without root or `ip` it skips,
// appending the reason to the file named by TENT_SKIP_LOG, and fails
// when CI=true.
package multihost
