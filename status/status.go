package status

import (
	"errors"
	"fmt"
)

// Code is a tent status code. OK is zero, Pending is positive (not an error),
// every failure is negative. The values are part of the ABI: never renumber.
type Code int32

const (
	OK                Code = 0
	Pending           Code = 1
	InvalidArgument   Code = -1
	InvalidHandle     Code = -2
	Overlap           Code = -3
	AlreadyRegistered Code = -4
	NotRegistered     Code = -5
	Busy              Code = -6
	OutOfRange        Code = -7
	PermissionDenied  Code = -8
	NotFound          Code = -9
	Unsupported       Code = -10
	TransportError    Code = -11
	Timeout           Code = -12
	Closed            Code = -13
	NoMemory          Code = -14
	Internal          Code = -15
	Forked            Code = -16
	AuthFailed        Code = -17
	Protocol          Code = -18
	BufferTooSmall    Code = -19
	Canceled          Code = -20
	NameInUse         Code = -21
	VersionMismatch   Code = -22
)

// Entry describes one status code: its C name (without the TENT_ prefix) and
// the fixed text returned by tent_status_str.
type Entry struct {
	Code Code
	Name string
	Text string
}

// Table lists every status code once. include/tent.h, the C shim's
// tent_status_str, and the Python and C++ wrappers are checked against it.
var Table = []Entry{
	{OK, "OK", "success"},
	{Pending, "PENDING", "operation still in progress"},
	{InvalidArgument, "ERR_INVALID_ARGUMENT", "invalid argument"},
	{InvalidHandle, "ERR_INVALID_HANDLE", "invalid, stale or foreign handle"},
	{Overlap, "ERR_OVERLAP", "memory overlaps a registered or in-flight region"},
	{AlreadyRegistered, "ERR_ALREADY_REGISTERED", "exactly this memory is already registered"},
	{NotRegistered, "ERR_NOT_REGISTERED", "memory is not registered"},
	{Busy, "ERR_BUSY", "resource is busy"},
	{OutOfRange, "ERR_OUT_OF_RANGE", "range lies outside the registered memory"},
	{PermissionDenied, "ERR_PERMISSION_DENIED", "permission denied"},
	{NotFound, "ERR_NOT_FOUND", "not found"},
	{Unsupported, "ERR_UNSUPPORTED", "not supported"},
	{TransportError, "ERR_TRANSPORT", "transport error"},
	{Timeout, "ERR_TIMEOUT", "deadline exceeded"},
	{Closed, "ERR_CLOSED", "closed or uninstalled"},
	{NoMemory, "ERR_NO_MEMORY", "out of memory"},
	{Internal, "ERR_INTERNAL", "internal error"},
	{Forked, "ERR_FORKED", "called in a process forked after libtent was loaded"},
	{AuthFailed, "ERR_AUTH", "authentication failed"},
	{Protocol, "ERR_PROTOCOL", "malformed or unexpected message from a peer"},
	{BufferTooSmall, "ERR_BUFFER_TOO_SMALL", "output buffer too small"},
	{Canceled, "ERR_CANCELED", "canceled"},
	{NameInUse, "ERR_NAME_IN_USE", "name already in use"},
	{VersionMismatch, "ERR_VERSION_MISMATCH", "incompatible version"},
}

var byCode = func() map[Code]Entry {
	m := make(map[Code]Entry, len(Table))
	for _, e := range Table {
		m[e.Code] = e
	}
	return m
}()

// Lookup returns the table entry for c.
func Lookup(c Code) (Entry, bool) {
	e, ok := byCode[c]
	return e, ok
}

func (c Code) String() string {
	if e, ok := byCode[c]; ok {
		return e.Name
	}
	return fmt.Sprintf("Code(%d)", int32(c))
}

// Error is an error with a tent status code.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrOverlap) true for any *Error with that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinel errors, one per failure code, for errors.Is.
var (
	ErrInvalidArgument   = &Error{InvalidArgument, "invalid argument"}
	ErrInvalidHandle     = &Error{InvalidHandle, "invalid handle"}
	ErrOverlap           = &Error{Overlap, "overlapping registration"}
	ErrAlreadyRegistered = &Error{AlreadyRegistered, "already registered"}
	ErrNotRegistered     = &Error{NotRegistered, "not registered"}
	ErrBusy              = &Error{Busy, "busy"}
	ErrOutOfRange        = &Error{OutOfRange, "out of range"}
	ErrPermissionDenied  = &Error{PermissionDenied, "permission denied"}
	ErrNotFound          = &Error{NotFound, "not found"}
	ErrUnsupported       = &Error{Unsupported, "unsupported"}
	ErrTransport         = &Error{TransportError, "transport error"}
	ErrTimeout           = &Error{Timeout, "timeout"}
	ErrClosed            = &Error{Closed, "closed"}
	ErrNoMemory          = &Error{NoMemory, "out of memory"}
	ErrInternal          = &Error{Internal, "internal error"}
	ErrAuthFailed        = &Error{AuthFailed, "authentication failed"}
	ErrProtocol          = &Error{Protocol, "protocol error"}
	ErrBufferTooSmall    = &Error{BufferTooSmall, "buffer too small"}
	ErrCanceled          = &Error{Canceled, "canceled"}
	ErrNameInUse         = &Error{NameInUse, "name in use"}
	ErrVersionMismatch   = &Error{VersionMismatch, "version mismatch"}
)

// Errorf returns an error with code c and a formatted message. Use %w in
// format to keep a cause inspectable with errors.Is/As.
func Errorf(c Code, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &wrapped{code: c, err: err}
}

type wrapped struct {
	code Code
	err  error
}

func (w *wrapped) Error() string        { return w.err.Error() }
func (w *wrapped) Unwrap() error        { return w.err }
func (w *wrapped) Is(target error) bool { t, ok := target.(*Error); return ok && t.Code == w.code }

// CodeOf returns the status code carried by err: OK for nil, the code of the
// outermost coded error in its chain, or Internal for an error without one.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	if c, ok := find(err); ok {
		return c
	}
	return Internal
}

// HasCode reports whether err carries a status code anywhere in its chain.
func HasCode(err error) bool {
	_, ok := find(err)
	return ok
}

func find(err error) (Code, bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch v := e.(type) {
		case *wrapped:
			return v.code, true
		case *Error:
			return v.Code, true
		case interface{ Unwrap() []error }:
			for _, inner := range v.Unwrap() {
				if c, ok := find(inner); ok {
					return c, true
				}
			}
			return 0, false
		}
	}
	return 0, false
}
