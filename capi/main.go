package main

// The public header lives in include/; every C file of the package sees it.

/*
#cgo CFLAGS: -I${SRCDIR}/../include -std=gnu11 -Wall -Wextra -Werror
*/
import "C"

// main is never called: the package is built with -buildmode=c-shared.
func main() {}

// exportsDigest is set by the Makefile to a checksum of exports.map, so a
// changed map forces a new link (Go caches links by flags).
var exportsDigest string

var _ = exportsDigest
