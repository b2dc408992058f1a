package main

// The public header lives in include/; every C file of the package sees it.

/*
#cgo CFLAGS: -I${SRCDIR}/../include -std=gnu11 -Wall -Wextra -Werror
*/
import "C"

// main is never called: the package is built with -buildmode=c-shared.
func main() {}
