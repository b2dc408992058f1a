package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func acceptFrame(a qpAddr, m uint8) []byte {
	enc := wire.NewEncoder(nil)
	putAddr(&enc, a)
	enc.U8(m)
	return enc.Out()
}

func refuseFrame(code int32, why string) []byte {
	enc := wire.NewEncoder(nil)
	enc.U32(uint32(code))
	enc.String(why)
	return enc.Out()
}

// A target cannot make up the code of a refusal: it reaches the caller as
// the request's status, so anything but a known failure code is PROTOCOL.
func TestRefusalWithMadeUpCodeIsProtocol(t *testing.T) {
	for _, code := range []int32{-9999, 0, 1, 12345, int32(status.OK)} {
		_, _, err := decodeReply(frameRefuse, refuseFrame(code, "x"), "peer")
		require.Equal(t, status.Protocol, status.CodeOf(err), "code %d: %v", code, err)
	}
	_, _, err := decodeReply(frameRefuse, refuseFrame(int32(status.TransportError), "stale"), "peer")
	require.Equal(t, status.TransportError, status.CodeOf(err))
	require.Contains(t, err.Error(), "stale")
	_, _, err = decodeReply(frameRefuse, append(refuseFrame(int32(status.TransportError), "x"), 0), "peer")
	require.Equal(t, status.Protocol, status.CodeOf(err), "trailing bytes")
}

// FuzzDecodeReply: what a target answers an initiator's frameConnect.
// Any input is an accepted queue pair that encodes back to the same
// bytes, or an error with a known failure code.
func FuzzDecodeReply(f *testing.F) {
	a := qpAddr{QPN: 7, PSN: 0x123456, LID: 3, Port: 1}
	a.GID[15] = 1
	f.Add(frameAccept, acceptFrame(a, uint8(mtu4096)))
	f.Add(frameAccept, acceptFrame(a, 0)[:10])
	f.Add(frameRefuse, refuseFrame(int32(status.TransportError), "stale descriptor"))
	f.Add(frameRefuse, refuseFrame(-9999, "made up"))
	f.Add(frameRefuse, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(frameConnect, []byte{})
	f.Fuzz(func(t *testing.T, typ uint8, p []byte) {
		remote, m, err := decodeReply(typ, p, "peer")
		if err != nil {
			code := status.CodeOf(err)
			_, known := status.Lookup(code)
			require.True(t, known && code < 0, "code %d: %v", code, err)
			return
		}
		require.Equal(t, frameAccept, typ)
		require.Equal(t, p, acceptFrame(remote, uint8(m)))
	})
}
