package capitest

/*
#cgo CFLAGS: -I${SRCDIR}/../../../include -std=gnu11 -Wall -Wextra -Werror
#include <stdlib.h>
#include <string.h>

#include "tent.h"

static tent_status ccall_engine_create(const tent_engine_options *o, int null_out, uint64_t *id) {
  tent_engine *e = NULL;
  tent_status st = tent_engine_create(o, null_out ? NULL : &e);
  if (st == TENT_OK) *id = (uint64_t)(uintptr_t)e;
  return st;
}

static tent_status ccall_engine_destroy(uint64_t e) {
  return tent_engine_destroy((tent_engine *)(uintptr_t)e);
}

static tent_status ccall_register(uint64_t e, uintptr_t addr, size_t len, const char *loc,
                                  uint32_t flags, uint64_t *id) {
  tent_region *r = NULL;
  tent_status st = tent_register((tent_engine *)(uintptr_t)e, (void *)addr, len, loc, flags,
                                 id ? &r : NULL);
  if (st == TENT_OK && id) *id = (uint64_t)(uintptr_t)r;
  return st;
}

static tent_status ccall_register_batch(uint64_t e, const uintptr_t *addrs, const size_t *lens,
                                        size_t n, uint32_t flags, uint64_t *ids) {
  tent_region_desc *d = calloc(n ? n : 1, sizeof *d);
  tent_region **r = calloc(n ? n : 1, sizeof *r);
  for (size_t i = 0; i < n; i++) {
    d[i].addr = (void *)addrs[i];
    d[i].len = lens[i];
  }
  tent_status st = tent_register_batch((tent_engine *)(uintptr_t)e, d, n, flags, r);
  if (st == TENT_OK) {
    for (size_t i = 0; i < n; i++) ids[i] = (uint64_t)(uintptr_t)r[i];
  }
  free(d);
  free(r);
  return st;
}

static tent_status ccall_segment_open(uint64_t e, const char *name, uint64_t *id) {
  tent_segment *s = NULL;
  tent_status st = tent_segment_open((tent_engine *)(uintptr_t)e, name, &s);
  if (st == TENT_OK) *id = (uint64_t)(uintptr_t)s;
  return st;
}

static tent_status ccall_segment_close(uint64_t e, uint64_t s) {
  return tent_segment_close((tent_engine *)(uintptr_t)e, (tent_segment *)(uintptr_t)s);
}

static tent_status ccall_transfer_sync_raw(uint64_t e, uintptr_t reqs, size_t n, uintptr_t opts,
                                           uintptr_t statuses) {
  return tent_transfer_sync((tent_engine *)(uintptr_t)e, (const tent_request *)reqs, n,
                            (const tent_transfer_options *)opts, (tent_request_status *)statuses);
}

static tent_status ccall_transfer_columns_raw(uint64_t e, uint32_t op, uint64_t seg, uintptr_t local,
                                              uintptr_t remote, uintptr_t lengths, size_t n, uintptr_t opts,
                                              uintptr_t out) {
  return tent_transfer_columns((tent_engine *)(uintptr_t)e, op, (tent_segment *)(uintptr_t)seg,
                               (const uint64_t *)local, (const uint64_t *)remote, (const uint64_t *)lengths, n,
                               (const tent_transfer_options *)opts, (tent_batch **)out);
}

static tent_status ccall_transfer_columns_sync_raw(uint64_t e, uint32_t op, uint64_t seg, uintptr_t local,
                                                   uintptr_t remote, uintptr_t lengths, size_t n,
                                                   uintptr_t opts, uintptr_t statuses) {
  return tent_transfer_columns_sync((tent_engine *)(uintptr_t)e, op, (tent_segment *)(uintptr_t)seg,
                                    (const uint64_t *)local, (const uint64_t *)remote,
                                    (const uint64_t *)lengths, n, (const tent_transfer_options *)opts,
                                    (tent_request_status *)statuses);
}

static tent_status ccall_batch_wait(uint64_t b, int64_t timeout_ms) {
  return tent_batch_wait((tent_batch *)(uintptr_t)b, timeout_ms);
}

static tent_status ccall_batch_status_raw(uint64_t b, uintptr_t out, size_t n) {
  return tent_batch_status((tent_batch *)(uintptr_t)b, (tent_request_status *)out, n, NULL);
}

static tent_status ccall_batch_destroy(uint64_t b) { return tent_batch_destroy((tent_batch *)(uintptr_t)b); }

static tent_status ccall_unregister(uint64_t e, uint64_t r) {
  return tent_unregister((tent_engine *)(uintptr_t)e, (tent_region *)(uintptr_t)r);
}

static tent_status ccall_unregister_batch(uint64_t e, const uint64_t *ids, size_t n) {
  tent_region **r = calloc(n ? n : 1, sizeof *r);
  for (size_t i = 0; i < n; i++) r[i] = (tent_region *)(uintptr_t)ids[i];
  tent_status st = tent_unregister_batch((tent_engine *)(uintptr_t)e, r, n);
  free(r);
  return st;
}

static tent_status ccall_region_info(uint64_t e, uint64_t r, tent_region_info *info) {
  return tent_region_get_info((tent_engine *)(uintptr_t)e, (tent_region *)(uintptr_t)r, info);
}

static tent_status ccall_stats(uint64_t e, tent_stats *s) {
  return tent_engine_stats((tent_engine *)(uintptr_t)e, s);
}

static tent_status ccall_stats_json(uint64_t e, char *buf, size_t cap, size_t *n) {
  return tent_engine_stats_json((tent_engine *)(uintptr_t)e, buf, cap, n);
}

static tent_status ccall_engine_transports(uint64_t e, char *buf, size_t cap, size_t *n) {
  return tent_engine_transports((tent_engine *)(uintptr_t)e, buf, cap, n);
}

static tent_status ccall_engine_name(uint64_t e, char *buf, size_t cap, size_t *n) {
  return tent_engine_name((tent_engine *)(uintptr_t)e, buf, cap, n);
}

static tent_status ccall_register_rawloc(uint64_t e, uintptr_t addr, size_t len, uintptr_t loc,
                                         uint64_t *id) {
  tent_region *r = NULL;
  tent_status st = tent_register((tent_engine *)(uintptr_t)e, (void *)addr, len,
                                 (const char *)loc, 3, &r);
  if (st == TENT_OK) *id = (uint64_t)(uintptr_t)r;
  return st;
}

static tent_status ccall_register_batch_raw(uint64_t e, uintptr_t descs, size_t n, int null_out) {
  tent_region *r[64];
  if (n > 64 && !null_out) return TENT_ERR_INTERNAL; // test misuse
  return tent_register_batch((tent_engine *)(uintptr_t)e, (const tent_region_desc *)descs, n, 3,
                             null_out ? NULL : r);
}

static tent_status ccall_unregister_batch_raw(uint64_t e, uintptr_t regions, size_t n) {
  return tent_unregister_batch((tent_engine *)(uintptr_t)e, (tent_region *const *)regions, n);
}

// Raw variants: every pointer argument is an address the test chooses.
static tent_status ccall_engine_create_raw(uintptr_t opts, uintptr_t out) {
  return tent_engine_create((const tent_engine_options *)opts, (tent_engine **)out);
}

static tent_status ccall_register_raw(uint64_t e, uintptr_t addr, size_t len, uintptr_t loc, uintptr_t out) {
  return tent_register((tent_engine *)(uintptr_t)e, (void *)addr, len, (const char *)loc, 3,
                       (tent_region **)out);
}

static tent_status ccall_register_batch_out(uint64_t e, uintptr_t addr, size_t n, uintptr_t out) {
  tent_region_desc d = {(void *)addr, 64, NULL};
  return tent_register_batch((tent_engine *)(uintptr_t)e, &d, n, 3, (tent_region **)out);
}

static tent_status ccall_alloc_raw(uint64_t e, size_t size, uintptr_t addr_out, uintptr_t region_out) {
  return tent_alloc((tent_engine *)(uintptr_t)e, size, "cpu", 3, (void **)addr_out, (tent_region **)region_out);
}

static tent_status ccall_uninstall(uint64_t e, const char *name) {
  return tent_uninstall((tent_engine *)(uintptr_t)e, name);
}
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/tent-dev/tent/status"
)

// Result is a status and the last-error message read on the same thread
// right after the call.
type Result struct {
	Code status.Code
	Msg  string
}

// call runs f on one locked OS thread and reads tent_last_error there: the
// message is thread-local, and a goroutine may change threads between two
// cgo calls.
func call(f func() C.tent_status) Result {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	return Result{status.Code(st), C.GoString(C.tent_last_error())}
}

// Options mirrors tent_engine_options with Go values; nil strings are
// NULL. Size 0 means sizeof(tent_engine_options).
type Options struct {
	Size                               uint32
	Reserved0, Reserved1               uint32
	Name, ListenAddr, Metadata, Prefix *string
	Transports                         *string
	Secret                             []byte
	SecretLen                          *uint64 // overrides len(Secret)
	NullSecret                         bool    // secret = NULL even with SecretLen
	TimeoutMs, UnregisterTimeoutMs     uint64
	TCPStreams                         uint32
}

func Strp(s string) *string { return &s }

// build makes the C struct, in C memory with 64 spare zero bytes after it
// (for the size tests); free releases it and its strings.
func (o *Options) build() (p *C.tent_engine_options, free func()) {
	p = (*C.tent_engine_options)(C.calloc(1, C.sizeof_tent_engine_options+64))
	frees := []unsafe.Pointer{unsafe.Pointer(p)}
	free = func() {
		for _, f := range frees {
			C.free(f)
		}
	}
	p.size = C.sizeof_tent_engine_options
	if o.Size != 0 {
		p.size = C.uint32_t(o.Size)
	}
	p.reserved0, p.reserved1 = C.uint32_t(o.Reserved0), C.uint32_t(o.Reserved1)
	cstr := func(s *string) *C.char {
		if s == nil {
			return nil
		}
		c := C.CString(*s)
		frees = append(frees, unsafe.Pointer(c))
		return c
	}
	p.name, p.listen_addr, p.metadata = cstr(o.Name), cstr(o.ListenAddr), cstr(o.Metadata)
	p.metadata_prefix, p.transports = cstr(o.Prefix), cstr(o.Transports)
	if len(o.Secret) > 0 && !o.NullSecret {
		c := C.CBytes(o.Secret)
		frees = append(frees, c)
		p.secret = c
	}
	p.secret_len = C.size_t(len(o.Secret))
	if o.SecretLen != nil {
		p.secret_len = C.size_t(*o.SecretLen)
	}
	p.timeout_ms, p.unregister_timeout_ms = C.uint64_t(o.TimeoutMs), C.uint64_t(o.UnregisterTimeoutMs)
	p.tcp_streams = C.uint32_t(o.TCPStreams)
	return p, free
}

// Build makes the C struct (see build) and returns its address, for
// tests that hand it to the library's Go side directly.
func (o *Options) Build() (addr uintptr, free func()) {
	p, free := o.build()
	return uintptr(unsafe.Pointer(p)), free
}

// EngineCreate calls tent_engine_create; o == nil passes NULL options.
func EngineCreate(o *Options) (uint64, Result) {
	return EngineCreateOut(o, false)
}

// EngineCreateOut can pass a NULL engine_out.
func EngineCreateOut(o *Options, nullOut bool) (uint64, Result) {
	var id C.uint64_t
	null := C.int(0)
	if nullOut {
		null = 1
	}
	var p *C.tent_engine_options
	if o != nil {
		var free func()
		p, free = o.build()
		defer free()
	}
	r := call(func() C.tent_status { return C.ccall_engine_create(p, null, &id) })
	return uint64(id), r
}

// EngineCreateWithTail creates (and destroys) an engine from options of
// size bytes, zero but for byte off set to b (off < 0: none), to model a
// newer caller's larger struct.
func EngineCreateWithTail(size uint32, off int, b byte) Result {
	p := (*C.tent_engine_options)(C.calloc(1, C.size_t(size)+C.sizeof_tent_engine_options))
	defer C.free(unsafe.Pointer(p))
	p.size = C.uint32_t(size)
	if off >= 0 {
		*(*byte)(unsafe.Add(unsafe.Pointer(p), off)) = b
	}
	var id C.uint64_t
	r := call(func() C.tent_status { return C.ccall_engine_create(p, 0, &id) })
	if r.Code == status.OK {
		C.ccall_engine_destroy(id)
	}
	return r
}

func EngineDestroy(e uint64) Result {
	return call(func() C.tent_status { return C.ccall_engine_destroy(C.uint64_t(e)) })
}

// Malloc returns n bytes of C memory.
func Malloc(n int) (uintptr, func()) {
	p := C.malloc(C.size_t(n))
	return uintptr(p), func() { C.free(p) }
}

// Register calls tent_register; loc nil is NULL; out false passes a NULL
// region_out.
func Register(e uint64, addr uintptr, n uint64, loc *string, flags uint32, out bool) (uint64, Result) {
	var cl *C.char
	if loc != nil {
		cl = C.CString(*loc)
		defer C.free(unsafe.Pointer(cl))
	}
	var id C.uint64_t
	pid := &id
	if !out {
		pid = nil
	}
	r := call(func() C.tent_status {
		return C.ccall_register(C.uint64_t(e), C.uintptr_t(addr), C.size_t(n), cl, C.uint32_t(flags), pid)
	})
	return uint64(id), r
}

// RegisterRawLoc passes loc as the location pointer, unchecked.
func RegisterRawLoc(e uint64, addr uintptr, n uint64, loc uintptr) Result {
	var id C.uint64_t
	return call(func() C.tent_status {
		return C.ccall_register_rawloc(C.uint64_t(e), C.uintptr_t(addr), C.size_t(n), C.uintptr_t(loc), &id)
	})
}

// RegisterBatchRaw passes descs as the descriptor array pointer, unchecked.
func RegisterBatchRaw(e uint64, descs uintptr, n uint64, nullOut bool) Result {
	null := C.int(0)
	if nullOut {
		null = 1
	}
	return call(func() C.tent_status {
		return C.ccall_register_batch_raw(C.uint64_t(e), C.uintptr_t(descs), C.size_t(n), null)
	})
}

// UnregisterBatchRaw passes regions as the handle array pointer, unchecked.
func UnregisterBatchRaw(e uint64, regions uintptr, n uint64) Result {
	return call(func() C.tent_status {
		return C.ccall_unregister_batch_raw(C.uint64_t(e), C.uintptr_t(regions), C.size_t(n))
	})
}

func RegisterBatch(e uint64, addrs []uintptr, lens []uint64, flags uint32) ([]uint64, Result) {
	n := len(addrs)
	ca := (*C.uintptr_t)(C.calloc(C.size_t(n+1), 8))
	cl := (*C.size_t)(C.calloc(C.size_t(n+1), 8))
	ci := (*C.uint64_t)(C.calloc(C.size_t(n+1), 8))
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cl))
	defer C.free(unsafe.Pointer(ci))
	as, ls, is := unsafe.Slice(ca, n+1), unsafe.Slice(cl, n+1), unsafe.Slice(ci, n+1)
	for i := range addrs {
		as[i], ls[i] = C.uintptr_t(addrs[i]), C.size_t(lens[i])
	}
	r := call(func() C.tent_status {
		return C.ccall_register_batch(C.uint64_t(e), ca, cl, C.size_t(n), C.uint32_t(flags), ci)
	})
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(is[i])
	}
	return ids, r
}

func Unregister(e, reg uint64) Result {
	return call(func() C.tent_status { return C.ccall_unregister(C.uint64_t(e), C.uint64_t(reg)) })
}

func UnregisterBatch(e uint64, ids []uint64) Result {
	ci := (*C.uint64_t)(C.calloc(C.size_t(len(ids)+1), 8))
	defer C.free(unsafe.Pointer(ci))
	s := unsafe.Slice(ci, len(ids)+1)
	for i, id := range ids {
		s[i] = C.uint64_t(id)
	}
	return call(func() C.tent_status { return C.ccall_unregister_batch(C.uint64_t(e), ci, C.size_t(len(ids))) })
}

// RegionInfo is tent_region_info in Go.
type RegionInfo struct {
	Size      uint32
	Flags     uint32
	Addr, Len uint64
	Location  string
	Tail      []byte // the bytes past sizeof(tent_region_info), up to Size
}

// RegionGetInfo calls tent_region_get_info with info.size = size (0 means
// sizeof) in C memory of that size (at most 4096 bytes), filled with 0xAB
// first, as a newer caller's larger struct would be.
func RegionGetInfo(e, reg uint64, size uint32) (RegionInfo, Result) {
	n := C.size_t(C.sizeof_tent_region_info)
	if size > uint32(n) && size <= 4096 {
		n = C.size_t(size)
	}
	p := C.malloc(n)
	defer C.free(p)
	C.memset(p, 0xAB, n)
	info := (*C.tent_region_info)(p)
	info.size = C.sizeof_tent_region_info
	if size != 0 {
		info.size = C.uint32_t(size)
	}
	info.flags = 0xdead
	r := call(func() C.tent_status { return C.ccall_region_info(C.uint64_t(e), C.uint64_t(reg), info) })
	return RegionInfo{
		Size:     uint32(info.size),
		Flags:    uint32(info.flags),
		Addr:     uint64(info.addr),
		Len:      uint64(info.len),
		Location: C.GoString(&info.location[0]),
		Tail:     C.GoBytes(unsafe.Add(p, C.sizeof_tent_region_info), C.int(n-C.sizeof_tent_region_info)),
	}, r
}

// Stats is tent_stats in Go.
type Stats struct {
	Regions, RegisteredBytes, Reservations, Handles, Segments, Batches uint64
	RequestsInFlight, Allocations, ProcessHandles                      uint64
}

// EngineStats calls tent_engine_stats with out.size = size (0 means sizeof).
func EngineStats(e uint64, size uint32) (Stats, Result) {
	var s C.tent_stats
	s.size = C.sizeof_tent_stats
	if size != 0 {
		s.size = C.uint32_t(size)
	}
	s.regions = 777
	r := call(func() C.tent_status { return C.ccall_stats(C.uint64_t(e), &s) })
	return Stats{
		Regions:          uint64(s.regions),
		RegisteredBytes:  uint64(s.registered_bytes),
		Reservations:     uint64(s.reservations),
		Handles:          uint64(s.handles),
		Segments:         uint64(s.segments),
		Batches:          uint64(s.batches),
		RequestsInFlight: uint64(s.requests_in_flight),
		Allocations:      uint64(s.allocations),
		ProcessHandles:   uint64(s.process_handles),
	}, r
}

// callString calls a function with tent_engine_name's buffer rules with a
// buffer of capacity bytes; capacity < 0 passes a NULL buffer with cap
// -capacity. n is *len_out (12345 if untouched).
func callString(fn func(buf *C.char, capacity C.size_t, n *C.size_t) C.tent_status, capacity int) (string, uint64, Result) {
	var buf *C.char
	c := capacity
	if capacity > 0 {
		buf = (*C.char)(C.malloc(C.size_t(capacity)))
		defer C.free(unsafe.Pointer(buf))
	} else {
		c = -capacity
	}
	n := C.size_t(12345)
	r := call(func() C.tent_status { return fn(buf, C.size_t(c), &n) })
	if r.Code != status.OK {
		return "", uint64(n), r
	}
	return C.GoString(buf), uint64(n), r
}

func StatsJSON(e uint64, capacity int) (string, uint64, Result) {
	return callString(func(b *C.char, c C.size_t, n *C.size_t) C.tent_status {
		return C.ccall_stats_json(C.uint64_t(e), b, c, n)
	}, capacity)
}

func EngineName(e uint64, capacity int) (string, uint64, Result) {
	return callString(func(b *C.char, c C.size_t, n *C.size_t) C.tent_status {
		return C.ccall_engine_name(C.uint64_t(e), b, c, n)
	}, capacity)
}

func EngineTransports(e uint64, capacity int) (string, uint64, Result) {
	return callString(func(b *C.char, c C.size_t, n *C.size_t) C.tent_status {
		return C.ccall_engine_transports(C.uint64_t(e), b, c, n)
	}, capacity)
}

func TopologyJSON(capacity int) (string, uint64, Result) {
	return callString(func(b *C.char, c C.size_t, n *C.size_t) C.tent_status {
		return C.tent_topology_json(b, c, n)
	}, capacity)
}

func Uninstall(e uint64, name *string) Result {
	var cn *C.char
	if name != nil {
		cn = C.CString(*name)
		defer C.free(unsafe.Pointer(cn))
	}
	return call(func() C.tent_status { return C.ccall_uninstall(C.uint64_t(e), cn) })
}

func EngineCreateRaw(opts, out uintptr) Result {
	return call(func() C.tent_status { return C.ccall_engine_create_raw(C.uintptr_t(opts), C.uintptr_t(out)) })
}

func RegisterRaw(e uint64, addr uintptr, n uint64, loc, out uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_register_raw(C.uint64_t(e), C.uintptr_t(addr), C.size_t(n), C.uintptr_t(loc), C.uintptr_t(out))
	})
}

// RegisterBatchOut registers one 64-byte entry at addr, n claimed.
func RegisterBatchOut(e uint64, addr uintptr, n uint64, out uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_register_batch_out(C.uint64_t(e), C.uintptr_t(addr), C.size_t(n), C.uintptr_t(out))
	})
}

func AllocRaw(e uint64, size uint64, addrOut, regionOut uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_alloc_raw(C.uint64_t(e), C.size_t(size), C.uintptr_t(addrOut), C.uintptr_t(regionOut))
	})
}

// SegmentOpen opens the segment called name.
func SegmentOpen(e uint64, name string) (uint64, Result) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var id C.uint64_t
	r := call(func() C.tent_status { return C.ccall_segment_open(C.uint64_t(e), cn, &id) })
	return uint64(id), r
}

func SegmentClose(e, s uint64) Result {
	return call(func() C.tent_status { return C.ccall_segment_close(C.uint64_t(e), C.uint64_t(s)) })
}

// TransferSyncRaw is tent_transfer_sync with every pointer as given.
func TransferSyncRaw(e uint64, reqs uintptr, n uint64, opts, statuses uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_transfer_sync_raw(C.uint64_t(e), C.uintptr_t(reqs), C.size_t(n), C.uintptr_t(opts), C.uintptr_t(statuses))
	})
}

// Columns is the arguments of tent_transfer_columns(_sync) with every
// pointer as given: Local, Remote and Lengths are the three arrays' addresses.
type Columns struct {
	Op                     uint32
	Segment                uint64
	Local, Remote, Lengths uintptr
	N                      uint64
	Opts                   uintptr
}

// TransferColumnsRaw calls tent_transfer_columns; out is batch_out as given.
func TransferColumnsRaw(e uint64, c Columns, out uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_transfer_columns_raw(C.uint64_t(e), C.uint32_t(c.Op), C.uint64_t(c.Segment),
			C.uintptr_t(c.Local), C.uintptr_t(c.Remote), C.uintptr_t(c.Lengths), C.size_t(c.N),
			C.uintptr_t(c.Opts), C.uintptr_t(out))
	})
}

// TransferColumnsSyncRaw calls tent_transfer_columns_sync; statuses as given.
func TransferColumnsSyncRaw(e uint64, c Columns, statuses uintptr) Result {
	return call(func() C.tent_status {
		return C.ccall_transfer_columns_sync_raw(C.uint64_t(e), C.uint32_t(c.Op), C.uint64_t(c.Segment),
			C.uintptr_t(c.Local), C.uintptr_t(c.Remote), C.uintptr_t(c.Lengths), C.size_t(c.N),
			C.uintptr_t(c.Opts), C.uintptr_t(statuses))
	})
}

func BatchWait(b uint64, timeoutMs int64) Result {
	return call(func() C.tent_status { return C.ccall_batch_wait(C.uint64_t(b), C.int64_t(timeoutMs)) })
}

// BatchStatusRaw calls tent_batch_status with out as given and a NULL
// completed_out.
func BatchStatusRaw(b uint64, out uintptr, n uint64) Result {
	return call(func() C.tent_status {
		return C.ccall_batch_status_raw(C.uint64_t(b), C.uintptr_t(out), C.size_t(n))
	})
}

func BatchDestroy(b uint64) Result {
	return call(func() C.tent_status { return C.ccall_batch_destroy(C.uint64_t(b)) })
}

// SizeofRequest and SizeofRequestStatus are the C struct sizes.
const (
	SizeofRequest       = C.sizeof_tent_request
	SizeofRequestStatus = C.sizeof_tent_request_status
)

func StatusStr(c status.Code) string { return C.GoString(C.tent_status_str(C.tent_status(c))) }

func TransportName(t uint32) string { return C.GoString(C.tent_transport_name(C.uint32_t(t))) }

func Version() (uint32, uint32, string) {
	return uint32(C.tent_version()), uint32(C.tent_abi_version()), C.GoString(C.tent_version_string())
}

// SizeofOptions is sizeof(tent_engine_options).
const SizeofOptions = C.sizeof_tent_engine_options

// LastError is tent_last_error() of the calling thread; lock the
// goroutine to its thread around the call that set it.
func LastError() string { return C.GoString(C.tent_last_error()) }
