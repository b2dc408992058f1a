package main

import (
	"bytes"
	"runtime/debug"
	"unicode/utf8"
	"unsafe"

	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// Caller memory. Every pointer a C caller passes is an address (uintptr)
// here, and every read of it and write into it goes through this file:
//
//   - checkAddr refuses NULL-page and address-space-overflowing pointers up
//     front. Go reports a fault in the first page as a nil dereference
//     without the address, which would look like a bug of the library.
//   - the reads and writes themselves are fault-guarded copies
//     (memory/host), so an unmapped, PROT_NONE or read-only page is a
//     TENT_ERR_INVALID_ARGUMENT naming the argument, never a crash.
//   - out-parameters are probed for writability (probeWritable) before an
//     export creates anything, and the final write is guarded too, so an
//     export can undo what it created when the write still fails.
//
// Structs are copied into Go mirrors whose pointer fields are uintptr, so
// the Go runtime never holds a caller's (possibly garbage) pointer as a
// pointer.

// minAddr is the first address a caller's pointer may have: the NULL page
// is never mapped.
const minAddr = 4096

// maxAddr bounds the end of caller memory: no user address space (even
// with 5-level paging) reaches it.
const maxAddr = 1 << 57

// checkAddr checks that [a, a+n) can be user memory. NULL is an error here:
// callers handle the arguments where NULL means something first.
func checkAddr(a uintptr, n uintptr, what string) error {
	switch {
	case a == 0:
		return status.Errorf(status.InvalidArgument, "%s is NULL", what)
	case a < minAddr:
		return status.Errorf(status.InvalidArgument, "%s is %#x: not a valid pointer (inside the NULL page)", what, a)
	case uint64(n) > maxAddr || uint64(a) > maxAddr-uint64(n):
		return status.Errorf(status.InvalidArgument, "%s is %#x with %d bytes: past the end of the address space", what, a, uint64(n))
	}
	return nil
}

// faultIn names the argument whose memory faulted.
func faultIn(f *fault, what, access string) error {
	return status.Errorf(status.InvalidArgument, "%s: cannot %s the memory it points to (invalid memory at %#x)", what, access, f.addr)
}

// fault is a memory fault on caller memory.
type fault struct{ addr uintptr }

// guard runs f, turning a memory fault into a *fault; any other panic goes
// on to the export's recovery (a bug, reported as TENT_ERR_INTERNAL).
func guard(f func()) (flt *fault) {
	defer func() {
		if r := recover(); r != nil {
			a, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			flt = &fault{a.Addr()}
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	f()
	return nil
}

// bytesAt views n bytes of caller memory at a.
func bytesAt(a uintptr, n uint64) []byte { return host.Bytes(uint64(a), n) }

// readInto copies len(dst) bytes at a into dst.
func readInto(dst []byte, a uintptr, what string) error {
	if len(dst) == 0 {
		return nil
	}
	if err := checkAddr(a, uintptr(len(dst)), what); err != nil {
		return err
	}
	if f := guard(func() { copy(dst, bytesAt(a, uint64(len(dst)))) }); f != nil {
		return faultIn(f, what, "read")
	}
	return nil
}

// writeFrom copies src to a.
func writeFrom(a uintptr, src []byte, what string) error {
	if len(src) == 0 {
		return nil
	}
	if err := checkAddr(a, uintptr(len(src)), what); err != nil {
		return err
	}
	if f := guard(func() { copy(bytesAt(a, uint64(len(src))), src) }); f != nil {
		return faultIn(f, what, "write")
	}
	return nil
}

// readBytes copies n bytes at a.
func readBytes(a uintptr, n uint64, what string) ([]byte, error) {
	if err := checkAddr(a, uintptr(n), what); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	return b, readInto(b, a, what)
}

// asBytes views a Go value's memory; T must hold no Go pointers.
func asBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// readValue copies the T at a. T is a C struct without pointers or a
// mirror with uintptr fields.
func readValue[T any](a uintptr, what string) (T, error) {
	var v T
	return v, readInto(asBytes(&v), a, what)
}

// writeValue stores v at a.
func writeValue[T any](a uintptr, v T, what string) error {
	return writeFrom(a, asBytes(&v), what)
}

// pageSize is the smallest page a probe must touch once.
const pageSize = 4096

// probeWritable checks that [a, a+n) can be written, by writing back the
// first byte of each of its pages (through memmove, which the compiler
// cannot drop as a no-op store). The bytes are the out-parameter's own, so
// nothing else sees the write. Not an atomic add of zero: under the race
// detector atomics run in C, where a fault is not recoverable.
func probeWritable(a uintptr, n uint64, what string) error {
	if n == 0 {
		return nil
	}
	if err := checkAddr(a, uintptr(n), what); err != nil {
		return err
	}
	saved := make([]byte, 1)
	f := guard(func() {
		end := uint64(a) + n
		for p := uint64(a); p < end; p = (p &^ (pageSize - 1)) + pageSize {
			b := host.Bytes(p, 1)
			copy(saved, b)
			copy(b, saved)
		}
	})
	if f != nil {
		return faultIn(f, what, "write")
	}
	return nil
}

// Out-parameters follow one rule in every export (tent.h, Conventions):
//
//   - a required one that is NULL is INVALID_ARGUMENT "<name> is NULL"
//     (requireOut; errNull for in-out structs, whose size field is read
//     first);
//   - one documented "may be NULL" is skipped when NULL (optionalOut);
//   - a buffer or array passed with its size may be NULL only when the
//     size is 0: "<name> is NULL but <size> is N" (sizedOut);
//
// and every one is probed for writability before the export creates
// anything, so an unwritable one is INVALID_ARGUMENT naming it too.

// errNull is the error of a NULL argument that must not be NULL.
func errNull(what string) error {
	return status.Errorf(status.InvalidArgument, "%s is NULL", what)
}

// requireOut checks a required out-parameter of n bytes at a.
func requireOut(a uintptr, n uint64, what string) error {
	if a == 0 {
		return errNull(what)
	}
	return probeWritable(a, n, what)
}

// optionalOut checks an out-parameter of n bytes at a that may be NULL.
func optionalOut(a uintptr, n uint64, what string) error {
	if a == 0 {
		return nil
	}
	return probeWritable(a, n, what)
}

// sizedOut checks an output buffer or array at a whose caller-given size is
// size (named sizeName), of which the export may write the first n bytes.
func sizedOut(a uintptr, size uint64, sizeName string, n uint64, what string) error {
	if a == 0 && size != 0 {
		return status.Errorf(status.InvalidArgument, "%s is NULL but %s is %d", what, sizeName, size)
	}
	return probeWritable(a, n, what)
}

// maxStringLen bounds an input string that has no tighter documented bound
// (TENT_MAX_STRING_LEN in tent.h); a longer one is refused, not read on.
const maxStringLen = 4096

// readText is readString for names and addresses: they travel in JSON,
// etcd keys and every language's strings, where bytes that are no text do
// not round-trip, so text that is not valid UTF-8 is InvalidArgument.
func readText(a uintptr, max int, what string) (s string, set bool, err error) {
	s, set, err = readString(a, max, what)
	if err == nil && !utf8.ValidString(s) {
		return "", set, status.Errorf(status.InvalidArgument, "%s %q is not valid UTF-8", what, s)
	}
	return s, set, err
}

// readString copies the NUL-terminated string at a, of at most max bytes
// without the NUL. NULL is "" with set false. It reads page by page, so it
// never touches memory past the terminator's page.
func readString(a uintptr, max int, what string) (s string, set bool, err error) {
	if a == 0 {
		return "", false, nil
	}
	if err := checkAddr(a, 1, what); err != nil {
		return "", true, err
	}
	var out []byte
	terminated := false
	f := guard(func() {
		p := uint64(a)
		for len(out) <= max && p < maxAddr {
			chunk := min(pageSize-p%pageSize, uint64(max+1-len(out)))
			b := host.Bytes(p, chunk)
			if i := bytes.IndexByte(b, 0); i >= 0 {
				out = append(out, b[:i]...)
				terminated = true
				return
			}
			out = append(out, b...)
			p += chunk
		}
	})
	switch {
	case f != nil:
		return "", true, faultIn(f, what, "read")
	case !terminated:
		return "", true, status.Errorf(status.InvalidArgument, "%s is longer than %d bytes (or not NUL-terminated)", what, max)
	}
	return string(out), true, nil
}

// readArray reads n elements of T at a in chunks and hands each to visit,
// so a caller's n is never trusted for an allocation: a bad n fails at the
// first unreadable chunk, or at max.
func readArray[T any](a uintptr, n uint64, max uint64, what string, visit func(i int, v *T) error) error {
	return readArrayVia(a, n, max, what, nil, visit)
}

// readChunk is how many entries readArray copies in at a time.
const readChunk = 256

// readArrayVia is readArray copying through *scratch, which it grows to a
// chunk's worth as needed and leaves for the caller to reuse (nil: a
// buffer of its own).
func readArrayVia[T any](a uintptr, n uint64, max uint64, what string, scratch *[]T, visit func(i int, v *T) error) error {
	if n == 0 {
		return nil
	}
	if n > max {
		return status.Errorf(status.InvalidArgument, "n is %d: at most %d entries of %s", n, max, what)
	}
	var zero T
	size := uint64(unsafe.Sizeof(zero))
	if err := checkAddr(a, uintptr(n*size), what); err != nil {
		return err
	}
	var buf []T
	if scratch == nil {
		buf = make([]T, min(n, readChunk))
	} else {
		if uint64(cap(*scratch)) < min(n, readChunk) {
			*scratch = make([]T, min(n, readChunk))
		}
		buf = (*scratch)[:cap(*scratch)]
	}
	const chunkLen = readChunk
	for done := uint64(0); done < n; {
		k := min(n-done, chunkLen)
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), k*size)
		if err := readInto(raw, a+uintptr(done*size), what); err != nil {
			return err
		}
		for j := uint64(0); j < k; j++ {
			if err := visit(int(done+j), &buf[j]); err != nil {
				return err
			}
		}
		done += k
	}
	return nil
}

// outRange is caller memory an export may write: n bytes of an out-parameter.
type outRange struct {
	addr uintptr
	n    uint64
	what string
}

// disjoint refuses out-parameters that overlap: one result would overwrite
// another (an address over a handle, a length over a message), so the
// caller would lose it without an error. Called after the probes, which
// bound every range inside the address space; NULL and empty ones never
// overlap.
func disjoint(outs ...outRange) error {
	for i, a := range outs {
		for _, b := range outs[i+1:] {
			if a.addr == 0 || b.addr == 0 || a.n == 0 || b.n == 0 {
				continue
			}
			if uint64(a.addr) < uint64(b.addr)+b.n && uint64(b.addr) < uint64(a.addr)+a.n {
				return status.Errorf(status.InvalidArgument,
					"%s (%d bytes at %#x) and %s (%d bytes at %#x) overlap: each needs memory of its own",
					a.what, a.n, a.addr, b.what, b.n, b.addr)
			}
		}
	}
	return nil
}

// writeStruct writes v, a struct of this library's layout, to the caller's
// versioned out-struct at a, whose size field says it is size bytes: the
// bytes past what this library knows (a newer caller's fields) are zeroed,
// so such a caller reads "not set" there, not its own garbage. The whole
// struct is probed first, so a failure leaves it untouched.
func writeStruct[T any](a uintptr, size uint32, v T, what string) error {
	if err := probeWritable(a, uint64(size), what); err != nil {
		return err
	}
	b := make([]byte, size)
	copy(b, asBytes(&v))
	return writeFrom(a, b, what)
}
