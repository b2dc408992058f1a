package cuda

import (
	"fmt"

	"github.com/tent-dev/tent/status"
)

// Result is a CUDA driver API result code (CUresult).
type Result int32

// The CUresult values tent looks at. Any other value is still reported, by
// the name the driver gives it.
const (
	Success                   Result = 0
	ErrorInvalidValue         Result = 1
	ErrorOutOfMemory          Result = 2
	ErrorNotInitialized       Result = 3
	ErrorDeinitialized        Result = 4
	ErrorStubLibrary          Result = 34
	ErrorDeviceUnavailable    Result = 46
	ErrorNoDevice             Result = 100
	ErrorInvalidDevice        Result = 101
	ErrorDeviceNotLicensed    Result = 102
	ErrorInvalidContext       Result = 201
	ErrorAlreadyMapped        Result = 208
	ErrorNotMapped            Result = 211
	ErrorOperatingSystem      Result = 304
	ErrorInvalidHandle        Result = 400
	ErrorIllegalState         Result = 401
	ErrorNotFound             Result = 500
	ErrorNotReady             Result = 600
	ErrorIllegalAddress       Result = 700
	ErrorLaunchFailed         Result = 719
	ErrorNotPermitted         Result = 800
	ErrorNotSupported         Result = 801
	ErrorSystemNotReady       Result = 802
	ErrorSystemDriverMismatch Result = 803
	ErrorCompatNotSupported   Result = 804
	ErrorTimeout              Result = 909
	ErrorUnknown              Result = 999
)

var resultNames = map[Result]string{
	Success:                   "CUDA_SUCCESS",
	ErrorInvalidValue:         "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:          "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:       "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:        "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:          "CUDA_ERROR_STUB_LIBRARY",
	ErrorDeviceUnavailable:    "CUDA_ERROR_DEVICE_UNAVAILABLE",
	ErrorNoDevice:             "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:        "CUDA_ERROR_INVALID_DEVICE",
	ErrorDeviceNotLicensed:    "CUDA_ERROR_DEVICE_NOT_LICENSED",
	ErrorInvalidContext:       "CUDA_ERROR_INVALID_CONTEXT",
	ErrorAlreadyMapped:        "CUDA_ERROR_ALREADY_MAPPED",
	ErrorNotMapped:            "CUDA_ERROR_NOT_MAPPED",
	ErrorOperatingSystem:      "CUDA_ERROR_OPERATING_SYSTEM",
	ErrorInvalidHandle:        "CUDA_ERROR_INVALID_HANDLE",
	ErrorIllegalState:         "CUDA_ERROR_ILLEGAL_STATE",
	ErrorNotFound:             "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:             "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:       "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorLaunchFailed:         "CUDA_ERROR_LAUNCH_FAILED",
	ErrorNotPermitted:         "CUDA_ERROR_NOT_PERMITTED",
	ErrorNotSupported:         "CUDA_ERROR_NOT_SUPPORTED",
	ErrorSystemNotReady:       "CUDA_ERROR_SYSTEM_NOT_READY",
	ErrorSystemDriverMismatch: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	ErrorCompatNotSupported:   "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	ErrorTimeout:              "CUDA_ERROR_TIMEOUT",
	ErrorUnknown:              "CUDA_ERROR_UNKNOWN",
}

// String returns the CUDA name of r from tent's own table (the driver may
// know more names; errors returned by Driver methods use the driver's).
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int32(r))
}

// Code is the tent status code a failed driver call is reported with.
func (r Result) Code() status.Code {
	switch r {
	case Success:
		return status.OK
	case ErrorInvalidValue, ErrorInvalidDevice, ErrorInvalidHandle, ErrorNotMapped:
		return status.InvalidArgument
	case ErrorOutOfMemory:
		return status.NoMemory
	case ErrorDeinitialized:
		return status.Closed
	case ErrorNoDevice, ErrorStubLibrary, ErrorNotSupported, ErrorSystemNotReady,
		ErrorSystemDriverMismatch, ErrorCompatNotSupported, ErrorDeviceNotLicensed:
		return status.Unsupported
	case ErrorNotPermitted:
		return status.PermissionDenied
	case ErrorNotFound:
		return status.NotFound
	case ErrorNotReady, ErrorDeviceUnavailable:
		return status.Busy
	case ErrorAlreadyMapped:
		return status.Overlap
	case ErrorTimeout:
		return status.Timeout
	}
	return status.TransportError
}

// Error is a failed CUDA driver call. Driver methods return it wrapped in a
// tent status error (status.CodeOf gives Result.Code()); errors.As finds it.
type Error struct {
	Call   string // the call and its main arguments: "cuMemMap(0x7f12..., 2097152)"
	Result Result // the CUresult
	Name   string // the driver's name for Result: "CUDA_ERROR_INVALID_VALUE"
	Text   string // the driver's description, when it gives one
}

func (e *Error) Error() string { return e.Call + ": " + e.Name }

// newError wraps a failed call's result as a status error.
func newError(call string, r Result, name, text string) error {
	if name == "" {
		name = r.String()
	}
	return status.Errorf(r.Code(), "%w", &Error{Call: call, Result: r, Name: name, Text: text})
}
