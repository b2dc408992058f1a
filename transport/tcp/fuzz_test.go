package tcp_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// FuzzHeaders feeds arbitrary bytes to the header decoders: they never
// panic, fail only with Protocol or VersionMismatch errors, and accept
// only headers whose fields are within bounds.
func FuzzHeaders(f *testing.F) {
	req := func(op uint8, n uint32, id, addr uint64) []byte {
		b := make([]byte, tcp.ReqHeaderSize)
		b[0] = op
		binary.LittleEndian.PutUint32(b[4:], n)
		binary.LittleEndian.PutUint64(b[8:], id)
		binary.LittleEndian.PutUint64(b[16:], addr)
		return b
	}
	f.Add(req(1, 4096, 1, 0x1000))
	f.Add(req(2, tcp.MaxChunk, 7, 1<<40))
	f.Add(req(1, 0, 1, 0x1000))
	f.Add(req(3, 1, 1, 0x1000))
	f.Add(req(2, 16, 1, ^uint64(0)-3))
	rep := make([]byte, tcp.ReplyHeaderSize)
	rep[0] = 2
	binary.LittleEndian.PutUint32(rep[16:], 4096)
	f.Add(rep)
	rep2 := bytes.Clone(rep)
	binary.LittleEndian.PutUint32(rep2[4:], uint32(0xfffffffb)) // NotRegistered
	binary.LittleEndian.PutUint16(rep2[2:], 20)
	binary.LittleEndian.PutUint32(rep2[16:], 0)
	f.Add(rep2)
	f.Add([]byte("TTCP\x01\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08"))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(err error) {
			if err != nil {
				c := status.CodeOf(err)
				require.True(t, c == status.Protocol || c == status.VersionMismatch, "%v: %v", c, err)
			}
		}
		if len(b) >= tcp.ReqHeaderSize {
			h, err := tcp.ParseReqHeader(b[:tcp.ReqHeaderSize])
			check(err)
			if err == nil {
				require.NotZero(t, h.N())
				require.LessOrEqual(t, h.N(), uint32(tcp.MaxChunk))
				require.GreaterOrEqual(t, h.Addr()+uint64(h.N()), h.Addr())
				require.Equal(t, b[:tcp.ReqHeaderSize], tcp.EncodeReqHeader(h), "decoding is canonical")
			}
		}
		if len(b) >= tcp.ReplyHeaderSize {
			h, err := tcp.ParseReplyHeader(b[:tcp.ReplyHeaderSize])
			check(err)
			if err == nil {
				require.Equal(t, b[:tcp.ReplyHeaderSize], tcp.EncodeReplyHeader(h), "decoding is canonical")
			}
		}
		if len(b) >= tcp.HelloSize {
			_, err := tcp.ParseHello(b[:tcp.HelloSize])
			check(err)
		}
	})
}

var fuzzTarget struct {
	once  sync.Once
	e     *core.Engine
	mem   []byte // guard | region (64 KiB, read+write) | guard
	guard []byte
}

const fuzzGuard = 64 << 10

// FuzzServe runs the target side of a stream on arbitrary bytes from an
// unauthenticated-looking peer (the handshake is assumed done): it never
// panics, never hangs, and never touches memory outside the registered
// region.
func FuzzServe(f *testing.F) {
	ft := &fuzzTarget
	ft.once.Do(func() {
		e, err := core.New(core.Options{Available: available(tcp.Options{}), Transports: []string{}})
		require.NoError(f, err)
		mem, err := unix.Mmap(-1, 0, 3*fuzzGuard, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(f, err)
		for i := range mem {
			mem[i] = byte(i * 7)
		}
		_, err = e.Register(core.RegionDesc{Addr: host.Addr(mem) + fuzzGuard, Len: fuzzGuard}, rw)
		require.NoError(f, err)
		ft.e, ft.mem = e, mem
		ft.guard = append(bytes.Clone(mem[:fuzzGuard]), mem[2*fuzzGuard:]...)
	})
	base := host.Addr(ft.mem) + fuzzGuard
	req := func(op uint8, addr uint64, n uint32, payload int) []byte {
		b := make([]byte, tcp.ReqHeaderSize+payload)
		b[0] = op
		binary.LittleEndian.PutUint32(b[4:], n)
		binary.LittleEndian.PutUint64(b[8:], 1)
		binary.LittleEndian.PutUint64(b[16:], addr)
		for i := tcp.ReqHeaderSize; i < len(b); i++ {
			b[i] = 0xee
		}
		return b
	}
	f.Add(req(1, base, 100, 100))
	f.Add(req(1, base-10, 100, 100))
	f.Add(req(1, base+fuzzGuard-50, 100, 100))
	f.Add(req(2, base, 4096, 0))
	f.Add(req(2, base+fuzzGuard-1, 2, 0))
	f.Add(append(req(1, base-4096, 4096, 4096), req(1, base, 8, 8)...))
	f.Add(req(1, base, 100, 50)) // truncated payload
	f.Add(req(9, base, 1, 1))
	f.Fuzz(func(t *testing.T, stream []byte) {
		cli, srv := net.Pipe()
		tr := tcp.New(tcp.Options{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			tr.Serve(ft.e, srv)
		}()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		_, _ = cli.Write(stream)
		cli.Close()
		<-done
		require.Equal(t, ft.guard, append(bytes.Clone(ft.mem[:fuzzGuard]), ft.mem[2*fuzzGuard:]...),
			"memory outside the registered region changed")
	})
}
