package rdma

import (
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
