package tcp

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

const (
	// maxGroupBytes and maxGroupChunks bound one writev of the writer, so
	// a canceled request waits at most that long for its memory back.
	maxGroupBytes  = 4 << 20
	maxGroupChunks = 512
	// inlineMax bounds what a submitter writes itself on an idle stream
	// (instead of waking the writer), counted as bytes on the wire:
	// headers, and the payloads of WRITEs. The submitter never waits for
	// the socket: what the send buffer does not take at once goes to the
	// writer, so Submit returns at once whatever the peer does.
	inlineMax = 64 << 10
	// inlineGroupMax bounds the one larger group a Submit call may write
	// itself as well: a stream's whole share of a batch (groupBytes of
	// payload and its headers), such as 128 WRITEs of 4 KiB. The groups
	// of its other streams go to their writers, woken before the
	// submitter writes, so they are written in parallel with it.
	inlineGroupMax = groupBytes + maxGroupChunks*reqHeaderSize
	// iovMax is the most pieces one writev takes (the kernel's IOV_MAX).
	iovMax = 1024
)

// conn is one stream to a peer: a writer goroutine that dials and then
// sends requests, and a reader goroutine that takes the replies, which
// come back in request order.
type conn struct {
	t    *Transport
	pool *pool
	slot int

	mu       sync.Mutex
	wake     sync.Cond // the writer waits on it for work
	nc       net.Conn  // nil while dialing
	queue    ring      // chunks not yet sent
	sent     ring      // chunks sent, awaiting their replies, in order
	started  bool      // the writer runs
	writing  bool      // a goroutine (the writer or a submitter) owns the socket's write side, iov, entered and skipped
	handoff  bool      // a submitter left the rest of its group in iov for the writer to send
	dead     bool
	err      error     // why it died
	deadline time.Time // the socket's deadline: the earliest of the chunks held, or zero
	nextID   uint64
	lastUsed time.Time             // when a chunk was last queued or answered
	reading  atomic.Pointer[chunk] // the reader's chunk in hand, if any

	// The read side (readside.go): the reader goroutine or a waiting
	// caller reads the replies, one at a time, through rd.
	rd         *bufReader    // set with nc; used only by the holder of the read side
	reader     readerKind    // who holds the read side
	atBoundary bool          // its holder waits for the next reply's header
	callers    int           // callers waiting for the reader goroutine to let go
	kicked     bool          // the read deadline was set in the past to free the read side
	needReader bool          // replies are due that no caller has promised to read
	readUntil  time.Time     // a timed caller's limit while it holds the read side, else zero
	rdCond     sync.Cond     // callers wait on it for the reader goroutine to let go
	rdWake     chan struct{} // wakes the reader goroutine (capacity 1)

	// Owned by whoever holds writing. The group taken is in iov (its
	// headers copied there under mu), and its WRITE requests, entered, in
	// entered: a READ chunk of the group may be answered, and its state
	// reused, before the write ends, so the group's chunks are not kept.
	iov     iovec
	entered []*reqState
	skipped []*chunk
	groupN  int // chunks in the group taken

	// For tryFlush, made once: the socket's raw connection (nil when it
	// has no descriptor) and the writev it runs on it.
	raw    syscall.RawConn
	wn     int
	werr   error
	writev func(fd uintptr) bool
}

func newConn(t *Transport, p *pool, slot int) *conn {
	c := &conn{t: t, pool: p, slot: slot, rdWake: make(chan struct{}, 1)}
	c.writev = c.writevOnce
	c.wake.L = &c.mu
	c.rdCond.L = &c.mu
	t.conns.Add(1)
	return c
}

func (c *conn) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// enqueue hands chunks to the writer; false if the connection has died.
// helped: their callers will read the replies (Help), so the reader
// goroutine is not woken for them.
// When the stream is up and idle (nothing queued, nothing awaiting a
// reply, no write in progress) and the caller offers to write them
// (mine: they are few bytes on the wire, see Transport.start), the
// caller gets the socket's write side instead: inline is then true and
// the caller must call writeInline, after releasing any lock it holds.
// That saves the wake-up of the writer goroutine, which is most of a
// small request's cost on the initiator.
func (c *conn) enqueue(cs []*chunk, helped, mine bool) (ok, inline bool) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return false, false
	}
	idle := c.nc != nil && !c.writing && c.queue.len() == 0 && c.sent.len() == 0
	for _, ch := range cs {
		c.queue.push(ch)
		c.lowerDeadlineLocked(ch.s.deadline)
	}
	c.lastUsed = time.Now()
	if !helped {
		c.wantReaderLocked()
	}
	if !c.started {
		// The writer dials first, by the deadline of what it carries.
		c.started = true
		c.t.goroutine(c.writeLoop)
	}
	if idle && mine && len(cs) <= maxGroupChunks {
		c.writing = true
		c.takeGroupLocked()
		c.mu.Unlock()
		return true, true
	}
	c.wake.Signal()
	c.mu.Unlock()
	return true, false
}

// writeInline writes the group enqueue took for the caller, as far as the
// socket takes it without waiting, then gives the write side back (to the
// writer, if more was queued meanwhile, or if the socket was full: the
// writer then sends the rest).
func (c *conn) writeInline() {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	c.t.inlineW.Add(1)
	c.skipDead()
	if c.groupN == 0 {
		c.endGroup(nil)
		return
	}
	all, err := c.tryFlush(nc)
	if err == nil && !all {
		c.mu.Lock()
		if !c.dead { // else the writer may have left already
			c.handoff = true
			c.wake.Signal()
			c.mu.Unlock()
			c.t.handedOff.Add(1)
			return
		}
		err = c.err
		c.mu.Unlock()
	}
	c.iov.reset()
	c.endGroup(err)
}

// takeGroupLocked moves the next group from the queue to sent and puts
// its headers and WRITE payloads into c.iov (the chunks of dead requests
// go to c.skipped); c.mu and writing are held. The headers are built
// here, while every chunk of the group is still awaiting its reply: once
// c.mu is released a reply (or a failing connection) may end a READ
// chunk, and its request's state be reused.
func (c *conn) takeGroupLocked() {
	c.entered, c.skipped, c.groupN = c.entered[:0], c.skipped[:0], 0
	v := &c.iov
	bytes := 0
	for c.queue.len() > 0 && c.groupN < maxGroupChunks && bytes < maxGroupBytes {
		ch := c.queue.pop()
		s := ch.s
		// A WRITE's memory is entered now, under the lock, so the
		// chunk is either sent whole or not at all.
		if (s.op == opWrite && !s.enter()) || (s.op == opRead && s.isDead()) {
			c.skipped = append(c.skipped, ch)
			continue
		}
		c.nextID++
		ch.id = c.nextID
		c.sent.push(ch)
		c.groupN++
		bytes += int(ch.n)
		putReqHeader(v.header(reqHeaderSize), reqHeader{op: s.op, n: ch.n, id: ch.id, addr: s.remote + ch.off})
		if s.op == opWrite {
			v.payload(host.Bytes(s.local+ch.off, uint64(ch.n)))
			c.entered = append(c.entered, s)
		}
	}
}

// writeGroup sends the group taken, then releases writing; it reports
// whether the connection lives on.
func (c *conn) writeGroup(nc net.Conn) bool {
	c.skipDead()
	var err error
	if c.groupN > 0 {
		err = c.flush(nc)
	}
	return c.endGroup(err)
}

// skipDead ends the chunks takeGroupLocked found dead.
func (c *conn) skipDead() {
	for _, ch := range c.skipped {
		ch.s.chunkDone(nil, false)
	}
	clear(c.skipped)
	c.skipped = c.skipped[:0]
}

// endGroup ends a group's write with err: its WRITE chunks' memory is
// let go, writing is released, and the connection fails on err. It
// reports whether the connection lives on.
func (c *conn) endGroup(err error) bool {
	for _, s := range c.entered {
		s.exit()
	}
	clear(c.entered) // no state outlives its request here
	c.entered, c.groupN = c.entered[:0], 0
	c.mu.Lock()
	c.writing = false
	if c.queue.len() > 0 {
		c.wake.Signal()
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
		return false
	}
	return true
}

// lowerDeadlineLocked makes the socket's deadline no later than d.
func (c *conn) lowerDeadlineLocked(d time.Time) {
	if d.IsZero() || (!c.deadline.IsZero() && !d.Before(c.deadline)) {
		return
	}
	c.deadline = d
	if c.nc != nil {
		c.setDeadlineLocked(d)
	}
}

// setDeadlineLocked sets the socket's deadline; a kicked read side keeps
// its read deadline in the past until its holder has seen it, and a timed
// caller's read side its own earlier limit.
func (c *conn) setDeadlineLocked(d time.Time) {
	if rd := c.readDeadlineLocked(); c.kicked || rd != d {
		_ = c.nc.SetWriteDeadline(d)
		if !c.kicked {
			_ = c.nc.SetReadDeadline(rd)
		}
		return
	}
	_ = c.nc.SetDeadline(d)
}

// readDeadlineLocked is the read deadline the holder of the read side
// reads with: the socket's deadline, or a timed caller's limit if that is
// earlier.
func (c *conn) readDeadlineLocked() time.Time {
	if u := c.readUntil; !u.IsZero() && (c.deadline.IsZero() || u.Before(c.deadline)) {
		return u
	}
	return c.deadline
}

// stillOnTime is called when a socket operation timed out. The deadline
// may be stale (the request it was set for has completed): then it is
// moved to the earliest deadline still held and the operation goes on. If
// a held chunk is overdue, the connection has stalled: false.
func (c *conn) stillOnTime() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false
	}
	now := time.Now()
	var earliest time.Time
	overdue := false
	check := func(ch *chunk) {
		d := ch.s.deadline
		if d.IsZero() {
			return
		}
		if !now.Before(d) {
			overdue = true
		}
		if earliest.IsZero() || d.Before(earliest) {
			earliest = d
		}
	}
	if cur := c.reading.Load(); cur != nil {
		check(cur)
	}
	c.queue.each(check)
	c.sent.each(check)
	if overdue {
		return false
	}
	c.deadline = earliest
	c.setDeadlineLocked(earliest)
	return true
}

// fail ends the connection: every chunk it holds fails with err, or with
// Timeout if its deadline has passed.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead, c.err = true, err
	held := make([]*chunk, 0, c.queue.len()+c.sent.len())
	c.queue.drain(func(ch *chunk) { held = append(held, ch) })
	c.sent.drain(func(ch *chunk) { held = append(held, ch) })
	nc := c.nc
	c.wake.Broadcast()
	c.rdCond.Broadcast()
	c.wakeReader()
	c.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
	c.t.conns.Add(-1)
	c.t.dropConn(c)
	code := status.CodeOf(err)
	if code != status.Closed && len(held) > 0 {
		// Requests lost their connection: worth a line above debug.
		c.t.log.Info("tcp connection failed", "addr", c.pool.key.addr, "slot", c.slot, "requests_failed", len(held), "err", err)
	} else {
		c.t.log.Debug("tcp connection closed", "addr", c.pool.key.addr, "slot", c.slot, "requests_failed", len(held), "reason", closeReason(err, len(held)))
	}
	if code == status.Timeout {
		c.t.timeouts.Add(1)
	}
	if code == status.TransportError || code == status.Protocol || code == status.Timeout {
		// The peer may have restarted: look it up again before the next batch.
		if name := c.pool.name; name != "" {
			c.t.e.InvalidatePeer(name)
		}
	}
	for _, ch := range held {
		ch.s.chunkDone(chunkErr(ch, err), false)
	}
}

// closeIfIdle closes the connection if it holds no chunk and has not been
// used since before, and reports whether it did. Checking and marking it
// dead happen under one lock, so a chunk is either refused by enqueue (and
// goes to a new connection) or keeps the connection open.
func (c *conn) closeIfIdle(before time.Time) bool {
	c.mu.Lock()
	if c.dead || !c.started || c.queue.len() > 0 || c.sent.len() > 0 || c.reading.Load() != nil ||
		c.lastUsed.After(before) {
		c.mu.Unlock()
		return false
	}
	c.dead, c.err = true, errIdle
	nc := c.nc
	c.wake.Broadcast()
	c.rdCond.Broadcast()
	c.wakeReader()
	c.mu.Unlock()
	if nc != nil {
		nc.Close() // the reader sees the error and leaves: the connection is already dead
	}
	c.t.conns.Add(-1)
	c.t.dropConn(c)
	c.t.idleClosed.Add(1)
	c.t.log.Debug("tcp connection closed when idle", "addr", c.pool.key.addr, "slot", c.slot)
	return true
}

var errIdle = status.Errorf(status.Closed, "tcp: connection closed after being idle")

// cause is the error that ended the connection (which is what a socket
// error after that means), or err while it lives.
func (c *conn) cause(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return c.err
	}
	return err
}

// chunkErr is the error for a chunk whose connection failed with err: a
// Timeout once the chunk's deadline has passed (unless the transport is
// going away), else err.
func chunkErr(ch *chunk, err error) error {
	code := status.CodeOf(err)
	if d := ch.s.deadline; code != status.Timeout && code != status.Closed && !d.IsZero() && !time.Now().Before(d) {
		return status.Errorf(status.Timeout, "tcp: deadline passed: %w", err)
	}
	return err
}

// dial connects and checks that the peer is the incarnation the requests
// were routed to.
func (c *conn) dial() (net.Conn, error) {
	c.mu.Lock()
	deadline := c.deadline
	c.mu.Unlock()
	if deadline.IsZero() {
		deadline = time.Now().Add(c.t.e.Options().DefaultTimeout)
	}
	c.t.dials.Add(1)
	nc, err := c.t.e.DialContext(c.t.ctx, c.pool.key.addr, KindData, deadline)
	if err != nil {
		return nil, err
	}
	if c.t.wrapConn != nil {
		nc = c.t.wrapConn(nc)
	}
	_ = nc.SetDeadline(deadline)
	var hello [helloSize]byte
	if _, err := readFull(nc, hello[:]); err != nil {
		nc.Close()
		return nil, ioError("reading the hello of "+c.pool.key.addr, err)
	}
	inc, err := parseHello(hello[:])
	if err != nil {
		nc.Close()
		return nil, err
	}
	if inc != c.pool.key.incarnation {
		nc.Close()
		if c.pool.name != "" {
			c.t.e.InvalidatePeer(c.pool.name)
		}
		return nil, status.Errorf(status.TransportError,
			"tcp: the engine at %s is incarnation %#x, the requests were routed to %#x (restarted?)",
			c.pool.key.addr, inc, c.pool.key.incarnation)
	}
	return nc, nil
}

func (c *conn) writeLoop() {
	nc, err := c.dial()
	if err != nil {
		c.t.dialErrs.Add(1)
		c.fail(err)
		return
	}
	buf, free, err := c.t.recvBuffer()
	if err != nil {
		nc.Close()
		c.fail(err)
		return
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		nc.Close()
		free()
		return
	}
	c.nc = nc
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	c.rd = c.newReplyReader(nc, buf)
	_ = nc.SetDeadline(c.deadline)
	c.mu.Unlock()
	c.t.log.Debug("tcp connection up", "addr", c.pool.key.addr, "slot", c.slot, "peer", c.pool.name)
	c.t.goroutine(func() { c.readLoop(free) })

	for {
		c.mu.Lock()
		for !c.handoff && (c.queue.len() == 0 || c.writing) && !c.dead {
			c.wake.Wait()
		}
		if c.handoff {
			// A submitter's group, partly written: the rest goes first
			// (on a dead connection the write fails at once, and the
			// group still ends).
			c.handoff = false
			c.mu.Unlock()
			if !c.endGroup(c.flush(nc)) {
				return
			}
			continue
		}
		if c.dead {
			c.mu.Unlock()
			return
		}
		c.writing = true
		c.takeGroupLocked()
		c.mu.Unlock()
		c.t.writerW.Add(1)
		if !c.writeGroup(nc) {
			return
		}
	}
}

// flush sends what c.iov holds with one writev (or a few, for many
// pieces), waiting for the socket and retrying after a stale deadline,
// and empties it.
func (c *conn) flush(nc net.Conn) error {
	v := &c.iov
	defer v.reset()
	for {
		n, err := v.writeTo(nc)
		c.t.sent.Add(n)
		if err == nil {
			return nil
		}
		if !isTimeout(err) || !c.stillOnTime() {
			return ioError("write to "+c.pool.key.addr, err)
		}
	}
}

// tryFlush sends what the socket takes of c.iov now, without waiting, and
// reports whether that was all (else c.iov keeps the rest). A connection
// without a descriptor (a test's wrapper) is written with flush.
func (c *conn) tryFlush(nc net.Conn) (bool, error) {
	rc := c.raw
	if rc == nil {
		return true, c.flush(nc)
	}
	v := &c.iov
	if v.out == nil {
		v.out = v.buffers()
	}
	for len(v.out) > 0 {
		c.wn, c.werr = 0, nil
		err := rc.Write(c.writev)
		n, werr := c.wn, c.werr
		c.werr = nil
		if err == nil && werr != unix.EAGAIN {
			err = werr
		}
		if err != nil && isTimeout(err) && c.stillOnTime() {
			// A deadline left over from completed requests, which no
			// read has moved yet (a caller reading its own replies).
			continue
		}
		if err != nil {
			return false, ioError("write to "+c.pool.key.addr, err)
		}
		if werr == unix.EAGAIN || n == 0 {
			return false, nil
		}
		c.t.sent.Add(int64(n))
		consume(&v.out, n)
	}
	return true, nil
}

// writevOnce is tryFlush's writev of c.iov.out on fd, which never
// waits for the socket (c.writev, made once, so that a write allocates
// nothing).
func (c *conn) writevOnce(fd uintptr) bool {
	v := &c.iov
	for {
		c.wn, c.werr = unix.Writev(int(fd), v.out[:min(len(v.out), iovMax)])
		if c.werr != unix.EINTR {
			return true
		}
	}
}

// consume drops the first n bytes of b.
func consume(b *net.Buffers, n int) {
	for len(*b) > 0 && n >= len((*b)[0]) {
		n -= len((*b)[0])
		(*b)[0] = nil
		*b = (*b)[1:]
	}
	if n > 0 {
		(*b)[0] = (*b)[0][n:]
	}
}

// newReplyReader reads the replies of nc through buf.
func (c *conn) newReplyReader(nc net.Conn, buf []byte) *bufReader {
	rd := newBufReader(&clientSource{c: c, nc: nc}, replyHeaderSize, buf)
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			rd.setRaw(raw)
		}
		rd.count = &c.t.received
		rd.onTimeout = c.payloadTimedOut
	}
	return rd
}

// readReply reads one reply and completes its chunk; the caller holds
// the read side and has set atBoundary. byCaller: a waiting caller reads
// (else the reader goroutine). It returns errYield when the read side was
// asked for before the reply's header arrived (nothing is lost: what came
// of the header stays in rd), and any other error after failing the
// connection with it.
func (c *conn) readReply(byCaller bool) error {
	rd := c.rd
	b, err := rd.next(replyHeaderSize)
	if err == errYield {
		return err
	}
	if err != nil {
		err = c.cause(ioError("read from "+c.pool.key.addr, err))
		c.fail(err)
		return err
	}
	h, err := parseReplyHeader(b)
	if err != nil {
		c.t.protoErrs.Add(1)
		c.fail(err)
		return err
	}
	c.mu.Lock()
	c.atBoundary = false
	ch := c.sent.peek()
	if ch == nil || ch.id != h.id || ch.s.op != h.op || (h.code == status.OK && h.op == opRead && h.n != ch.n) {
		c.mu.Unlock()
		c.t.protoErrs.Add(1)
		err := status.Errorf(status.Protocol, "tcp: %s sent a reply (id %d, op %d, %d bytes) that does not match the oldest request",
			c.pool.key.addr, h.id, h.op, h.n)
		c.fail(err)
		return err
	}
	c.sent.pop()
	idle := c.sent.len() == 0
	if idle {
		// The idle reaper looks at lastUsed only when nothing is due, so
		// the last reply of a run is the one that counts.
		c.lastUsed = time.Now()
	}
	// A reply without payload or message is in whole with its header:
	// the stream is at the next boundary at once, and no chunk is in hand.
	whole := h.n == 0 && h.msgLen == 0
	if whole {
		c.atBoundary = true
	} else {
		c.reading.Store(ch)
	}
	c.mu.Unlock()
	if byCaller {
		c.t.repliesByCaller.Add(1)
	} else {
		c.t.repliesByReader.Add(1)
	}
	if h.flags&replyStaged != 0 {
		ch.s.markStaged()
	}
	rd.expect(int(h.n))
	if whole {
		var rerr error
		if h.code != status.OK {
			rerr = status.Errorf(h.code, "tcp: %s refused the request", c.pool.key.addr)
		}
		ch.s.chunkDone(rerr, false)
		c.yieldIfDone(byCaller, idle)
		return nil
	}

	var rerr error
	if h.msgLen > 0 {
		msg, err := rd.next(int(h.msgLen))
		if err != nil {
			err = c.cause(ioError("read from "+c.pool.key.addr, err))
			ch.s.chunkDone(chunkErr(ch, err), false)
			c.fail(err)
			return err
		}
		rerr = status.Errorf(h.code, "tcp: %s refused: %s", c.pool.key.addr, msg)
	} else if h.code != status.OK {
		rerr = status.Errorf(h.code, "tcp: %s refused the request", c.pool.key.addr)
	}
	busy := false
	if h.n > 0 {
		var err error
		busy = ch.s.enter()
		if busy {
			err = rd.readInto(host.Bytes(ch.s.local+ch.off, uint64(ch.n)))
		} else {
			err = rd.discard(int(ch.n)) // canceled: its memory may be gone
		}
		if err != nil {
			err = c.cause(ioError("read from "+c.pool.key.addr, err))
			ch.s.chunkDone(chunkErr(ch, err), busy)
			c.fail(err)
			return err
		}
	}
	// The reply is in: whoever takes the read side from here on (it is
	// at the next boundary) loses nothing, even before the completion
	// below wakes a caller.
	c.mu.Lock()
	c.reading.Store(nil)
	c.atBoundary = true
	idle = c.sent.len() == 0
	c.mu.Unlock()
	ch.s.chunkDone(rerr, busy)
	c.yieldIfDone(byCaller, idle)
	return nil
}

// yieldIfDone lets the caller a reply just woke run now, before the reader
// goroutine's next read, which will only find the socket empty, when
// nothing more is due.
func (c *conn) yieldIfDone(byCaller, idle bool) {
	if !byCaller && idle && c.rd.buffered() == 0 {
		runtime.Gosched()
	}
}

// clientSource is the reader's view of the socket: it counts bytes and
// sees through timeouts of a stale deadline.
type clientSource struct {
	c  *conn
	nc net.Conn
}

func (s *clientSource) Read(p []byte) (int, error) {
	for {
		n, err := s.nc.Read(p)
		if n > 0 {
			s.c.t.received.Add(int64(n))
			return n, nil
		}
		if err != nil && isTimeout(err) {
			switch s.c.readTimedOut() {
			case readRetry:
				continue
			case readYield:
				return 0, errYield
			}
		}
		return n, err
	}
}

func readFull(nc net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := nc.Read(b[n:])
		n += m
		if err != nil {
			return n, noEOF(err)
		}
	}
	return n, nil
}

// ring is a FIFO of chunks.
type ring struct {
	buf        []*chunk
	head, size int
}

func (r *ring) len() int { return r.size }

func (r *ring) push(ch *chunk) {
	if r.size == len(r.buf) {
		nb := make([]*chunk, max(16, 2*len(r.buf)))
		for i := 0; i < r.size; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = ch
	r.size++
}

func (r *ring) peek() *chunk {
	if r.size == 0 {
		return nil
	}
	return r.buf[r.head]
}

func (r *ring) pop() *chunk {
	ch := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return ch
}

func (r *ring) each(f func(*chunk)) {
	for i := 0; i < r.size; i++ {
		f(r.buf[(r.head+i)%len(r.buf)])
	}
}

func (r *ring) drain(f func(*chunk)) {
	for r.size > 0 {
		f(r.pop())
	}
}

// closeReason words why a connection closed for its log line: the error
// that closed it names requests in flight, which is wrong when none were.
func closeReason(err error, held int) string {
	if held == 0 && errors.Is(err, core.ErrUninstalled) {
		return "transport uninstalled"
	}
	return err.Error()
}
