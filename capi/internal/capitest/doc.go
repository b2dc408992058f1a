// Package capitest calls the public C functions of include/tent.h from Go,
// for capi's tests: they then exercise exactly the path a C caller takes
// (shim.c, the Go export, and back), taking and returning handles as
// integer ids.
//
// Why a package of its own: cgo is not allowed in _test.go files, so the C
// glue cannot live in capi's tests, and in capi's library files it would
// be test code shipped in libtent.so. Here it is a package nothing but
// capi's tests imports. It declares the tent_* functions through tent.h
// and does not define them: they are resolved when the package is linked
// into capi's test binary, where shim.c defines them. Linked into anything
// else it fails with undefined symbols, so it cannot end up in a product
// by accident. (A build tag would instead need every `go test ./capi/...`
// to pass the tag.)
//
// Every call runs on a locked OS thread and reads tent_last_error there,
// so a Result's message is the one its call left.
package capitest
