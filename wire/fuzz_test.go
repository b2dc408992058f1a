package wire

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/status"
)

func FuzzUnmarshalSegmentDesc(f *testing.F) {
	for _, d := range []*SegmentDesc{{Name: "x"}, testDesc(0), testDesc(1), testDesc(7)} {
		b, err := d.MarshalBinary()
		require.NoError(f, err)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte("TSEG\x01\x00\x00\x00"))
	f.Add([]byte("TSEG\x02\x00\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := UnmarshalSegmentDesc(data)
		if err != nil {
			require.Nil(t, d)
			if c := status.CodeOf(err); c != status.Protocol && c != status.VersionMismatch {
				t.Fatalf("decode error with code %v: %v", c, err)
			}
			return
		}
		require.NoError(t, d.Validate())
		b, err := d.MarshalBinary()
		require.NoError(t, err, "a decoded descriptor must encode")
		// The format leaves no slack, so the encoding is canonical.
		require.Equal(t, data, b)
		d2, err := UnmarshalSegmentDesc(b)
		require.NoError(t, err)
		require.Equal(t, d, d2)
		for _, r := range d.Regions {
			got, ok := d.FindRegion(r.Addr, r.Len)
			require.True(t, ok)
			require.Equal(t, r, got)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	require.NoError(f, WriteFrame(&b, 1, []byte("hello")))
	f.Add(b.Bytes(), uint32(0))
	f.Add(b.Bytes(), uint32(4))
	b.Reset()
	require.NoError(f, WriteFrame(&b, 0, nil))
	f.Add(b.Bytes(), uint32(1))
	f.Add([]byte{1, 0, 0, 1, 0, 0, 0, 0}, uint32(0))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint32(0))
	f.Add([]byte{1, 0, 0}, uint32(0))
	f.Fuzz(func(t *testing.T, data []byte, maxLen uint32) {
		limit := maxLen
		if limit == 0 || limit > MaxFrame {
			limit = MaxFrame
		}
		typ, p, err := ReadFrame(bytes.NewReader(data), maxLen, make([]byte, 16))
		typ2, p2, err2 := ReadFrame(bytes.NewReader(data), maxLen, nil)
		require.Equal(t, err == nil, err2 == nil, "result must not depend on buf")
		if err != nil {
			if c := status.CodeOf(err); c != status.Protocol && c != status.Closed {
				t.Fatalf("read error with code %v: %v", c, err)
			}
			return
		}
		require.Equal(t, typ, typ2)
		require.True(t, bytes.Equal(p, p2))
		require.LessOrEqual(t, uint64(len(p)), uint64(limit))
		var out bytes.Buffer
		require.NoError(t, WriteFrame(&out, typ, p))
		require.Equal(t, data[:FrameHeaderSize+len(p)], out.Bytes())
	})
}

// clientMessages returns a well-formed client hello and finish without
// authentication.
func clientMessages(kind, flags uint8, name string) []byte {
	e := NewEncoder(nil)
	e.RawString(HandshakeMagic)
	e.U16(HandshakeVersion)
	e.U8(kind)
	e.U8(flags)
	e.Raw(make([]byte, NonceSize))
	e.U16(uint16(len(name)))
	e.RawString(name)
	e.U8(verdictOK)
	e.Raw(make([]byte, ProofSize))
	return e.Out()
}

func FuzzServerHandshake(f *testing.F) {
	f.Add(clientMessages(1, 0, "client"), false)
	f.Add(clientMessages(2, flagSecret, "client"), true)
	f.Add(clientMessages(3, flagSecret, ""), false)
	f.Add(clientMessages(4, 0, "c"), true)
	f.Add([]byte("TENT\x00\x00"), false)
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, withSecret bool) {
		c, s := net.Pipe()
		defer s.Close()
		// The client side writes the fuzz input, drains whatever the server
		// says and hangs up, so the server is never left waiting: any
		// Timeout below would be a hang.
		go func() {
			go io.Copy(io.Discard, c)
			c.Write(data)
			c.Close()
		}()
		cfg := HandshakeConfig{Deadline: time.Now().Add(5 * time.Second), LocalName: "srv"}
		if withSecret {
			cfg.Secret = []byte("fuzz secret")
		}
		start := time.Now()
		kind, name, err := ServerHandshake(s, cfg)
		if time.Since(start) > 4*time.Second {
			t.Fatalf("server handshake took %v", time.Since(start))
		}
		if err == nil {
			require.False(t, withSecret, "authenticated without the secret")
			require.GreaterOrEqual(t, len(data), clientHelloFixed+clientFinishSize)
			require.Equal(t, data[6], kind)
			require.LessOrEqual(t, len(name), MaxNameLen)
			return
		}
		switch c := status.CodeOf(err); c {
		case status.Protocol, status.AuthFailed, status.VersionMismatch, status.Closed:
		default:
			t.Fatalf("server handshake error with code %v: %v", c, err)
		}
	})
}

// serverMessages returns a well-formed server hello and finish without
// authentication.
func serverMessages(verdict, flags uint8, name string) []byte {
	e := NewEncoder(nil)
	e.RawString(HandshakeMagic)
	e.U16(HandshakeVersion)
	e.U8(verdict)
	e.U8(flags)
	e.Raw(make([]byte, NonceSize))
	e.U8(verdictOK)
	e.Raw(make([]byte, ProofSize))
	e.U16(uint16(len(name)))
	e.RawString(name)
	return e.Out()
}

// FuzzClientHandshake: what a server (any listener the client dials) says
// to a client. Any input ends the handshake at once with a Protocol, auth,
// version or Closed error, or succeeds only without a secret and with a
// bounded name: a server never authenticates without proving the secret,
// and never makes the client wait past the server hanging up.
func FuzzClientHandshake(f *testing.F) {
	f.Add(serverMessages(verdictOK, 0, "server"), false)
	f.Add(serverMessages(verdictOK, flagSecret, "server"), true)
	f.Add(serverMessages(verdictOK, 0, ""), true)
	f.Add(serverMessages(verdictNeedAuth, 0, "s"), false)
	f.Add(serverMessages(verdictMax+1, 0, "s"), false)
	f.Add(serverMessages(verdictOK, 0x80, "s"), false)
	f.Add(append(serverMessages(verdictOK, 0, "")[:serverHelloSize+serverFinishHead-2], 0xff, 0xff), false)
	f.Add([]byte("TENT\x00\x00"), false)
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, withSecret bool) {
		c, s := net.Pipe()
		defer c.Close()
		// The server side writes the fuzz input, drains what the client
		// says and hangs up, so any Timeout below would be a hang.
		go func() {
			go io.Copy(io.Discard, s)
			s.Write(data)
			s.Close()
		}()
		cfg := HandshakeConfig{Deadline: time.Now().Add(5 * time.Second), LocalName: "cli"}
		if withSecret {
			cfg.Secret = []byte("fuzz secret")
		}
		start := time.Now()
		name, err := ClientHandshake(c, cfg, 1)
		if time.Since(start) > 4*time.Second {
			t.Fatalf("client handshake took %v", time.Since(start))
		}
		if err == nil {
			require.False(t, withSecret, "authenticated without the server proving the secret")
			require.LessOrEqual(t, len(name), MaxNameLen)
			require.GreaterOrEqual(t, len(data), serverHelloSize+serverFinishHead+len(name))
			return
		}
		switch code := status.CodeOf(err); code {
		case status.Protocol, status.AuthFailed, status.VersionMismatch, status.Closed,
			status.TransportError: // a server that sent nothing at all
		default:
			t.Fatalf("client handshake error with code %v: %v", code, err)
		}
	})
}

// FuzzDecodeStatus: the status every protocol answers with (control
// replies, lease answers). Only OK or a known failure code comes out; a
// made-up code is a Protocol error, so a peer can never hand an unknown
// tent_status to a caller.
func FuzzDecodeStatus(f *testing.F) {
	for _, err := range []error{nil, status.Errorf(status.NotFound, "no such region"),
		status.Errorf(status.Timeout, "%s", bytes.Repeat([]byte("é"), MaxStatusMessage))} {
		e := NewEncoder(nil)
		e.Status(err)
		f.Add(e.Out())
	}
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x0f, 0x27, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xf1, 0xd8, 0xff, 0xff, 1, 0, 0, 0, 'x'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		d := NewDecoder(p)
		err := d.Status("peer")
		if d.Err() != nil {
			require.NoError(t, err)
			require.Equal(t, status.Protocol, status.CodeOf(d.Err()))
			return
		}
		if err == nil {
			return
		}
		code := status.CodeOf(err)
		_, known := status.Lookup(code)
		require.True(t, known, "unknown code %d", code)
		require.Less(t, int32(code), int32(0))
		require.LessOrEqual(t, d.Offset(), 8+MaxStatusMessage)
	})
}
