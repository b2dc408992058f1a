package cuda

// This file holds the one //export of the package; its preamble may only
// declare, so it includes nothing.

import "C"

import (
	"unsafe"

	pointer "github.com/mattn/go-pointer"
)

// tentCudaHostFn runs a function queued by Stream.LaunchHostFunc. The
// driver calls it, through driver.c's trampoline, on one of its threads.
//
//export tentCudaHostFn
func tentCudaHostFn(user unsafe.Pointer) {
	fn, _ := pointer.Restore(user).(func())
	pointer.Unref(user)
	if fn != nil {
		fn()
	}
}
