// Package handles maps the opaque handles given to C callers to Go objects.
//
// A handle is a non-zero uint64 taken from one process-wide counter that only
// grows, so an id is never reused: a destroyed (stale) handle, a handle of
// another kind (foreign), or a made-up value is reported as ErrInvalidHandle,
// never a crash and never a different object. The C shim turns ids into
// typed pointers (tent_engine*, tent_region*, ...) and back; Go code never
// hands a Go pointer to C.
//
// Each entry may name a parent handle (a region's engine), so destroying an
// engine invalidates everything created through it in one step.
package handles
