package core

import (
	"testing"
	"unsafe"
)

// A batch allocates one Request per request: its size is the batch's
// allocation per request, and a field added or moved carelessly (padding
// around a bool) grows every batch.
func TestRequestSize(t *testing.T) {
	if got := unsafe.Sizeof(Request{}); got != 136 {
		t.Fatalf("Request is %d bytes, want 136", got)
	}
}
