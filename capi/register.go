package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"
	"unsafe"

	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// location reads a C location string: NULL detects it from the address;
// "" is a mistake, not a request to detect.
func location(a uintptr, what string) (string, error) {
	s, set, err := readString(a, maxStringLen, what)
	if err != nil {
		return "", err
	}
	if set && s == "" {
		return "", status.Errorf(status.InvalidArgument, "%s is \"\": want \"cpu\", \"cpu:N\", \"cuda:N\", or NULL to detect", what)
	}
	return s, nil
}

//export tentgo_register
func tentgo_register(id C.uint64_t, addr C.uintptr_t, length C.size_t, loc C.uintptr_t, flags C.uint32_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if err := requireOut(uintptr(out), 8, "region_out"); err != nil {
		return fail(err)
	}
	if err := checkRegionAddr(uintptr(addr)); err != nil {
		return fail(err)
	}
	l, err := location(uintptr(loc), "location")
	if err != nil {
		return fail(err)
	}
	r, err := e.core.Register(core.RegionDesc{Addr: uint64(addr), Len: uint64(length), Location: l}, core.Perm(flags))
	if err != nil {
		return fail(err)
	}
	rid, err := addRegionHandle(e, r)
	if err != nil {
		return fail(err) // the engine is being destroyed; Close drops r
	}
	if err := writeValue(uintptr(out), rid, "region_out"); err != nil {
		_, _ = lib.handles.Remove(handles.Region, uint64(rid))
		_ = e.core.Unregister(r)
		return fail(err)
	}
	return ok()
}

// cRegionDesc mirrors tent_region_desc with addresses as integers.
type cRegionDesc struct {
	addr     uintptr
	len      uint64
	location uintptr
}

const (
	_ = -(unsafe.Sizeof(cRegionDesc{}) ^ C.sizeof_tent_region_desc)
	_ = -(unsafe.Offsetof(cRegionDesc{}.location) ^ unsafe.Offsetof(C.tent_region_desc{}.location))
)

// maxBatch bounds the entries of one batch call (TENT_MAX_BATCH).
const maxBatch = C.TENT_MAX_BATCH

//export tentgo_register_batch
func tentgo_register_batch(id C.uint64_t, descs C.uintptr_t, n C.size_t, flags C.uint32_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	switch {
	case n == 0:
		return fail(status.Errorf(status.InvalidArgument, "n is 0: a batch registers at least one region"))
	case n > maxBatch:
		return fail(status.Errorf(status.InvalidArgument, "n is %d: a batch registers at most TENT_MAX_BATCH = %d regions", uint64(n), maxBatch))
	case descs == 0:
		return fail(errNull("descs"))
	case out == 0:
		return fail(errNull("regions_out"))
	}
	ds := make([]core.RegionDesc, 0, min(uint64(n), 4096)) // n is the caller's claim
	err = readArray(uintptr(descs), uint64(n), maxBatch, "descs", func(i int, d *cRegionDesc) error {
		if err := checkRegionAddr(d.addr); err != nil {
			return status.Errorf(status.InvalidArgument, "entry %d: %w", i, err)
		}
		l, err := location(d.location, "location")
		if err != nil {
			return status.Errorf(status.InvalidArgument, "entry %d: %w", i, err)
		}
		ds = append(ds, core.RegionDesc{Addr: uint64(d.addr), Len: d.len, Location: l})
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := requireOut(uintptr(out), uint64(n)*8, "regions_out"); err != nil {
		return fail(err)
	}
	rs, err := e.core.RegisterBatch(ds, core.Perm(flags))
	if err != nil {
		return fail(err)
	}
	ids := make([]C.uint64_t, len(rs))
	undo := func() {
		for _, rid := range ids {
			if rid != 0 {
				_, _ = lib.handles.Remove(handles.Region, uint64(rid))
			}
		}
	}
	for i, r := range rs {
		if ids[i], err = addRegionHandle(e, r); err != nil {
			undo()
			return fail(err) // the engine is being destroyed; Close drops rs
		}
	}
	if err := writeFrom(uintptr(out), unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), len(ids)*8), "regions_out"); err != nil {
		undo()
		_ = e.core.UnregisterBatch(rs)
		return fail(err)
	}
	return ok()
}

// checkRegionAddr refuses NULL and memory in the NULL page: nothing is ever
// mapped there, so such an address is a bug of the caller.
func checkRegionAddr(a uintptr) error {
	if a == 0 {
		return errNull("addr")
	}
	if a < minAddr {
		return status.Errorf(status.InvalidArgument, "addr %#x is inside the NULL page: not memory that can be registered", a)
	}
	return nil
}

func addRegionHandle(e *engine, r *core.Region) (C.uint64_t, error) {
	rid, err := e.addChild(handles.Region, &region{engine: e.id.Load(), r: r})
	return C.uint64_t(rid), err
}

//export tentgo_unregister
func tentgo_unregister(id C.uint64_t, rid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	return releaseRegion(id, rid, false, (*core.Engine).Unregister)
}

// releaseRegion is tent_unregister (allocated false) and tent_free
// (allocated true): region rid of engine id must come from tent_register,
// or from tent_alloc, respectively; release gives it back to the core and
// then its handle is dropped.
func releaseRegion(id, rid C.uint64_t, allocated bool, release func(*core.Engine, *core.Region) error) C.tent_status {
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	r, err := lookupRegion(e, uint64(rid))
	if err != nil {
		return fail(err)
	}
	switch {
	case allocated && r.r.Alloc == nil:
		return fail(errRegistered)
	case !allocated && r.r.Alloc != nil:
		return fail(errAllocated)
	}
	if err := release(e.core, r.r); err != nil {
		return fail(staleIfUnregistered(err))
	}
	_, _ = lib.handles.Remove(handles.Region, uint64(rid))
	return ok()
}

// errAllocated: memory from tent_alloc must go back through tent_free, or
// the allocation would outlive its registration unnoticed.
var errAllocated = status.Errorf(status.InvalidArgument, "region was allocated by tent_alloc: release it with tent_free")

// errRegistered: tent_free releases only what tent_alloc allocated.
var errRegistered = status.Errorf(status.InvalidArgument, "region was registered, not allocated: release it with tent_unregister")

// staleIfUnregistered: a handle whose region the core no longer knows was
// unregistered by a concurrent call, so to the caller it is stale.
func staleIfUnregistered(err error) error {
	if status.CodeOf(err) == status.NotRegistered {
		return status.Errorf(status.InvalidHandle, "region handle was unregistered concurrently: %w", err)
	}
	return err
}

//export tentgo_unregister_batch
func tentgo_unregister_batch(id C.uint64_t, regions C.uintptr_t, n C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	switch {
	case n == 0:
		return fail(status.Errorf(status.InvalidArgument, "n is 0: a batch unregisters at least one region"))
	case n > maxBatch:
		return fail(status.Errorf(status.InvalidArgument, "n is %d: a batch unregisters at most TENT_MAX_BATCH = %d regions", uint64(n), maxBatch))
	case regions == 0:
		return fail(status.Errorf(status.InvalidArgument, "regions is NULL"))
	}
	// The entries are tent_region pointers; read as integers they are ids.
	var rs []*core.Region
	var rids []uint64
	seen := map[uint64]int{}
	err = readArray(uintptr(regions), uint64(n), maxBatch, "regions", func(i int, rid *uint64) error {
		if *rid == 0 {
			return status.Errorf(status.InvalidHandle, "entry %d: NULL region handle", i)
		}
		r, err := lookupRegion(e, *rid)
		if err != nil {
			return status.Errorf(status.CodeOf(err), "entry %d: %w", i, err)
		}
		if j, dup := seen[*rid]; dup {
			return status.Errorf(status.InvalidArgument, "entries %d and %d are the same region handle", j, i)
		}
		seen[*rid] = i
		if r.r.Alloc != nil {
			return status.Errorf(status.InvalidArgument, "entry %d: %w", i, errAllocated)
		}
		rs = append(rs, r.r)
		rids = append(rids, *rid)
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := e.core.UnregisterBatch(rs); err != nil {
		return fail(staleIfUnregistered(err))
	}
	for _, rid := range rids {
		_, _ = lib.handles.Remove(handles.Region, rid)
	}
	return ok()
}

//export tentgo_region_get_info
func tentgo_region_get_info(id C.uint64_t, rid C.uint64_t, info C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	r, err := lookupRegion(e, uint64(rid))
	if err != nil {
		return fail(err)
	}
	if info == 0 {
		return fail(errNull("info"))
	}
	size, err := readValue[C.uint32_t](uintptr(info), "info")
	if err != nil {
		return fail(err)
	}
	if err := checkStructSize(uintptr(info), uint32(size), C.sizeof_tent_region_info, "tent_region_info", false); err != nil {
		return fail(err)
	}
	v := C.tent_region_info{
		size:  size,
		flags: C.uint32_t(r.r.Perm),
		addr:  C.uint64_t(r.r.Addr),
		len:   C.uint64_t(r.r.Len),
	}
	loc := r.r.Loc.String()
	if len(loc) >= len(v.location) {
		return fail(status.Errorf(status.Internal, "location %q does not fit tent_region_info.location", loc))
	}
	for i := 0; i < len(loc); i++ {
		v.location[i] = C.char(loc[i])
	}
	if err := writeStruct(uintptr(info), uint32(size), v, "info"); err != nil {
		return fail(err)
	}
	return ok()
}
