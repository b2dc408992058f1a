package tcp

import (
	"net"
	"time"

	"github.com/tent-dev/tent/core"
)

// Raw sends one request to the engine at addr (of the given incarnation)
// over the transport's own connections, bypassing every check of the
// initiator's engine, and returns the outcome. local is not pinned: the
// caller keeps it alive.
func (t *Transport) Raw(addr string, incarnation uint64, op core.Op, local, remote, n uint64, timeout time.Duration) error {
	o := opWrite
	if op == core.OpRead {
		o = opRead
	}
	states := []reqState{{t: t, raw: make(chan error, 1), op: o, local: local, remote: remote, n: n,
		deadline: time.Now().Add(timeout)}}
	states[0].prepare(false)
	t.inflight.Add(1)
	t.start(states, nil, &peerOf{key: peerKey{addr: addr, incarnation: incarnation}})
	return <-states[0].raw
}

// RawReq is one request of RawBatch.
type RawReq struct {
	Op               core.Op
	Local, Remote, N uint64
}

// RawBatch is Raw for several requests submitted together (so they go
// out on one stream, in order, when small), returning each one's outcome.
func (t *Transport) RawBatch(addr string, incarnation uint64, reqs []RawReq, timeout time.Duration) []error {
	states := make([]reqState, len(reqs))
	for i, r := range reqs {
		o := opWrite
		if r.Op == core.OpRead {
			o = opRead
		}
		states[i] = reqState{t: t, raw: make(chan error, 1), op: o, local: r.Local, remote: r.Remote, n: r.N,
			deadline: time.Now().Add(timeout)}
		states[i].prepare(false)
	}
	t.inflight.Add(int64(len(states)))
	t.start(states, nil, &peerOf{key: peerKey{addr: addr, incarnation: incarnation}})
	errs := make([]error, len(states))
	for i := range states {
		errs[i] = <-states[i].raw
	}
	return errs
}

// ResetServerConns closes the connections this transport serves, as a
// network reset would.
func (t *Transport) ResetServerConns() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for nc := range t.srvConns {
		nc.Close()
	}
	return len(t.srvConns)
}

// Exported for the fuzz test.
var (
	ParseReqHeader   = parseReqHeader
	ParseReplyHeader = parseReplyHeader
	ParseHello       = parseHello
)

const (
	ReqHeaderSize   = reqHeaderSize
	ReplyHeaderSize = replyHeaderSize
	HelloSize       = helloSize
)

// Serve runs the target side of one stream on nc for e, as the
// engine's listener would after the handshake; the transport need not be
// installed.
func (t *Transport) Serve(e *core.Engine, nc net.Conn) {
	t.mu.Lock()
	if t.e == nil {
		t.e = e
	}
	t.mu.Unlock()
	t.serve(nc, "test")
}

func (h reqHeader) N() uint32    { return h.n }
func (h reqHeader) Addr() uint64 { return h.addr }

func EncodeReqHeader(h reqHeader) []byte {
	b := make([]byte, reqHeaderSize)
	putReqHeader(b, h)
	return b
}

func EncodeReplyHeader(h replyHeader) []byte {
	b := make([]byte, replyHeaderSize)
	putReplyHeader(b, h)
	return b
}

// SetIdleTimeout changes how long a connection may stay idle, for
// transports installed afterwards; the returned function restores it.
func SetIdleTimeout(d time.Duration) (restore func()) {
	old := idleTimeout.Swap(int64(d))
	return func() { idleTimeout.Store(old) }
}

// WrapConns makes the transport wrap each data connection it dials with
// f; call it before the first transfer.
func (t *Transport) WrapConns(f func(net.Conn) net.Conn) { t.wrapConn = f }

// InlineMax is the most a submitter writes itself on an idle stream.
const InlineMax = inlineMax

// Writing reports whether a goroutine is writing on any of the
// transport's streams (it lets go just after its write returns, which
// may be after the reply has completed the request).
func (t *Transport) Writing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pools {
		for _, c := range p.conns {
			if c != nil {
				c.mu.Lock()
				w := c.writing
				c.mu.Unlock()
				if w {
					return true
				}
			}
		}
	}
	return false
}

// OnCallerRead makes f run each time a waiting caller has taken a
// connection's read side (Help); call it before the first transfer.
func (t *Transport) OnCallerRead(f func()) { t.onCallerRead = f }

// OnPastLimit makes f run each time a timed caller's limit passes while
// it is inside a reply (it then reads the reply to its end); call it
// before the first transfer.
func (t *Transport) OnPastLimit(f func()) { t.onPastLimit = f }

// SetWatchDelay sets how long after a caller let go of an idle
// connection's read side its reader goroutine takes it back; call it
// before the first transfer.
func (t *Transport) SetWatchDelay(d time.Duration) { t.watchDelay = d }

// FreeSubmissions is how many submissions (the states of a Submit call)
// wait to be reused.
func (t *Transport) FreeSubmissions() int {
	t.freeMu.Lock()
	defer t.freeMu.Unlock()
	n := 0
	for _, l := range t.free {
		n += len(l)
	}
	return n
}
