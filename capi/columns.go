package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// columns is a batch given as three parallel arrays of n uint64 words
// (local addresses, remote addresses, lengths) of one opcode to one
// segment: what tent_transfer_columns and tent_transfer_columns_sync read.
type columns struct {
	opcode                 C.uint32_t
	segment                C.uint64_t
	local, remote, lengths uintptr
	n                      C.size_t
}

// submit reads the columns and submits them as a batch. The checks that
// do not depend on a request come first, so a bad n, opcode or segment
// fails before anything is read; each column is then read in chunks
// (readArray), and core.Submit checks every request as for tent_transfer.
func (c columns) submit(e *engine, opts uintptr, waiting bool) (*core.Batch, error) {
	switch {
	case c.n == 0:
		return nil, status.Errorf(status.InvalidArgument, "n is 0: a transfer has at least one request")
	case c.n > maxBatch:
		return nil, status.Errorf(status.InvalidArgument,
			"n is %d: a transfer has at most TENT_MAX_BATCH = %d requests", uint64(c.n), maxBatch)
	case c.opcode > C.uint32_t(core.OpWrite):
		return nil, status.Errorf(status.InvalidArgument, "unknown opcode %d", uint32(c.opcode))
	}
	for _, a := range [...]struct {
		p    uintptr
		what string
	}{{c.local, "local_addrs"}, {c.remote, "remote_addrs"}, {c.lengths, "lengths"}} {
		if a.p == 0 {
			return nil, status.Errorf(status.InvalidArgument, "%s is NULL", a.what)
		}
	}
	s, err := lookupSegment(e, uint64(c.segment))
	if err != nil {
		return nil, err
	}
	o, err := transferOptions(opts)
	if err != nil {
		return nil, err
	}
	o.Waiting = waiting
	n := uint64(c.n)
	op := core.Op(c.opcode)
	// Capacity from n only up to a chunk's worth: n is the caller's claim.
	reqs := make([]core.TransferRequest, 0, min(n, 4096))
	err = readArray(c.local, n, maxBatch, "local_addrs", func(i int, v *uint64) error {
		reqs = append(reqs, core.TransferRequest{Op: op, Local: *v, Segment: s.s})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err = readArray(c.remote, n, maxBatch, "remote_addrs", func(i int, v *uint64) error {
		reqs[i].Remote = *v
		return nil
	}); err != nil {
		return nil, err
	}
	if err = readArray(c.lengths, n, maxBatch, "lengths", func(i int, v *uint64) error {
		reqs[i].Len = *v
		return nil
	}); err != nil {
		return nil, err
	}
	return e.core.Submit(reqs, o)
}

//export tentgo_transfer_columns
func tentgo_transfer_columns(id C.uint64_t, opcode C.uint32_t, sid C.uint64_t, local, remote, lengths C.uintptr_t,
	n C.size_t, opts C.uintptr_t, out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	c := columns{opcode: opcode, segment: sid, local: uintptr(local), remote: uintptr(remote),
		lengths: uintptr(lengths), n: n}
	b, err := startBatch(id, uintptr(out), func(e *engine) (*core.Batch, error) {
		return c.submit(e, uintptr(opts), false)
	})
	return pollOutcome(b, err, uintptr(out))
}

//export tentgo_transfer_columns_sync
func tentgo_transfer_columns_sync(id C.uint64_t, opcode C.uint32_t, sid C.uint64_t, local, remote, lengths C.uintptr_t,
	n C.size_t, opts C.uintptr_t, out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	c := columns{opcode: opcode, segment: sid, local: uintptr(local), remote: uintptr(remote),
		lengths: uintptr(lengths), n: n}
	return transferSync(id, n, uintptr(out), func(e *engine) (*core.Batch, error) {
		return c.submit(e, uintptr(opts), true)
	})
}
