package main

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/debug"
	"unsafe"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/handles"
	"github.com/tent-dev/tent/status"
)

// location maps a C location string: NULL detects it from the address;
// "" is a mistake, not a request to detect.
func location(p *C.char) (string, error) {
	s, set := optString(p)
	if set && s == "" {
		return "", status.Errorf(status.InvalidArgument, "location is \"\": want \"cpu\", \"cpu:N\", \"cuda:N\", or NULL to detect")
	}
	return s, nil
}

//export tentgo_register
func tentgo_register(id C.uint64_t, addr C.uintptr_t, length C.size_t, loc *C.char, flags C.uint32_t,
	out *C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("register")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return fail(status.Errorf(status.InvalidArgument, "region_out is NULL"))
	}
	l, err := location(loc)
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
	*out = rid
	return ok()
}

//export tentgo_register_batch
func tentgo_register_batch(id C.uint64_t, descs *C.tent_region_desc, n C.size_t, flags C.uint32_t,
	out **C.tent_region) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("register_batch")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if n == 0 {
		return fail(status.Errorf(status.InvalidArgument, "n is 0: a batch registers at least one region"))
	}
	cd, err := cArray(descs, n, "descs")
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return fail(status.Errorf(status.InvalidArgument, "regions_out is NULL"))
	}
	ds := make([]core.RegionDesc, len(cd))
	for i, d := range cd {
		l, err := location(d.location)
		if err != nil {
			return fail(status.Errorf(status.InvalidArgument, "entry %d: %w", i, err))
		}
		ds[i] = core.RegionDesc{Addr: uint64(uintptr(d.addr)), Len: uint64(d.len), Location: l}
	}
	rs, err := e.core.RegisterBatch(ds, core.Perm(flags))
	if err != nil {
		return fail(err)
	}
	ids := make([]C.uint64_t, len(rs))
	for i, r := range rs {
		if ids[i], err = addRegionHandle(e, r); err != nil {
			for _, rid := range ids[:i] {
				_, _ = table.Remove(handles.Region, uint64(rid))
			}
			return fail(err) // the engine is being destroyed; Close drops rs
		}
	}
	C.tentshim_store_regions(out, &ids[0], n)
	return ok()
}

func addRegionHandle(e *engine, r *core.Region) (C.uint64_t, error) {
	rid, err := e.addChild(handles.Region, &region{engine: e.id.Load(), r: r})
	return C.uint64_t(rid), err
}

//export tentgo_unregister
func tentgo_unregister(id C.uint64_t, rid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("unregister")
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
	_, _ = table.Remove(handles.Region, uint64(rid))
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
func tentgo_unregister_batch(id C.uint64_t, regions *C.uintptr_t, n C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("unregister_batch")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if n == 0 {
		return fail(status.Errorf(status.InvalidArgument, "n is 0: a batch unregisters at least one region"))
	}
	// The entries are tent_region pointers; read as integers they are ids.
	rids, err := cArray(regions, n, "regions")
	if err != nil {
		return fail(err)
	}
	rs := make([]*core.Region, len(rids))
	seen := make(map[C.uintptr_t]int, len(rids))
	for i, rid := range rids {
		if rid == 0 {
			return fail(status.Errorf(status.InvalidHandle, "entry %d: NULL region handle", i))
		}
		r, err := lookupRegion(e, uint64(rid))
		if err != nil {
			return fail(status.Errorf(status.CodeOf(err), "entry %d: %w", i, err))
		}
		if j, dup := seen[rid]; dup {
			return fail(status.Errorf(status.InvalidArgument, "entries %d and %d are the same region handle", j, i))
		}
		seen[rid] = i
		if r.r.Alloc != nil {
			return fail(status.Errorf(status.InvalidArgument, "entry %d: %w", i, errAllocated))
		}
		rs[i] = r.r
	}
	if err := e.core.UnregisterBatch(rs); err != nil {
		return fail(staleIfUnregistered(err))
	}
	for _, rid := range rids {
		_, _ = table.Remove(handles.Region, uint64(rid))
	}
	return ok()
}

//export tentgo_region_get_info
func tentgo_region_get_info(id C.uint64_t, rid C.uint64_t, info *C.tent_region_info) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("region_get_info")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	r, err := lookupRegion(e, uint64(rid))
	if err != nil {
		return fail(err)
	}
	if info == nil {
		return fail(status.Errorf(status.InvalidArgument, "info is NULL"))
	}
	if err := checkStructSize(unsafe.Pointer(info), info.size, C.sizeof_tent_region_info, "tent_region_info", false); err != nil {
		return fail(err)
	}
	v := C.tent_region_info{
		size:  info.size,
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
	*info = v
	return ok()
}
