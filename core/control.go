package core

import (
	"net"
	"sync"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Control frames, on KindControl connections. Requests carry a u64 id that
// the reply echoes; pushes carry none.
const (
	ctlGetDesc    uint8 = 1 // C->S: u64 id
	ctlDesc       uint8 = 2 // S->C: u64 id, i32 code, str message, bytes descriptor
	ctlChanged    uint8 = 3 // S->C push: u64 incarnation, u64 generation
	ctlNotify     uint8 = 4 // C->S: u64 id, str from (the handshake's name), bytes message
	ctlNotifyDone uint8 = 5 // S->C: u64 id, i32 code, str message
)

const maxCtlFrame = wire.MaxDescriptorSize + 1024

// serveControl answers one control connection: descriptors, notifications,
// and a push whenever this engine's registrations change. peer is the name
// the connection's handshake gave, the only sender its notifications may
// name.
func (e *Engine) serveControl(c net.Conn, peer string) {
	var wmu sync.Mutex
	write := func(typ uint8, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		_ = c.SetWriteDeadline(time.Now().Add(e.opts.DefaultTimeout))
		return wire.WriteFrame(c, typ, payload)
	}
	changed := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	subscribed := false
	var buf []byte
	for {
		// Idle between requests for as long as the peer likes, but a frame
		// once begun must arrive within the engine's timeout.
		typ, payload, err := wire.ReadFrameWithin(c, c, maxCtlFrame, buf, e.opts.DefaultTimeout)
		if err != nil {
			return
		}
		buf = payload[:0]
		d := wire.NewDecoder(payload)
		id := d.U64()
		switch typ {
		case ctlGetDesc:
			if err := d.Finish(); err != nil {
				return
			}
			if !subscribed {
				subscribed = true
				e.subscribers.add(changed)
				go pushChanges(e, write, changed, stop)
			}
			desc, derr := e.EncodedDescriptor()
			enc := wire.NewEncoder(make([]byte, 0, len(desc)+32))
			enc.U64(id)
			enc.Status(derr)
			enc.Bytes(desc)
			if write(ctlDesc, enc.Out()) != nil {
				return
			}
		case ctlNotify:
			from := d.String(wire.MaxNameLen)
			msg := d.Bytes(MaxNotifyLen)
			if err := d.Finish(); err != nil {
				return
			}
			nerr := e.senders.check(e, peer, from)
			if nerr == nil {
				nerr = e.notes.push(peer, msg)
			}
			enc := wire.NewEncoder(nil)
			enc.U64(id)
			enc.Status(nerr)
			if write(ctlNotifyDone, enc.Out()) != nil {
				return
			}
		default:
			return // unknown frame: the peer speaks something else
		}
	}
}

func pushChanges(e *Engine, write func(uint8, []byte) error, changed, stop chan struct{}) {
	defer e.subscribers.remove(changed)
	for {
		select {
		case <-stop:
			return
		case <-changed:
			enc := wire.NewEncoder(nil)
			enc.U64(e.incarnation)
			enc.U64(e.Generation())
			if write(ctlChanged, enc.Out()) != nil {
				return
			}
		}
	}
}

// link is the initiator's control connection to one peer.
type link struct {
	addr   string
	conn   net.Conn
	onPush func(incarnation, generation uint64)
	wmu    sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan ctlReply
	err     error // set once the link is dead
	done    chan struct{}
}

type ctlReply struct {
	typ     uint8
	payload []byte
}

func (e *Engine) dialLink(addr string, deadline time.Time, onPush func(uint64, uint64)) (*link, error) {
	c, err := e.Dial(addr, KindControl, deadline)
	if err != nil {
		e.log.Debug("control link dial failed", "addr", addr, "err", err)
		return nil, err
	}
	e.log.Debug("control link up", "addr", addr)
	l := &link{addr: addr, conn: c, onPush: onPush, pending: map[uint64]chan ctlReply{}, done: make(chan struct{})}
	if !e.links.track(l) {
		c.Close()
		return nil, status.Errorf(status.Closed, "engine is closed")
	}
	go l.readLoop(e)
	return l, nil
}

func (l *link) readLoop(e *Engine) {
	defer e.links.readerDone()
	defer e.links.untrack(l)
	for {
		typ, payload, err := wire.ReadFrame(l.conn, maxCtlFrame, nil)
		if err != nil {
			l.fail(status.Errorf(status.TransportError, "control connection lost: %w", err))
			l.mu.Lock()
			why := l.err // the first failure: "engine closed" when closed on purpose
			l.mu.Unlock()
			e.log.Debug("control link down", "addr", l.addr, "reason", why)
			return
		}
		d := wire.NewDecoder(payload)
		if typ == ctlChanged {
			inc, gen := d.U64(), d.U64()
			if d.Finish() == nil && l.onPush != nil {
				l.onPush(inc, gen)
			}
			continue
		}
		id := d.U64()
		l.mu.Lock()
		ch := l.pending[id]
		delete(l.pending, id)
		l.mu.Unlock()
		if ch != nil {
			ch <- ctlReply{typ, payload[8:]}
		}
	}
}

func (l *link) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		close(l.done)
	}
	for id, ch := range l.pending {
		delete(l.pending, id)
		close(ch)
	}
	l.mu.Unlock()
	l.conn.Close()
}

func (l *link) dead() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// call sends a request frame and waits for its reply by deadline. A
// timed-out call kills the link: the reply would arrive out of step.
func (l *link) call(typ uint8, body func(*wire.Encoder), want uint8, deadline time.Time) ([]byte, error) {
	ch := make(chan ctlReply, 1)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.err
	}
	l.nextID++
	id := l.nextID
	l.pending[id] = ch
	l.mu.Unlock()

	enc := wire.NewEncoder(nil)
	enc.U64(id)
	body(&enc)
	l.wmu.Lock()
	_ = l.conn.SetWriteDeadline(deadline)
	err := wire.WriteFrame(l.conn, typ, enc.Out())
	l.wmu.Unlock()
	if err != nil {
		l.fail(status.Errorf(status.TransportError, "control write: %w", err))
		return nil, status.Errorf(status.CodeOf(err), "control write: %w", err)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case rep, ok := <-ch:
		if !ok {
			l.mu.Lock()
			defer l.mu.Unlock()
			return nil, l.err
		}
		if rep.typ != want {
			err := status.Errorf(status.Protocol, "control reply of type %d, want %d", rep.typ, want)
			l.fail(err)
			return nil, err
		}
		return rep.payload, nil
	case <-t.C:
		err := status.Errorf(status.Timeout, "peer did not answer by the deadline")
		l.fail(err)
		return nil, err
	}
}

func (l *link) close() { l.fail(status.Errorf(status.Closed, "engine closed")) }
