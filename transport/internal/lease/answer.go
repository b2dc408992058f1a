package lease

import (
	"unicode/utf8"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// MaxAnswerMessage bounds the explanation of a refused range in an answer.
const MaxAnswerMessage = 200

// MinAnswerEntry is the size of the smallest answer entry (a refusal with
// an empty message), for bounding counts with wire.Decoder.Count.
const MinAnswerEntry = 4 + 4

// AppendAnswerEntry appends the common head of the target's answer for one
// range of a lease request: an i32 status code (status.OK: granted) and,
// for a refusal, a str message (cut to MaxAnswerMessage). A granted
// range's fields, which each transport defines, follow the code directly.
func AppendAnswerEntry(e *wire.Encoder, code status.Code, msg string) {
	e.U32(uint32(int32(code)))
	if code != status.OK {
		e.String(cutMessage(msg))
	}
}

// DecodeAnswerEntry reads what AppendAnswerEntry wrote: status.OK (the
// granted range's fields follow in d) or the refusal's code and message.
// A code that is not a known failure code is a Protocol error in d: a
// target cannot make up codes.
func DecodeAnswerEntry(d *wire.Decoder) (status.Code, string) {
	code := status.Code(int32(d.U32()))
	if d.Err() != nil || code == status.OK {
		return code, ""
	}
	msg := d.String(MaxAnswerMessage)
	if _, known := status.Lookup(code); d.Err() == nil && (!known || code > 0) {
		d.Fail(status.Errorf(status.Protocol, "lease: answer entry has unknown status %d", code))
	}
	return code, msg
}

// cutMessage cuts s to at most MaxAnswerMessage bytes without splitting a rune.
func cutMessage(s string) string {
	n := MaxAnswerMessage
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
