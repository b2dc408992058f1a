// Package netaddr checks "host:port" strings completely before anything
// dials or listens on them, so that a malformed address is an invalid
// argument of the call that carried it, not a transport error from deep
// inside a dial.
package netaddr
