package wire

import (
	"unicode/utf8"

	"github.com/tent-dev/tent/status"
)

// MaxStatusMessage bounds the message of an encoded status. Longer
// messages are cut (on a rune boundary) when encoded and rejected when
// decoded.
const MaxStatusMessage = 4 << 10

// Status appends err as a status: i32 code (0 for nil), then str message
// (empty for nil). Every protocol of tent that answers with a status
// (control, shm and cuda leases) uses this one encoding.
func (e *Encoder) Status(err error) {
	e.U32(uint32(int32(status.CodeOf(err))))
	if err == nil {
		e.String("")
		return
	}
	e.String(truncateMessage(err.Error(), MaxStatusMessage))
}

// Status reads a status written by Encoder.Status. It returns nil for OK
// and for a decode failure (recorded in d, so the caller's Finish reports
// it); otherwise an error with the sender's code, its message prefixed
// with from (who sent it). A code that is not a known failure code is a
// Protocol error in d: a peer cannot make up codes.
func (d *Decoder) Status(from string) error {
	code := status.Code(int32(d.U32()))
	msg := d.String(MaxStatusMessage)
	if d.err != nil || code == status.OK {
		return nil
	}
	if _, known := status.Lookup(code); !known || code > 0 {
		d.Fail(status.Errorf(status.Protocol, "wire: %s sent unknown status code %d", from, code))
		return nil
	}
	return status.Errorf(code, "%s: %s", from, msg)
}

// truncateMessage cuts s to at most n bytes without splitting a rune.
func truncateMessage(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
