package rdma

import (
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// The connect channel (KindConnect) carries one exchange per queue pair,
// after the engine's authenticated handshake:
//
//	initiator → target  frameConnect: u8 target NIC, u64 target incarnation,
//	                    qpAddr, u8 MTU
//	target → initiator  frameAccept: qpAddr, u8 MTU   (its queue pair is RTS)
//	                    frameRefuse: u32 status code, string reason
//
// The connection then stays open with nothing on it: the target keeps its
// queue pair exactly as long as the connection lives, and either side
// closing it (or dying) tears both queue pairs down.
const (
	frameConnect uint8 = 1
	frameAccept  uint8 = 2
	frameRefuse  uint8 = 3
)

// maxFrame bounds a connect-channel frame.
const maxFrame = 1 << 10

// maxReason bounds a refusal's text.
const maxReason = 512

func putAddr(enc *wire.Encoder, a qpAddr) {
	enc.U32(a.QPN)
	enc.U32(a.PSN)
	enc.U16(a.LID)
	enc.Raw(a.GID[:])
	enc.U8(a.Port)
}

func getAddr(d *wire.Decoder) qpAddr {
	var a qpAddr
	a.QPN = d.U32()
	a.PSN = d.U32()
	a.LID = d.U16()
	copy(a.GID[:], d.Raw(len(a.GID)))
	a.Port = d.U8()
	return a
}

// decodeReply reads the target's answer to frameConnect: its queue pair
// and MTU, or its refusal as an error. A refusal carries a known failure
// code (anything else is a Protocol error: the code reaches the caller's
// request status, which must be a tent_status).
func decodeReply(typ uint8, payload []byte, peer string) (qpAddr, mtu, error) {
	d := wire.NewDecoder(payload)
	switch typ {
	case frameRefuse:
		code := status.Code(int32(d.U32()))
		why := d.String(maxReason)
		if _, known := status.Lookup(code); d.Finish() != nil || !known || code >= 0 {
			return qpAddr{}, 0, status.Errorf(status.Protocol, "rdma: malformed refusal from %s", peer)
		}
		return qpAddr{}, 0, status.Errorf(code, "rdma: %s refused a queue pair: %s", peer, why)
	case frameAccept:
		remote := getAddr(&d)
		pathMTU := mtu(d.U8())
		if d.Finish() == nil {
			return remote, pathMTU, nil
		}
	}
	return qpAddr{}, 0, status.Errorf(status.Protocol, "rdma: malformed queue pair reply from %s", peer)
}
