package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/status"
)

// writeCounter records each Write call separately.
type writeCounter struct{ writes [][]byte }

func (w *writeCounter) Write(b []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), b...))
	return len(b), nil
}

func TestFrameRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 100, smallFrame, smallFrame + 1, 3 << 20} {
		payload := bytes.Repeat([]byte{byte(n), 0xa5}, n/2+1)[:n]
		var w writeCounter
		require.NoError(t, WriteFrame(&w, 9, payload))
		require.Len(t, w.writes, 1, "a frame must go out in one Write")
		wire := w.writes[0]
		require.Equal(t, []byte{9, 0, 0, 0}, wire[:4])
		require.Len(t, wire, FrameHeaderSize+n)

		for _, buf := range [][]byte{nil, make([]byte, 4), make([]byte, 0, n+16)} {
			typ, got, err := ReadFrame(bytes.NewReader(wire), 0, buf)
			require.NoError(t, err)
			require.Equal(t, uint8(9), typ)
			require.Equal(t, len(payload), len(got))
			require.True(t, bytes.Equal(payload, got))
			if cap(buf) >= n && cap(buf) >= FrameHeaderSize && n > 0 {
				require.Same(t, &buf[:1][0], &got[0], "payload must reuse buf")
			}
		}
	}
}

func TestFrameSequenceOneByteReads(t *testing.T) {
	var stream bytes.Buffer
	for i := 0; i < 50; i++ {
		require.NoError(t, WriteFrame(&stream, uint8(i), bytes.Repeat([]byte{byte(i)}, i*3)))
	}
	r := iotest.OneByteReader(&stream)
	buf := make([]byte, 64)
	for i := 0; i < 50; i++ {
		typ, p, err := ReadFrame(r, 1024, buf)
		require.NoError(t, err)
		require.Equal(t, uint8(i), typ)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, i*3), p)
	}
	_, _, err := ReadFrame(r, 1024, buf)
	requireCode(t, err, status.Closed)
	require.ErrorIs(t, err, io.EOF)
}

func TestFrameLimits(t *testing.T) {
	frame := func(typ uint8, reserved [3]byte, n uint32, body int) []byte {
		b := []byte{typ, reserved[0], reserved[1], reserved[2]}
		b = append(b, u32le(n)...)
		return append(b, make([]byte, body)...)
	}
	for _, tc := range []struct {
		name   string
		in     []byte
		maxLen uint32
		code   status.Code
		msg    string
	}{
		{"exactly max", frame(1, [3]byte{}, 100, 100), 100, status.OK, ""},
		{"over max", frame(1, [3]byte{}, 101, 101), 100, status.Protocol, "type 1 length 101 exceeds limit 100"},
		{"over MaxFrame", frame(2, [3]byte{}, MaxFrame+1, 0), 0, status.Protocol, "length 67108865 exceeds limit 67108864"},
		{"maxLen above MaxFrame is clamped", frame(2, [3]byte{}, MaxFrame+1, 0), ^uint32(0), status.Protocol, "exceeds limit 67108864"},
		{"huge length", frame(2, [3]byte{}, ^uint32(0), 0), 0, status.Protocol, "length 4294967295"},
		{"zero max", frame(3, [3]byte{}, 0, 0), 0, status.OK, ""},
		{"reserved 1", frame(1, [3]byte{1, 0, 0}, 0, 0), 0, status.Protocol, "non-zero reserved bytes 01 00 00"},
		{"reserved 3", frame(1, [3]byte{0, 0, 0x80}, 0, 0), 0, status.Protocol, "reserved"},
		{"empty stream", nil, 0, status.Closed, "peer closed"},
		{"short header", frame(1, [3]byte{}, 5, 0)[:5], 0, status.Protocol, "after 5 of 8 header bytes"},
		{"short body", frame(1, [3]byte{}, 5, 3), 0, status.Protocol, "inside type 1 payload of 5 bytes"},
		{"short large body", frame(1, [3]byte{}, 10<<20, 1<<20), 0, status.Protocol, "inside type 1 payload of 10485760 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadFrame(bytes.NewReader(tc.in), tc.maxLen, nil)
			if tc.code == status.OK {
				require.NoError(t, err)
				return
			}
			requireCode(t, err, tc.code)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestFrameLyingLengthAllocatesLittle(t *testing.T) {
	// A header claiming 64 MiB followed by a few bytes must not cost 64 MiB.
	in := append([]byte{1, 0, 0, 0}, u32le(MaxFrame)...)
	in = append(in, make([]byte, 10)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ReadFrame(bytes.NewReader(in), 0, nil)
	runtime.ReadMemStats(&after)
	requireCode(t, err, status.Protocol)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20))
}

// stalledBody is a peer that sent a frame header and then nothing: it
// records the largest read the body asked it to fill (what ReadFrame had
// allocated before any payload arrived), then fails like a deadline.
type stalledBody struct {
	hdr     []byte
	largest int
}

func (s *stalledBody) Read(p []byte) (int, error) {
	if len(s.hdr) > 0 {
		n := copy(p, s.hdr)
		s.hdr = s.hdr[n:]
		return n, nil
	}
	s.largest = max(s.largest, len(p))
	return 0, os.ErrDeadlineExceeded
}

// Many connections that each send only a header claiming a large frame
// (a half-frame flood on a control listener) must not each hold a large
// allocation: what is committed before data arrives is bounded.
func TestHalfFrameCommitsLittleMemory(t *testing.T) {
	for _, claim := range []uint32{MaxFrame, 16 << 20, 2 << 20} {
		s := &stalledBody{hdr: append([]byte{2, 0, 0, 0}, u32le(claim)...)}
		_, _, err := ReadFrame(s, 0, make([]byte, 0, 4096))
		requireCode(t, err, status.Timeout)
		require.LessOrEqual(t, s.largest, 64<<10, "claim %d: %d bytes allocated before any payload", claim, s.largest)
		require.Positive(t, s.largest)
	}
}

func TestWriteFrameErrors(t *testing.T) {
	err := WriteFrame(io.Discard, 1, make([]byte, MaxFrame+1))
	requireCode(t, err, status.InvalidArgument)

	err = WriteFrame(iotest.TruncateWriter(io.Discard, 0), 1, []byte("x"))
	require.NoError(t, err, "TruncateWriter reports success")

	err = WriteFrame(errWriter{errors.New("boom")}, 1, []byte("x"))
	requireCode(t, err, status.TransportError)
	require.Contains(t, err.Error(), "boom")
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

func TestFrameOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sizes := []int{0, 10, smallFrame + 1, 5 << 20}
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		for i, n := range sizes {
			if err := WriteFrame(c, uint8(i), bytes.Repeat([]byte{byte(i + 1)}, n)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 4096)
	for i, n := range sizes {
		typ, p, err := ReadFrame(c, 0, buf)
		require.NoError(t, err)
		require.Equal(t, uint8(i), typ)
		require.Equal(t, n, len(p))
		require.True(t, bytes.Equal(bytes.Repeat([]byte{byte(i + 1)}, n), p))
	}
	require.NoError(t, <-done)
	_, _, err = ReadFrame(c, 0, buf)
	requireCode(t, err, status.Closed)

	// Deadlines surface as Timeout.
	c2, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, _, err = ReadFrame(c2, 0, buf)
	requireCode(t, err, status.Timeout)
}

func TestFrameNoAllocs(t *testing.T) {
	payload := make([]byte, 200)
	var stream bytes.Buffer
	stream.Grow(1 << 10)
	buf := make([]byte, 512)
	r := bytes.NewReader(nil)
	allocs := testing.AllocsPerRun(1000, func() {
		stream.Reset()
		if err := WriteFrame(&stream, 3, payload); err != nil {
			panic(err)
		}
		r.Reset(stream.Bytes())
		if _, _, err := ReadFrame(r, 1024, buf); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs)
}

// A connection may idle between frames, but a frame once begun must be
// finished within the bound: a stalled or dripped payload is a Timeout,
// and no deadline is left behind for the next frame.
func TestReadFrameWithinBoundsAStartedFrame(t *testing.T) {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	var whole bytes.Buffer
	require.NoError(t, WriteFrame(&whole, 3, []byte("payload")))
	go func() {
		// Idle longer than the bound before the first frame, then one
		// whole frame, then a header claiming 1 MiB and a dripped byte.
		time.Sleep(150 * time.Millisecond)
		_, _ = c.Write(whole.Bytes())
		_, _ = c.Write(append([]byte{3, 0, 0, 0}, u32le(1<<20)...))
		_, _ = c.Write([]byte{1})
	}()
	typ, p, err := ReadFrameWithin(s, s, 0, nil, 50*time.Millisecond)
	require.NoError(t, err, "idle time before a frame does not count")
	require.Equal(t, uint8(3), typ)
	require.Equal(t, "payload", string(p))
	start := time.Now()
	_, _, err = ReadFrameWithin(s, s, 0, nil, 50*time.Millisecond)
	requireCode(t, err, status.Timeout)
	require.Less(t, time.Since(start), 5*time.Second)
}
