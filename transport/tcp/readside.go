package tcp

import (
	"time"

	"github.com/tent-dev/tent/status"
)

// The read side of a connection is held by one goroutine at a time: the
// connection's reader goroutine, or a caller waiting for its batch
// (Transport.Help). A reply read by the reader goroutine takes two
// wake-ups to reach its caller (the netpoller wakes the reader, the reader
// wakes the caller); read by the caller itself, it takes one. The reader
// goroutine holds the read side whenever no caller does, so a connection
// that breaks while idle is still noticed at once.
//
// The hand-over happens only at a reply boundary (the holder is waiting
// for a header): a caller that finds the reader goroutine there kicks it
// (sets the socket's read deadline in the past), and the reader lets go
// when its read times out; what had arrived of the header stays in the
// shared receive buffer. A caller that finds the reader goroutine inside a
// reply, or another caller reading, simply waits for its batch as before.

// readerKind says who holds the read side.
type readerKind uint8

const (
	readerNone   readerKind = iota
	readerLoop              // the connection's reader goroutine
	readerCaller            // a caller waiting for its batch
)

// errYield is what a read returns when the read side has been asked for at
// a reply boundary: the holder lets go (nothing is lost).
var errYield = status.Errorf(status.Internal, "tcp: read side handed over")

// kickTime is a read deadline in the past: pending reads return at once.
var kickTime = time.Unix(1, 0)

// watchDelay: after a caller has read the replies (and let go of the
// read side with nothing due), the reader goroutine takes the read side
// back after this long, to notice a connection that breaks while idle
// without waking on every caller's reply.
const watchDelay = time.Millisecond

// pollFor bounds how long a timed caller about to read its first reply
// blocks its thread in ppoll(2) before waiting in the netpoller: a reply that comes
// by then reaches it with one kernel wake-up and no Go scheduler in
// between, which is most of a small reply's cost when the caller is a C
// thread calling in (tent_batch_wait, the Python layer's wait). A kick
// (Cancel) or a Close is seen only after it. Untimed waits do not poll:
// for a goroutine that is not locked to its thread, the thread held in
// the system call (with its P) costs more than the netpoller's wake-ups
// (docs/BENCHMARKS.md).
const pollFor = 250 * time.Microsecond

// timedHelpMax: a timed caller (mostly a C thread calling in, locked to
// its thread) reads replies only while at most this much is due on the
// connection: a large batch has no second wake-up worth saving, and
// streaming many replies a locked thread parked in the netpoller may cost
// more than the reader goroutine (64 KiB x 128 WRITE read 3-5% lower with
// no cap, within the noise of the runs; docs/BENCHMARKS.md).
const timedHelpMax = 512 << 10

// readLoop is the connection's reader goroutine. It takes the read side
// when replies are due that no caller reads (needReader), or to watch the
// connection after watchDelay, and keeps it (blocked in the socket's read
// between replies) until a caller asks for it. It returns, freeing the
// receive buffer with free, once the connection is dead and no caller is
// inside the receive buffer any more.
func (c *conn) readLoop(free func()) {
	defer free()
	delay := watchDelay
	if c.t.watchDelay != 0 {
		delay = c.t.watchDelay
	}
	watch := time.NewTimer(delay)
	defer watch.Stop()
	watched := true // a new connection is watched at once
	for {
		c.mu.Lock()
		if c.dead && c.reader == readerNone {
			c.mu.Unlock()
			return
		}
		if !c.dead && c.reader == readerNone && c.callers == 0 && (c.needReader || watched) {
			c.reader, c.atBoundary, c.needReader = readerLoop, true, false
			c.mu.Unlock()
			c.readWhileWanted()
			watched = false
			continue
		}
		c.mu.Unlock()
		watch.Reset(delay)
		select {
		case <-c.rdWake:
			watched = false
		case <-watch.C:
			watched = true
		}
	}
}

// readWhileWanted reads replies while no caller asks for the read side,
// then lets go of it; the reader goroutine holds it.
func (c *conn) readWhileWanted() {
	for {
		err := c.readReply(false)
		c.mu.Lock()
		if err != nil || c.callers > 0 || c.dead {
			// Failed (the connection is dead), or yielded, or asked for.
			c.reader, c.atBoundary = readerNone, false
			c.rdCond.Broadcast()
			c.mu.Unlock()
			return
		}
		c.atBoundary = true
		c.mu.Unlock()
	}
}

// wakeReader wakes the reader goroutine, if it waits; c.mu is held.
func (c *conn) wakeReader() {
	select {
	case c.rdWake <- struct{}{}:
	default:
	}
}

// wantReaderLocked records that replies are due that no caller will read:
// the reader goroutine takes the read side, unless someone holds it (a
// caller then hands it over when it lets go).
func (c *conn) wantReaderLocked() {
	if c.reader == readerNone && !c.needReader {
		c.needReader = true
		c.wakeReader()
	}
}

// help reads replies on the calling goroutine until done closes or the
// connection has nothing more due, if it can take the read side. A timed
// caller (until set) reads with a read deadline no later than until and
// lets go at the first reply boundary after it; a reply it is inside of
// when until passes it reads to the end (the stream is never cut).
func (c *conn) help(done <-chan struct{}, until time.Time) {
	select {
	case <-done:
		return
	default:
	}
	c.mu.Lock()
	if (!until.IsZero() && c.dueBytesLocked() > timedHelpMax) || !c.takeReadLocked(until) {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	defer c.releaseRead()
	if c.t.onCallerRead != nil {
		c.t.onCallerRead()
	}
	first := true // the reply the caller waits for; those behind it stream in
	for {
		select {
		case <-done:
			return
		default:
		}
		if !until.IsZero() && !time.Now().Before(until) {
			return
		}
		c.mu.Lock()
		if c.dead || (c.sent.len() == 0 && c.queue.len() == 0) {
			c.mu.Unlock()
			return
		}
		c.atBoundary = true
		c.mu.Unlock()
		if first && !until.IsZero() {
			c.rd.awaitData(replyHeaderSize, min(pollFor, time.Until(until)))
		}
		first = false
		if err := c.readReply(true); err != nil && err != errYield {
			return
		}
	}
}

// dueBytesLocked is what the requests awaiting replies on the connection
// move, READs and WRITEs (c.mu is held).
func (c *conn) dueBytesLocked() int64 {
	var n int64
	add := func(ch *chunk) { n += int64(ch.n) }
	c.sent.each(add)
	c.queue.each(add)
	return n
}

// takeReadLocked gives the read side to the calling goroutine if no one
// holds it, or if the reader goroutine holds it at a reply boundary (it is
// kicked, and lets go as soon as it runs; a timed caller waits for that
// until until at most). c.mu is held.
func (c *conn) takeReadLocked(until time.Time) bool {
	if c.dead || c.rd == nil || c.reader == readerCaller {
		return false
	}
	if c.reader == readerLoop {
		if !c.atBoundary {
			return false // inside a reply: it may be ours, and it ends when the data is in
		}
		c.callers++
		c.kickLocked()
		c.t.readKicks.Add(1)
		var stop func() bool
		if !until.IsZero() {
			// The reader goroutine may have gone inside a reply
			// before the kick: this wait ends at until at the latest.
			stop = time.AfterFunc(time.Until(until), func() {
				c.mu.Lock()
				c.rdCond.Broadcast()
				c.mu.Unlock()
			}).Stop
		}
		for c.reader == readerLoop && !c.dead && (until.IsZero() || time.Now().Before(until)) {
			c.rdCond.Wait()
		}
		if stop != nil {
			stop()
		}
		c.callers--
		if c.dead || c.reader != readerNone { // another caller was faster, or until passed
			if c.dead {
				c.wakeReader() // it frees the receive buffer
			}
			return false
		}
	}
	c.reader = readerCaller
	c.readUntil = until
	if c.kicked { // the reader goroutine let go before its read saw the kick
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.readDeadlineLocked())
	} else if !until.IsZero() {
		_ = c.nc.SetReadDeadline(c.readDeadlineLocked())
	}
	return true
}

// releaseRead lets go of a caller's read side: the reader goroutine is
// woken if replies are still due (other callers' or unhelped ones), else
// it takes the read side back by itself after watchDelay.
func (c *conn) releaseRead() {
	c.mu.Lock()
	c.reader, c.atBoundary = readerNone, false
	reset := c.kicked || !c.readUntil.IsZero()
	c.readUntil = time.Time{}
	if reset && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.deadline)
	}
	if c.dead {
		c.wakeReader() // it frees the receive buffer
	} else if c.sent.len() > 0 || c.queue.len() > 0 {
		c.wantReaderLocked()
	}
	c.mu.Unlock()
}

// kickLocked makes the read side's pending read return at once.
func (c *conn) kickLocked() {
	if !c.kicked && c.nc != nil {
		c.kicked = true
		_ = c.nc.SetReadDeadline(kickTime)
	}
}

// kickCaller makes a caller reading on this connection look at its batch
// again (Cancel: its batch may be over while its reply is not in).
func (c *conn) kickCaller() {
	c.mu.Lock()
	if c.reader == readerCaller && !c.dead {
		c.kickLocked()
	}
	c.mu.Unlock()
}

// readOutcome is what the holder of the read side does after a read timed
// out.
type readOutcome uint8

const (
	readFail  readOutcome = iota // the connection has stalled
	readRetry                    // a stale deadline, or a kick that came too late: read on
	readYield                    // kicked at a reply boundary: let go of the read side
)

// readTimedOut sorts out a read that timed out: a kick (the read side is
// wanted, or a caller's batch may be over), a timed caller's limit, or the
// socket's deadline.
func (c *conn) readTimedOut() readOutcome {
	c.mu.Lock()
	if c.kicked && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.readDeadlineLocked())
		yield := c.atBoundary && (c.callers > 0 || c.reader == readerCaller)
		c.mu.Unlock()
		if yield {
			return readYield
		}
		return readRetry
	}
	if c.limitPassedLocked() {
		yield := c.atBoundary
		c.mu.Unlock()
		if yield {
			return readYield // the caller lets go; its read deadline stays passed until then
		}
		return readRetry
	}
	c.mu.Unlock()
	if c.stillOnTime() {
		return readRetry
	}
	return readFail
}

// limitPassedLocked reports whether the read timed out on a timed
// caller's limit. Inside a reply the limit is dropped (the reply is read
// to its end, by the socket's deadline); at a boundary it stays, and the
// caller lets go. c.mu is held.
func (c *conn) limitPassedLocked() bool {
	if c.dead || c.readUntil.IsZero() || time.Now().Before(c.readUntil) {
		return false
	}
	if !c.atBoundary {
		c.readUntil = time.Time{}
		_ = c.nc.SetReadDeadline(c.deadline)
		if c.t.onPastLimit != nil {
			c.t.onPastLimit()
		}
	}
	return true
}

// payloadTimedOut is readTimedOut inside a payload, where the read side
// is never handed over.
func (c *conn) payloadTimedOut() bool {
	c.mu.Lock()
	if c.kicked && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.readDeadlineLocked())
		c.mu.Unlock()
		return true
	}
	if c.limitPassedLocked() {
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	return c.stillOnTime()
}
