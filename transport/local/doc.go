// Package local is the transport for peers in the same process (including
// an engine talking to itself): a direct copy between the two engines'
// registered memory. The target engine's registration table is consulted
// for every request, so a stale descriptor can never lead to a copy into
// memory the target has unregistered.
//
// Uninstall waits for copies in progress and fails later requests with
// ErrClosed.
package local
