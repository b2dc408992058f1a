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

// readLoop is the connection's reader goroutine: it reads replies
// whenever no caller does, and returns (freeing the receive buffer with
// free) once the connection is dead and no caller reads any more.
func (c *conn) readLoop(free func()) {
	defer free()
	c.mu.Lock()
	for {
		for !c.dead && (c.reader != readerNone || c.callers > 0) {
			c.rdCond.Wait()
		}
		if c.dead {
			for c.reader != readerNone { // a caller is still inside rd
				c.rdCond.Wait()
			}
			c.mu.Unlock()
			return
		}
		c.reader, c.atBoundary = readerLoop, true
		c.mu.Unlock()
		_ = c.readReply(false) // a failure has made the connection dead: the loop ends above
		c.mu.Lock()
		c.reader, c.atBoundary = readerNone, false
		if c.callers > 0 {
			c.rdCond.Broadcast()
		}
	}
}

// help reads replies on the calling goroutine until done closes or the
// connection has nothing more due, if it can take the read side.
func (c *conn) help(done <-chan struct{}) {
	select {
	case <-done:
		return
	default:
	}
	c.mu.Lock()
	if !c.takeReadLocked() {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	defer c.releaseRead()
	for {
		select {
		case <-done:
			return
		default:
		}
		c.mu.Lock()
		if c.dead || (c.sent.len() == 0 && c.queue.len() == 0) {
			c.mu.Unlock()
			return
		}
		c.atBoundary = true
		c.mu.Unlock()
		if err := c.readReply(true); err != nil && err != errYield {
			return
		}
	}
}

// takeReadLocked gives the read side to the calling goroutine if no one
// holds it, or if the reader goroutine holds it at a reply boundary (it is
// kicked, and lets go as soon as it runs). c.mu is held.
func (c *conn) takeReadLocked() bool {
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
		for c.reader == readerLoop && !c.dead {
			c.rdCond.Wait()
		}
		c.callers--
		if c.dead || c.reader != readerNone {
			if c.callers == 0 {
				c.rdCond.Broadcast() // the reader goroutine may take it back
			}
			return false
		}
	}
	c.reader = readerCaller
	return true
}

// releaseRead gives the read side back to the reader goroutine.
func (c *conn) releaseRead() {
	c.mu.Lock()
	c.reader, c.atBoundary = readerNone, false
	if c.kicked && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.deadline)
	}
	c.rdCond.Broadcast()
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
// wanted, or a caller's batch may be over) or the socket's deadline.
func (c *conn) readTimedOut() readOutcome {
	c.mu.Lock()
	if c.kicked && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.deadline)
		yield := c.atBoundary && (c.callers > 0 || c.reader == readerCaller)
		c.mu.Unlock()
		if yield {
			return readYield
		}
		return readRetry
	}
	c.mu.Unlock()
	if c.stillOnTime() {
		return readRetry
	}
	return readFail
}

// payloadTimedOut is readTimedOut inside a payload, where the read side
// is never handed over.
func (c *conn) payloadTimedOut() bool {
	c.mu.Lock()
	if c.kicked && !c.dead {
		c.kicked = false
		_ = c.nc.SetReadDeadline(c.deadline)
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	return c.stillOnTime()
}
