package main

import "unsafe"

func unsafeAddr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
