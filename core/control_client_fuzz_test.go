package core

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// FuzzControlReplies: what a peer answers on the control link an initiator
// opened to it (replies to its descriptor request, pushes, anything). The
// segment opens only with a descriptor that decodes; otherwise the call
// fails with a documented code and a message. Either way no link, reader
// or peer is left behind once the segment is closed and the peer gone.
func FuzzControlReplies(f *testing.F) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(f, err)
	f.Cleanup(func() { _ = ln.Close() })
	addr := ln.Addr().String()
	desc, err := (&wire.SegmentDesc{Name: addr, MachineID: "fuzz", PID: 1, Incarnation: 7, Generation: 1,
		Endpoints: []wire.Endpoint{{Transport: wire.ControlEndpoint, Addr: addr}},
		Regions:   []wire.RegionDesc{{Addr: 1 << 40, Len: 4096, Perm: wire.PermRead, Location: "cpu"}}}).MarshalBinary()
	require.NoError(f, err)
	reply := func(id uint64, code int32, msg string, d []byte) []byte {
		return ctlFrame(ctlDesc, func(e *wire.Encoder) { e.U64(id); e.U32(uint32(code)); e.String(msg); e.Bytes(d) })
	}
	f.Add(reply(1, 0, "", desc))
	f.Add(append(ctlFrame(ctlChanged, func(e *wire.Encoder) { e.U64(7); e.U64(2) }), reply(1, 0, "", desc)...))
	f.Add(reply(1, int32(status.NotFound), "no such segment", nil))
	f.Add(reply(1, -1000, "made up", nil))
	f.Add(reply(2, 0, "", desc))
	f.Add(reply(1, 0, "", desc[:len(desc)-1]))
	f.Add(ctlFrame(ctlNotifyDone, func(e *wire.Encoder) { e.U64(1); e.U32(0); e.String("") }))
	f.Add(ctlFrame(ctlDesc, func(e *wire.Encoder) { e.U32(1) }))
	f.Add([]byte{ctlDesc, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{})

	e, err := New(Options{Transports: []string{}, DefaultTimeout: 2 * time.Second})
	require.NoError(f, err)
	f.Cleanup(func() { _ = e.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if _, _, err := wire.ServerHandshake(c, wire.HandshakeConfig{LocalName: addr}); err != nil {
				return
			}
			if _, _, err := wire.ReadFrame(c, maxCtlFrame, nil); err != nil { // the descriptor request
				return
			}
			_, _ = c.Write(data)
		}()
		seg, err := e.OpenSegment(addr)
		<-served
		if err != nil {
			_, known := status.Lookup(status.CodeOf(err))
			require.True(t, known && status.CodeOf(err) != status.Internal, "%v", err)
			require.NotEmpty(t, err.Error())
		} else {
			require.NoError(t, seg.Peer().Desc().Validate(), "an invalid descriptor was taken")
			require.NoError(t, e.CloseSegment(seg))
		}
		require.Eventually(t, func() bool {
			e.links.mu.Lock()
			defer e.links.mu.Unlock()
			e.mu.Lock()
			defer e.mu.Unlock()
			return len(e.links.set) == 0 && len(e.peers) == 0
		}, 10*time.Second, time.Millisecond, "a link or peer outlived its segment")
	})
}
