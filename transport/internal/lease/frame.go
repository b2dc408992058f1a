package lease

import (
	"encoding/binary"

	"github.com/tent-dev/tent/wire"
)

// BeginFrame appends a frame header (wire framing: u8 type, three zero
// bytes, u32 payload length) whose length EndFrame fills in.
func BeginFrame(b []byte, typ uint8) []byte {
	return append(b, typ, 0, 0, 0, 0, 0, 0, 0)
}

// EndFrame sets the payload length of the frame that starts at start.
func EndFrame(b []byte, start int) []byte {
	binary.LittleEndian.PutUint32(b[start+4:], uint32(len(b)-start-wire.FrameHeaderSize))
	return b
}

// Frame returns a whole frame of type typ around payload.
func Frame(typ uint8, payload []byte) []byte {
	b := BeginFrame(make([]byte, 0, wire.FrameHeaderSize+len(payload)), typ)
	return EndFrame(append(b, payload...), 0)
}
