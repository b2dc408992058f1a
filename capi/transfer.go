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

	"github.com/tent-dev/tent/capi/internal/handles"
	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
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
	v, err := lib.handles.Get(handles.Batch, uint64(id))
	if err != nil {
		return nil, err
	}
	return v.(*batch), nil
}

//export tentgo_alloc
func tentgo_alloc(id C.uint64_t, size C.size_t, loc C.uintptr_t, flags C.uint32_t, addrOut C.uintptr_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if err := requireOut(uintptr(addrOut), 8, "addr_out"); err != nil {
		return fail(err)
	}
	if err := requireOut(uintptr(out), 8, "region_out"); err != nil {
		return fail(err)
	}
	if err := disjoint(outRange{uintptr(addrOut), 8, "addr_out"}, outRange{uintptr(out), 8, "region_out"}); err != nil {
		return fail(err)
	}
	l, set, err := readString(uintptr(loc), maxStringLen, "location")
	if err != nil {
		return fail(err)
	}
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
	err = writeValue(uintptr(addrOut), C.uintptr_t(r.Addr), "addr_out")
	if err == nil {
		err = writeValue(uintptr(out), rid, "region_out")
	}
	if err != nil {
		_, _ = lib.handles.Remove(handles.Region, uint64(rid))
		_ = e.core.Free(r)
		return fail(err)
	}
	return ok()
}

//export tentgo_free
func tentgo_free(id C.uint64_t, rid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	return releaseRegion(id, rid, true, (*core.Engine).Free)
}

//export tentgo_segment_open
func tentgo_segment_open(id C.uint64_t, name C.uintptr_t, out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if name == 0 {
		return fail(errNull("name"))
	}
	if err := requireOut(uintptr(out), 8, "segment_out"); err != nil {
		return fail(err)
	}
	n, _, err := readText(uintptr(name), wire.MaxNameLen, "name")
	if err != nil {
		return fail(err)
	}
	s, err := e.core.OpenSegment(n)
	if err != nil {
		return fail(err)
	}
	sid, err := e.addChild(handles.Segment, &segment{engine: e.id.Load(), s: s})
	if err != nil {
		_ = e.core.CloseSegment(s)
		return fail(err)
	}
	if err := writeValue(uintptr(out), C.uint64_t(sid), "segment_out"); err != nil {
		_, _ = lib.handles.Remove(handles.Segment, sid)
		_ = e.core.CloseSegment(s)
		return fail(err)
	}
	return ok()
}

//export tentgo_segment_close
func tentgo_segment_close(id C.uint64_t, sid C.uint64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	s, err := lookupSegment(e, uint64(sid))
	if err != nil {
		return fail(err)
	}
	if _, err := lib.handles.Remove(handles.Segment, uint64(sid)); err != nil {
		return fail(err) // closed concurrently
	}
	if err := e.core.CloseSegment(s.s); err != nil {
		return fail(err)
	}
	return ok()
}

// cTransferOptions mirrors tent_transfer_options with addresses as integers.
type cTransferOptions struct {
	size, reserved0 uint32
	timeoutMs       uint64
	notify          uintptr
	notifyLen       uint64
	transport       uintptr
}

const (
	_ = -(unsafe.Sizeof(cTransferOptions{}) ^ C.sizeof_tent_transfer_options)
	_ = -(unsafe.Offsetof(cTransferOptions{}.transport) ^ unsafe.Offsetof(C.tent_transfer_options{}.transport))
)

// transferOptions maps tent_transfer_options at a; 0 (NULL) means defaults.
func transferOptions(a uintptr) (core.TransferOptions, error) {
	var o core.TransferOptions
	if a == 0 {
		return o, nil
	}
	p, err := readValue[cTransferOptions](a, "opts")
	if err != nil {
		return o, err
	}
	if err := checkStructSize(a, p.size, C.sizeof_tent_transfer_options, "tent_transfer_options", true); err != nil {
		return o, err
	}
	if p.reserved0 != 0 {
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.reserved0 must be 0")
	}
	if p.timeoutMs > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.timeout_ms is %d: too large", p.timeoutMs)
	}
	o.Timeout = time.Duration(p.timeoutMs) * time.Millisecond
	switch {
	case p.notify == 0 && p.notifyLen != 0:
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.notify is NULL but notify_len is %d", p.notifyLen)
	case p.notifyLen > core.MaxNotifyLen:
		return o, status.Errorf(status.InvalidArgument, "tent_transfer_options.notify_len is %d, at most %d", p.notifyLen, core.MaxNotifyLen)
	case p.notify != 0 && p.notifyLen > 0:
		if o.Notify, err = readBytes(p.notify, p.notifyLen, "tent_transfer_options.notify"); err != nil {
			return o, err
		}
	}
	t, set, err := readString(p.transport, maxStringLen, "tent_transfer_options.transport")
	if err != nil {
		return o, err
	}
	if set {
		if !knownTransport(t) {
			return o, status.Errorf(status.InvalidArgument,
				"tent_transfer_options.transport is %q: want one of %q or NULL", t, transportNames())
		}
		o.Transport = t
	}
	return o, nil
}

// submit turns C requests into a core batch. It reads the requests in
// chunks and validates each as it goes, so a bad n fails before much is
// read or allocated. waiting: the caller waits for the batch at once
// (core.TransferOptions.Waiting).
func submit(e *engine, requests uintptr, n C.size_t, opts uintptr, waiting bool) (*core.Batch, error) {
	switch {
	case n == 0:
		return nil, status.Errorf(status.InvalidArgument, "n is 0: a transfer has at least one request")
	case n > maxBatch:
		return nil, status.Errorf(status.InvalidArgument, "n is %d: a transfer has at most TENT_MAX_BATCH = %d requests", uint64(n), maxBatch)
	case requests == 0:
		return nil, status.Errorf(status.InvalidArgument, "requests is NULL")
	}
	o, err := transferOptions(opts)
	if err != nil {
		return nil, err
	}
	o.Waiting = waiting
	buf := e.requests.get()
	if buf == nil {
		// Capacity from n only up to a chunk's worth: n is the caller's claim.
		buf = &requestBuf{reqs: make([]core.TransferRequest, 0, min(uint64(n), 4096))}
	}
	reqs := buf.reqs[:0]
	defer func() {
		clear(reqs) // no segment kept alive by the pool
		if cap(reqs) <= 4096 {
			buf.reqs = reqs[:0]
			e.requests.put(buf)
		}
	}()
	var lastID uintptr
	var last *segment
	err = readArrayVia(requests, uint64(n), maxBatch, "requests", &buf.raw, func(i int, c *cRequest) error {
		if c.reserved != 0 {
			return status.Errorf(status.InvalidArgument, "request %d: reserved must be 0", i)
		}
		if c.opcode > uint32(core.OpWrite) {
			return status.Errorf(status.InvalidArgument, "request %d: unknown opcode %d", i, c.opcode)
		}
		if c.segment != lastID || last == nil {
			s, err := lookupSegment(e, uint64(c.segment))
			if err != nil {
				return status.Errorf(status.CodeOf(err), "request %d: %w", i, err)
			}
			lastID, last = c.segment, s
		}
		reqs = append(reqs, core.TransferRequest{Op: core.Op(c.opcode), Local: uint64(c.local), Segment: last.s,
			Remote: c.remote, Len: c.length})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return e.core.Submit(reqs, o)
}

//export tentgo_transfer
func tentgo_transfer(id C.uint64_t, requests C.uintptr_t, n C.size_t, opts C.uintptr_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	if _, err := startTransfer(id, requests, n, opts, out); err != nil {
		return fail(err)
	}
	return ok()
}

//export tentgo_transfer_poll
func tentgo_transfer_poll(id C.uint64_t, requests C.uintptr_t, n C.size_t, opts C.uintptr_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	b, err := startTransfer(id, requests, n, opts, out)
	return pollOutcome(b, err, uintptr(out))
}

// pollOutcome is the return of a submit that also reports the batch's
// state (tent_transfer_poll, tent_transfer_columns): on a failed submit,
// batch_out is set to NULL where it can be written.
func pollOutcome(b *core.Batch, err error, out uintptr) C.tent_status {
	if err != nil {
		if errOut := requireOut(out, 8, "batch_out"); errOut == nil {
			// NULL tells the caller that nothing was submitted (tent.h).
			_ = writeValue(out, C.uint64_t(0), "batch_out")
		}
		return fail(err)
	}
	// The batch is the caller's now, whatever its requests' outcome.
	code, _, berr := b.Status(nil)
	return outcome(code, berr)
}

// startTransfer submits the requests and writes the new batch's handle to
// out: the body of tent_transfer and tent_transfer_poll. On an error no
// batch exists and out is not written.
func startTransfer(id C.uint64_t, requests C.uintptr_t, n C.size_t, opts C.uintptr_t, out C.uintptr_t) (*core.Batch, error) {
	return startBatch(id, uintptr(out), func(e *engine) (*core.Batch, error) {
		return submit(e, uintptr(requests), n, uintptr(opts), false)
	})
}

// startBatch makes the batch that submit returns a handle of engine id and
// writes the handle to out. On an error no batch exists and out is not
// written.
func startBatch(id C.uint64_t, out uintptr, submit func(*engine) (*core.Batch, error)) (*core.Batch, error) {
	e, err := lookupEngine(id)
	if err != nil {
		return nil, err
	}
	if err := requireOut(out, 8, "batch_out"); err != nil {
		return nil, err
	}
	b, err := submit(e)
	if err != nil {
		return nil, err
	}
	bid, err := e.addChild(handles.Batch, &batch{e: e, b: b})
	if err != nil {
		b.Cancel()
		e.core.ReleaseBatch(b)
		return nil, err
	}
	if err := writeValue(out, C.uint64_t(bid), "batch_out"); err != nil {
		if _, rerr := lib.handles.Remove(handles.Batch, bid); rerr == nil {
			_ = release(e, b)
		}
		return nil, err
	}
	return b, nil
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

// copyStatuses writes the status of the first min(n, batch size) requests
// to out, after checking that all of it and completed (if set) can be
// written, so a bad pointer leaves both untouched. It returns the batch's
// outcome (code and the first request error), or callErr when the call
// itself failed.
func copyStatuses(b *core.Batch, out uintptr, n C.size_t, completed uintptr) (code status.Code, berr, callErr error) {
	k := min(uint64(n), uint64(b.Len()))
	if err := sizedOut(out, uint64(n), "n", k*C.sizeof_tent_request_status, "out"); err != nil {
		return 0, nil, err
	}
	if err := optionalOut(completed, 8, "completed_out"); err != nil {
		return 0, nil, err
	}
	if err := disjoint(outRange{out, k * C.sizeof_tent_request_status, "out"}, outRange{completed, 8, "completed_out"}); err != nil {
		return 0, nil, err
	}
	tmp := make([]core.RequestStatus, k)
	code, done, berr := b.Status(tmp)
	if code == 0 && berr != nil {
		return 0, nil, berr
	}
	cs := make([]C.tent_request_status, k)
	for i := range cs {
		cs[i] = C.tent_request_status{
			status: requestCode(tmp[i].Code), transport: C.uint32_t(tmp[i].Transport),
			bytes: C.uint64_t(tmp[i].Bytes), flags: C.uint32_t(tmp[i].Flags),
			nic: C.uint16_t(tmp[i].NIC), nics: C.uint16_t(tmp[i].NICs),
		}
	}
	if k > 0 {
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&cs[0])), k*C.sizeof_tent_request_status)
		if err := writeFrom(out, raw, "out"); err != nil {
			return 0, nil, err
		}
	}
	if completed != 0 {
		if err := writeValue(completed, C.size_t(done), "completed_out"); err != nil {
			return 0, nil, err
		}
	}
	return code, berr, nil
}

//export tentgo_batch_status
func tentgo_batch_status(bid C.uint64_t, out C.uintptr_t, n C.size_t, completed C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	b, err := lookupBatch(bid)
	if err != nil {
		return fail(err)
	}
	code, berr, err := copyStatuses(b.b, uintptr(out), n, uintptr(completed))
	if err != nil {
		return fail(err)
	}
	return outcome(code, berr)
}

//export tentgo_batch_wait
func tentgo_batch_wait(bid C.uint64_t, timeoutMs C.int64_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
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
	v, err := lib.handles.Remove(handles.Batch, uint64(bid))
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
func tentgo_transfer_sync(id C.uint64_t, requests C.uintptr_t, n C.size_t, opts C.uintptr_t,
	out C.uintptr_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	return transferSync(id, n, uintptr(out), func(e *engine) (*core.Batch, error) {
		return submit(e, uintptr(requests), n, uintptr(opts), true)
	})
}

// transferSync is the body of the synchronous transfers: submit (a
// Waiting batch of n requests) on engine id, wait for it, write its n
// statuses to out (if not NULL) and release it. Nothing moves unless the
// statuses can be written afterwards.
func transferSync(id C.uint64_t, n C.size_t, out uintptr, submit func(*engine) (*core.Batch, error)) C.tent_status {
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	if n <= maxBatch {
		if err := optionalOut(out, uint64(n)*C.sizeof_tent_request_status, "statuses_out"); err != nil {
			return fail(err)
		}
	}
	b, err := submit(e)
	if err != nil {
		return fail(err)
	}
	code, werr := b.Wait(-1) // at once: the Waiting promise
	var cerr error
	if out != 0 {
		_, _, cerr = copyStatuses(b, out, n, 0)
	}
	// A transport still holding the requests past their deadline matters
	// more than the deadline itself: the caller must not free the buffers.
	if rerr := release(e, b); rerr != nil {
		return fail(rerr)
	}
	if cerr != nil {
		return fail(cerr)
	}
	return outcome(code, werr)
}

//export tentgo_notify_send
func tentgo_notify_send(id C.uint64_t, sid C.uint64_t, msg C.uintptr_t, n C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	s, err := lookupSegment(e, uint64(sid))
	if err != nil {
		return fail(err)
	}
	switch {
	case msg == 0 && n != 0:
		return fail(status.Errorf(status.InvalidArgument, "msg is NULL but len is %d", uint64(n)))
	case n > core.MaxNotifyLen:
		return fail(status.Errorf(status.InvalidArgument, "len is %d, at most %d", uint64(n), core.MaxNotifyLen))
	}
	var b []byte
	if n > 0 {
		if b, err = readBytes(uintptr(msg), uint64(n), "msg"); err != nil {
			return fail(err)
		}
	}
	if err := e.core.SendNotification(s.s, b); err != nil {
		return fail(err)
	}
	return ok()
}

//export tentgo_notify_recv
func tentgo_notify_recv(id C.uint64_t, timeoutMs C.int64_t, buf C.uintptr_t, capacity C.size_t,
	lenOut C.uintptr_t, from C.uintptr_t, fromCap C.size_t) (st C.tent_status) {
	defer recoverStatus(&st, debug.SetPanicOnFault(true))
	e, err := lookupEngine(id)
	if err != nil {
		return fail(err)
	}
	// A received message is dequeued: check first that every byte it can
	// need is writable (no message is longer than MaxNotifyLen, no name
	// than TENT_MAX_NAME_LEN), so a bad buffer does not lose it.
	if err := requireOut(uintptr(lenOut), 8, "len_out"); err != nil {
		return fail(err)
	}
	if err := sizedOut(uintptr(buf), uint64(capacity), "cap", min(uint64(capacity), core.MaxNotifyLen), "buf"); err != nil {
		return fail(err)
	}
	if err := sizedOut(uintptr(from), uint64(fromCap), "from_cap", min(uint64(fromCap), wire.MaxNameLen+1), "from"); err != nil {
		return fail(err)
	}
	if err := disjoint(outRange{uintptr(lenOut), 8, "len_out"},
		outRange{uintptr(buf), min(uint64(capacity), core.MaxNotifyLen), "buf"},
		outRange{uintptr(from), min(uint64(fromCap), wire.MaxNameLen+1), "from"}); err != nil {
		return fail(err)
	}
	timeout := e.core.Options().DefaultTimeout
	if timeoutMs >= 0 {
		if int64(timeoutMs) > math.MaxInt64/int64(time.Millisecond) {
			return fail(status.Errorf(status.InvalidArgument, "timeout_ms %d is too large", int64(timeoutMs)))
		}
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	fits := func(nt core.Notification) bool {
		return uint64(len(nt.Msg)) <= uint64(capacity) && (from == 0 || uint64(len(nt.From)) < uint64(fromCap))
	}
	nt, err := e.core.RecvNotification(timeout, fits)
	if err != nil {
		return fail(err)
	}
	if err := writeValue(uintptr(lenOut), C.size_t(len(nt.Msg)), "len_out"); err != nil {
		return fail(err)
	}
	if !fits(nt) {
		return fail(status.Errorf(status.BufferTooSmall,
			"the message needs %d bytes (cap %d) and its sender name %d bytes and the NUL (from_cap %d); it stays queued",
			len(nt.Msg), uint64(capacity), len(nt.From), uint64(fromCap)))
	}
	if err := writeFrom(uintptr(buf), nt.Msg, "buf"); err != nil {
		return fail(err)
	}
	if from != 0 {
		if err := writeFrom(uintptr(from), append([]byte(nt.From), 0), "from"); err != nil {
			return fail(err)
		}
	}
	return ok()
}
