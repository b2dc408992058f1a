package main

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"

	"github.com/tent-dev/tent/capi/internal/capitest"
	"github.com/tent-dev/tent/status"
)

// FuzzRegister drives tent_register with arbitrary arguments (registration
// never touches the memory): the answer is always a documented code, never
// INTERNAL, and a success unregisters cleanly.
func FuzzRegister(f *testing.F) {
	f.Add(uint64(0x1000), uint64(4096), "cpu", uint32(3), false)
	f.Add(uint64(0), uint64(1), "", uint32(0), true)
	f.Add(^uint64(0)-3, uint64(8), "cuda:1", uint32(1), false)
	f.Add(uint64(0x2000), uint64(0), "cpu:65536", uint32(4), false)
	f.Add(uint64(0x3000), uint64(16), "cpu:007", uint32(2), false)
	e, r := cEngineCreate(&cOptions{Transports: strp("fake")})
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	f.Cleanup(func() { cEngineDestroy(e) })
	allowed := map[status.Code]bool{status.OK: true, status.InvalidArgument: true, status.Unsupported: true}
	f.Fuzz(func(t *testing.T, addr, n uint64, loc string, flags uint32, nullLoc bool) {
		l := &loc
		if nullLoc {
			l = nil
		}
		reg, r := cRegister(e, uintptr(addr), n, l, flags, true)
		if !allowed[r.Code] {
			t.Fatalf("register(%#x, %d, %q, %#x) = %v: %s", addr, n, loc, flags, r.Code, r.Msg)
		}
		if r.Code != status.OK {
			if r.Msg == "" {
				t.Fatal("failure without a message")
			}
			return
		}
		if u := cUnregister(e, reg); u.Code != status.OK {
			t.Fatalf("unregister: %v %s", u.Code, u.Msg)
		}
		if s, _ := cStats(e, 0); s.Regions != 0 || s.Reservations != 0 || s.Handles != 0 {
			t.Fatalf("state left behind: %+v", s)
		}
	})
}

// FuzzSplitTransports: the parser never panics, and what it accepts has no
// empty or padded names.
func FuzzSplitTransports(f *testing.F) {
	for _, s := range []string{"local,shm,tcp", "", ",", " a , b ", "a,,b", "\x00,\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := splitTransports(s)
		if err != nil {
			if status.CodeOf(err) != status.InvalidArgument {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		for _, n := range names {
			if n == "" || n != strings.TrimSpace(n) {
				t.Fatalf("%q gave name %q", s, n)
			}
		}
	})
}

// FuzzTransferRequests drives tent_transfer_sync with request arrays of
// arbitrary bytes (each request's segment is the open one, a made-up
// handle or the fuzzed value, its addresses near the registered buffer or
// anywhere): the answer is a documented code with a message, never
// INTERNAL or a crash, every status written is a known code, and nothing
// is left behind.
func FuzzTransferRequests(f *testing.F) {
	e, r := cEngineCreate(&cOptions{Transports: strp("local")})
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	f.Cleanup(func() { cEngineDestroy(e) })
	buf, free := cMalloc(1 << 16)
	f.Cleanup(free)
	reg, r := cRegister(e, buf, 1<<16, strp("cpu"), 3, true)
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	name, _, _ := cEngineName(e, 2048)
	seg, r := cSegmentOpen(e, name)
	if r.Code != status.OK {
		f.Fatal(r.Msg)
	}
	f.Cleanup(func() { cSegmentClose(e, seg); cUnregister(e, reg) })
	req := func(op, reserved uint32, local, segment, remote, n uint64) []byte {
		b := make([]byte, 0, capitest.SizeofRequest)
		b = binary.LittleEndian.AppendUint32(b, op)
		b = binary.LittleEndian.AppendUint32(b, reserved)
		for _, v := range []uint64{local, segment, remote, n} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	f.Add(req(1, 0, 0, 0, 4096, 64), uint8(0), uint8(1))
	f.Add(append(req(0, 0, 8192, 0, 0, 4096), req(1, 0, 0, 0, 12288, 16)...), uint8(0), uint8(2))
	f.Add(req(2, 0, 0, 0, 0, 1), uint8(1), uint8(1))
	f.Add(req(1, 1, 0, 0, 0, 1), uint8(2), uint8(1))
	f.Add(req(1, 0, ^uint64(0)-8, 0, ^uint64(0)-8, 64), uint8(0), uint8(1))
	f.Add(req(0, 0, 0, 0, 1<<16-8, 64), uint8(0), uint8(1))
	f.Add([]byte{1, 2, 3}, uint8(0), uint8(3))
	allowed := map[status.Code]bool{status.OK: true, status.InvalidArgument: true, status.InvalidHandle: true,
		status.NotRegistered: true, status.OutOfRange: true, status.PermissionDenied: true, status.Overlap: true}
	f.Fuzz(func(t *testing.T, raw []byte, segMode, n uint8) {
		if n == 0 || n > 8 {
			n = 1
		}
		// The requests, in C memory; addresses are offsets into buf unless
		// they already look like pointers.
		out := make([]byte, int(n)*capitest.SizeofRequest)
		copy(out, raw)
		for i := 0; i < int(n); i++ {
			q := out[i*capitest.SizeofRequest:]
			for _, off := range []int{8, 24} {
				if v := binary.LittleEndian.Uint64(q[off:]); v < 1<<20 {
					binary.LittleEndian.PutUint64(q[off:], uint64(buf)+v)
				}
			}
			switch segMode % 3 {
			case 0:
				binary.LittleEndian.PutUint64(q[16:], seg)
			case 1:
				binary.LittleEndian.PutUint64(q[16:], seg+uint64(segMode))
			}
		}
		sts := make([]byte, int(n)*capitest.SizeofRequestStatus)
		for i := range sts {
			sts[i] = 0xee
		}
		got := cTransferSyncRaw(e, uintptr(unsafeAddr(out)), uint64(n), 0, uintptr(unsafeAddr(sts)))
		runtime.KeepAlive(out)
		runtime.KeepAlive(sts)
		if !allowed[got.Code] {
			t.Fatalf("transfer_sync = %v: %s", got.Code, got.Msg)
		}
		if got.Code != status.OK && got.Msg == "" {
			t.Fatal("failure without a message")
		}
		if sts[0] != 0xee { // written: the requests were submitted
			for i := 0; i < int(n); i++ {
				c := status.Code(int32(binary.LittleEndian.Uint32(sts[i*capitest.SizeofRequestStatus:])))
				if _, known := status.Lookup(c); !known || c == status.Pending || c == status.Internal {
					t.Fatalf("request %d finished with status %d", i, c)
				}
			}
		}
		if s, _ := cStats(e, 0); s.Batches != 0 || s.RequestsInFlight != 0 || s.Regions != 1 {
			t.Fatalf("state left behind: %+v", s)
		}
	})
}
