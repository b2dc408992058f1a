package main

/*
#include "shim.h"
*/
import "C"

import (
	"math"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/handles"
	"github.com/tent-dev/tent/status"
)

// segment is the value behind a tent_segment handle.
type segment struct {
	engine uint64
	s      *core.Segment
}

// batch is the value behind a tent_batch handle.
type batch struct {
	e *engine
	b *core.Batch
}

// cRequest mirrors tent_request with the handle and address as integers,
// so Go never holds a made-up pointer (the GC would trip over it).
type cRequest struct {
	opcode   uint32
	reserved uint32
	local    uintptr
	segment  uintptr
	remote   uint64
	length   uint64
}

// The mirror must match the C layout exactly.
var _ = [1]struct{}{}[unsafe.Sizeof(cRequest{})-C.sizeof_tent_request]

func (s *segment) owner() uint64 { return s.engine }

// lookupSegment returns the segment behind id, which must belong to e.
func lookupSegment(e *engine, id uint64) (*segment, error) {
	return lookupChild[*segment](e, handles.Segment, id)
}

func lookupBatch(id C.uint64_t) (*batch, error) {
	v, err := table.Get(handles.Batch, uint64(id))
	if err != nil {
		return nil, err
	}
	return v.(*batch), nil
}

//export tentgo_alloc
func tentgo_alloc(id C.uint64_t, size C.size_t, loc *C.char, flags C.uint32_t, addrOut *C.uintptr_t,
	out *C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("alloc")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if addrOut == nil || out == nil {
		return fail(status.Errorf(status.InvalidArgument, "addr_out and region_out must not be NULL"))
	}
	l, set := optString(loc)
	if set && l == "" {
		return fail(status.Errorf(status.InvalidArgument, "location is \"\": want \"cpu\", \"cpu:N\", \"cuda:N\", or NULL for \"cpu\""))
	}
	r, err := e.core.Alloc(uint64(size), l, core.Perm(flags))
	if err != nil {
		return fail(err)
	}
	rid, err := addRegionHandle(e, r)
	if err != nil {
		return fail(err)
	}
	*addrOut = C.uintptr_t(r.Addr)
	*out = rid
	return ok()
}

//export tentgo_free
func tentgo_free(id C.uint64_t, rid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("free")
	return releaseRegion(id, rid, true, (*core.Engine).Free)
}

//export tentgo_segment_open
func tentgo_segment_open(id C.uint64_t, name *C.char, out *C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("segment_open")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if name == nil || out == nil {
		return fail(status.Errorf(status.InvalidArgument, "name and segment_out must not be NULL"))
	}
	s, err := e.core.OpenSegment(C.GoString(name))
	if err != nil {
		return fail(err)
	}
	sid, err := e.addChild(handles.Segment, &segment{engine: e.id.Load(), s: s})
	if err != nil {
		_ = e.core.CloseSegment(s)
		return fail(err)
	}
	*out = C.uint64_t(sid)
	return ok()
}

//export tentgo_segment_close
func tentgo_segment_close(id C.uint64_t, sid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("segment_close")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	s, err := lookupSegment(e, uint64(sid))
	if err != nil {
		return fail(err)
	}
	if _, err := table.Remove(handles.Segment, uint64(sid)); err != nil {
		return fail(err) // closed concurrently
	}
	if err := e.core.CloseSegment(s.s); err != nil {
		return fail(err)
	}
	return ok()
}

// transferOptions maps tent_transfer_options; NULL means defaults.
func transferOptions(p *C.tent_transfer_options) (core.TransferOptions, error) {
	var o core.TransferOptions
	if p == nil {
		return o, nil
	}
	if err := checkStructSize(unsafe.Pointer(p), p.size, C.sizeof_tent_transfer_options, "tent_transfer_options", true); err != nil {
		return o, err
	}
	if p.reserved0 != 0 {
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.reserved0 must be 0")
	}
	if uint64(p.timeout_ms) > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.timeout_ms is %d: too large", uint64(p.timeout_ms))
	}
	o.Timeout = time.Duration(p.timeout_ms) * time.Millisecond
	switch {
	case p.notify == nil && p.notify_len != 0:
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.notify is NULL but notify_len is %d", uint64(p.notify_len))
	case p.notify_len > core.MaxNotifyLen:
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.notify_len is %d, at most %d", uint64(p.notify_len), core.MaxNotifyLen)
	case p.notify != nil && p.notify_len > 0:
		o.Notify = C.GoBytes(p.notify, C.int(p.notify_len))
	}
	if t, set := optString(p.transport); set {
		if core.TransportID(t) == core.TransportNone {
			return o, status.Errorf(status.InvalidArgument,
				"tent_transfer_options.transport is %q: want \"local\", \"shm\", \"tcp\", \"cuda\" or NULL", t)
		}
		o.Transport = t
	}
	return o, nil
}

// maxBatch bounds one submission; larger is almost surely a bad n.
const maxBatch = 1 << 24

// submit turns C requests into a core batch.
func submit(e *engine, requests *C.tent_request, n C.size_t, opts *C.tent_transfer_options) (*core.Batch, error) {
	if n == 0 {
		return nil, status.Errorf(status.InvalidArgument, "n is 0: a transfer has at least one request")
	}
	if n > maxBatch {
		return nil, status.Errorf(status.InvalidArgument, "n = %d requests exceeds %d", uint64(n), maxBatch)
	}
	cr, err := cArray((*cRequest)(unsafe.Pointer(requests)), n, "requests")
	if err != nil {
		return nil, err
	}
	o, err := transferOptions(opts)
	if err != nil {
		return nil, err
	}
	reqs := make([]core.TransferRequest, len(cr))
	var lastID uintptr
	var last *segment
	for i := range cr {
		c := &cr[i]
		if c.reserved != 0 {
			return nil, status.Errorf(status.InvalidArgument, "request %d: reserved must be 0", i)
		}
		if c.opcode > uint32(core.OpWrite) {
			return nil, status.Errorf(status.InvalidArgument, "request %d: unknown opcode %d", i, c.opcode)
		}
		if c.segment != lastID || last == nil {
			s, err := lookupSegment(e, uint64(c.segment))
			if err != nil {
				return nil, status.Errorf(status.CodeOf(err), "request %d: %w", i, err)
			}
			lastID, last = c.segment, s
		}
		reqs[i] = core.TransferRequest{Op: core.Op(c.opcode), Local: uint64(c.local), Segment: last.s,
			Remote: c.remote, Len: c.length}
	}
	return e.core.Submit(reqs, o)
}

//export tentgo_transfer
func tentgo_transfer(id C.uint64_t, requests *C.tent_request, n C.size_t, opts *C.tent_transfer_options,
	out *C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("transfer")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return fail(status.Errorf(status.InvalidArgument, "batch_out is NULL"))
	}
	b, err := submit(e, requests, n, opts)
	if err != nil {
		return fail(err)
	}
	bid, err := e.addChild(handles.Batch, &batch{e: e, b: b})
	if err != nil {
		b.Cancel()
		e.core.ReleaseBatch(b)
		return fail(err)
	}
	*out = C.uint64_t(bid)
	return ok()
}

// outcome turns a batch outcome into the return of an export.
func outcome(code status.Code, err error) C.tent_status {
	switch code {
	case status.OK:
		return ok()
	case status.Pending:
		return C.TENT_PENDING
	}
	if err == nil {
		err = status.Errorf(code, "%s", code)
	}
	return fail(err)
}

func copyStatuses(b *core.Batch, out *C.tent_request_status, n C.size_t) (status.Code, int, error) {
	cs, err := cArray(out, n, "out")
	if err != nil {
		return 0, 0, err
	}
	k := len(cs)
	if k > b.Len() {
		k = b.Len()
	}
	tmp := make([]core.RequestStatus, k)
	code, done, berr := b.Status(tmp)
	for i := 0; i < k; i++ {
		cs[i] = C.tent_request_status{
			status: C.tent_status(tmp[i].Code), transport: C.uint32_t(tmp[i].Transport),
			bytes: C.uint64_t(tmp[i].Bytes), flags: C.uint32_t(tmp[i].Flags),
		}
	}
	return code, done, berr
}

//export tentgo_batch_status
func tentgo_batch_status(bid C.uint64_t, out *C.tent_request_status, n C.size_t, completed *C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("batch_status")
	b, err := lookupBatch(bid)
	if err != nil {
		return fail(err)
	}
	code, done, berr := copyStatuses(b.b, out, n)
	if code == 0 && berr != nil {
		return fail(berr)
	}
	if completed != nil {
		*completed = C.size_t(done)
	}
	return outcome(code, berr)
}

//export tentgo_batch_wait
func tentgo_batch_wait(bid C.uint64_t, timeoutMs C.int64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("batch_wait")
	b, err := lookupBatch(bid)
	if err != nil {
		return fail(err)
	}
	timeout := time.Duration(-1)
	if timeoutMs >= 0 {
		if int64(timeoutMs) > math.MaxInt64/int64(time.Millisecond) {
			return fail(status.Errorf(status.InvalidArgument, "timeout_ms %d is too large", int64(timeoutMs)))
		}
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	return outcome(b.b.Wait(timeout))
}

//export tentgo_batch_destroy
func tentgo_batch_destroy(bid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("batch_destroy")
	v, err := table.Remove(handles.Batch, uint64(bid))
	if err != nil {
		return fail(err)
	}
	b := v.(*batch)
	if err := release(b.e, b.b); err != nil {
		return fail(err)
	}
	return ok()
}

// release ends a batch: if requests are still in flight it cancels them and
// waits until no transport touches their memory.
func release(e *engine, b *core.Batch) error {
	select {
	case <-b.Settled():
	default:
		if !b.Cancel() {
			e.core.ReleaseBatch(b)
			return status.Errorf(status.Timeout,
				"batch destroyed, but a transport still held requests past their deadline; their local regions stay pinned until it lets go")
		}
	}
	e.core.ReleaseBatch(b)
	return nil
}

//export tentgo_transfer_sync
func tentgo_transfer_sync(id C.uint64_t, requests *C.tent_request, n C.size_t, opts *C.tent_transfer_options,
	out *C.tent_request_status) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("transfer_sync")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	b, err := submit(e, requests, n, opts)
	if err != nil {
		return fail(err)
	}
	code, werr := b.Wait(-1)
	if out != nil {
		if _, _, err := copyStatuses(b, out, n); err != nil {
			_ = release(e, b)
			return fail(err)
		}
	}
	// A transport still holding the requests past their deadline matters
	// more than the deadline itself: the caller must not free the buffers.
	if rerr := release(e, b); rerr != nil {
		return fail(rerr)
	}
	return outcome(code, werr)
}

//export tentgo_notify_send
func tentgo_notify_send(id C.uint64_t, sid C.uint64_t, msg unsafe.Pointer, n C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("notify_send")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	s, err := lookupSegment(e, uint64(sid))
	if err != nil {
		return fail(err)
	}
	switch {
	case msg == nil && n != 0:
		return fail(status.Errorf(status.InvalidArgument, "msg is NULL but len is %d", uint64(n)))
	case n > core.MaxNotifyLen:
		return fail(status.Errorf(status.InvalidArgument, "len is %d, at most %d", uint64(n), core.MaxNotifyLen))
	}
	var b []byte
	if n > 0 {
		b = C.GoBytes(msg, C.int(n))
	}
	if err := e.core.SendNotification(s.s, b); err != nil {
		return fail(err)
	}
	return ok()
}

//export tentgo_notify_recv
func tentgo_notify_recv(id C.uint64_t, timeoutMs C.int64_t, buf unsafe.Pointer, capacity C.size_t,
	lenOut *C.size_t, from *C.char, fromCap C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	hook("notify_recv")
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	switch {
	case lenOut == nil:
		return fail(status.Errorf(status.InvalidArgument, "len_out is NULL"))
	case buf == nil && capacity != 0:
		return fail(status.Errorf(status.InvalidArgument, "buf is NULL but cap is %d", uint64(capacity)))
	case from == nil && fromCap != 0:
		return fail(status.Errorf(status.InvalidArgument, "from is NULL but from_cap is %d", uint64(fromCap)))
	}
	timeout := e.core.Options().DefaultTimeout
	if timeoutMs >= 0 {
		if int64(timeoutMs) > math.MaxInt64/int64(time.Millisecond) {
			return fail(status.Errorf(status.InvalidArgument, "timeout_ms %d is too large", int64(timeoutMs)))
		}
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	fits := func(nt core.Notification) bool {
		return uint64(len(nt.Msg)) <= uint64(capacity) && (from == nil || uint64(len(nt.From)) < uint64(fromCap))
	}
	nt, err := e.core.RecvNotification(timeout, fits)
	if err != nil {
		return fail(err)
	}
	*lenOut = C.size_t(len(nt.Msg))
	if !fits(nt) {
		return fail(status.Errorf(status.BufferTooSmall,
			"the message needs %d bytes (cap %d) and its sender name %d bytes and the NUL (from_cap %d); it stays queued",
			len(nt.Msg), uint64(capacity), len(nt.From), uint64(fromCap)))
	}
	if len(nt.Msg) > 0 {
		copy(unsafe.Slice((*byte)(buf), len(nt.Msg)), nt.Msg)
	}
	if from != nil {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(from)), len(nt.From)+1)
		copy(dst, nt.From)
		dst[len(nt.From)] = 0
	}
	return ok()
}
