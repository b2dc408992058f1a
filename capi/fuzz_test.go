package main

import (
	"strings"
	"testing"

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
