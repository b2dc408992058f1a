package core

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/wire"
)

func ctlFrame(typ uint8, body func(*wire.Encoder)) []byte {
	enc := wire.NewEncoder(nil)
	body(&enc)
	var b bytes.Buffer
	_ = wire.WriteFrame(&b, typ, enc.Out())
	return b.Bytes()
}

// FuzzServeControl: what a peer sends on a control connection. Whatever it
// is, the server answers or hangs up, returns once the peer is gone, and
// leaves no subscriber (push goroutine) behind; notifications it accepts
// are bounded by the queue.
func FuzzServeControl(f *testing.F) {
	getDesc := ctlFrame(ctlGetDesc, func(e *wire.Encoder) { e.U64(1) })
	notify := ctlFrame(ctlNotify, func(e *wire.Encoder) { e.U64(2); e.String("fuzz"); e.Bytes([]byte("hello")) })
	forged := ctlFrame(ctlNotify, func(e *wire.Encoder) { e.U64(4); e.String("another"); e.Bytes([]byte("hello")) })
	f.Add(forged)
	f.Add(getDesc)
	f.Add(append(append([]byte{}, getDesc...), notify...))
	f.Add(append(append([]byte{}, notify...), getDesc...))
	f.Add(ctlFrame(ctlGetDesc, func(e *wire.Encoder) { e.U64(1); e.U8(0) }))
	f.Add(ctlFrame(ctlNotify, func(e *wire.Encoder) { e.U64(3); e.U32(0xffffffff) }))
	f.Add(ctlFrame(ctlChanged, func(e *wire.Encoder) { e.U64(1); e.U64(2) }))
	f.Add(ctlFrame(ctlGetDesc, func(*wire.Encoder) {}))
	f.Add([]byte{ctlGetDesc, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{})
	e, err := New(Options{Transports: []string{}, DefaultTimeout: 2 * time.Second})
	require.NoError(f, err)
	f.Cleanup(func() { _ = e.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		c, s := net.Pipe()
		go func() {
			go func() { _, _ = io.Copy(io.Discard, c) }()
			_, _ = c.Write(data)
			_ = c.Close()
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.serveControl(s, "fuzz")
			_ = s.Close()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("serveControl did not return after the peer hung up")
		}
		require.Eventually(t, func() bool {
			e.subscribers.mu.Lock()
			defer e.subscribers.mu.Unlock()
			return len(e.subscribers.set) == 0
		}, 10*time.Second, time.Millisecond, "a push goroutine outlived its connection")
		for {
			if _, err := e.RecvNotification(0, func(Notification) bool { return true }); err != nil {
				break
			}
		}
	})
}

// A peer that begins a control frame and never finishes it (a half-frame)
// is cut off within the engine's timeout instead of holding the server's
// goroutine, buffer and connection forever.
func TestServeControlCutsOffAHalfFrame(t *testing.T) {
	e, err := New(Options{Transports: []string{}, DefaultTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer e.Close()
	c, s := net.Pipe()
	defer c.Close()
	go func() {
		go func() { _, _ = io.Copy(io.Discard, c) }()
		_, _ = c.Write([]byte{ctlNotify, 0, 0, 0, 0, 0, 0x10, 0}) // 1 MiB claimed
		_, _ = c.Write([]byte{1, 2, 3})
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.serveControl(s, "half-frame")
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("serveControl still waits for the rest of a stalled frame")
	}
}
