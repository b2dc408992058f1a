package core

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tent-dev/tent/status"
)

// Notification is a message another engine sent this one. From is the
// name the sender's connection gave in its handshake (for an engine of this
// process, its name): with a secret, a name proved by a holder of the
// secret; without one, only what the peer says.
type Notification struct {
	From string
	Msg  []byte
}

// senderGate delivers a notification that came over the network only under
// the name the connection's handshake gave: the sender name inside the
// notification frame must be that name, or the notification is refused.
// (The secret is shared, so it proves that a peer is one of the engines
// that hold it, not which one: a holder can give any name in its
// handshake. What the gate ensures is that a notification never names a
// sender other than the one its connection authenticated as.)
type senderGate struct {
	refused atomic.Int64 // notifications refused for naming another sender

	mu     sync.Mutex
	logged map[string]struct{} // peers whose refusal was logged, bounded
}

// maxLoggedSenders bounds the peers a refusal is logged for: each logs
// once, and made-up names cannot grow the set without limit (the counter
// still counts every refusal).
const maxLoggedSenders = 1024

// check returns nil when claimed is the connection's name peer; otherwise
// it counts the refusal, logs the first one of each peer and returns the
// error the sender sees.
// A name with a NUL byte is refused too: C reads the sender as a
// NUL-terminated string, so "victim\x00x" would reach it as "victim".
func (g *senderGate) check(e *Engine, peer, claimed string) error {
	var err error
	switch {
	case claimed != peer:
		err = status.Errorf(status.PermissionDenied,
			"notification names sender %q but its connection's handshake named %q", claimed, peer)
	case strings.IndexByte(peer, 0) >= 0:
		err = status.Errorf(status.PermissionDenied, "notification from %q: a sender name holds no NUL byte", peer)
	default:
		return nil
	}
	g.refused.Add(1)
	if g.firstFrom(peer) {
		e.log.Warn("notification refused: its sender is not the name its connection gave",
			"peer", peer, "claimed", claimed, "authenticated", len(e.opts.Secret) > 0)
	}
	return err
}

func (g *senderGate) firstFrom(peer string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, seen := g.logged[peer]; seen || len(g.logged) >= maxLoggedSenders {
		return false
	}
	if g.logged == nil {
		g.logged = map[string]struct{}{}
	}
	g.logged[peer] = struct{}{}
	return true
}

// notifyQueue holds received notifications until the application takes
// them. It is bounded: a full queue refuses new messages with ErrBusy,
// which the sender sees, instead of growing without limit.
type notifyQueue struct {
	mu     sync.Mutex
	items  []Notification
	bytes  int
	wake   chan struct{} // closed and replaced on every push
	closed bool
}

const (
	maxQueuedNotes = 65536
	maxQueuedBytes = 256 << 20
)

func newNotifyQueue() *notifyQueue { return &notifyQueue{wake: make(chan struct{})} }

func (q *notifyQueue) push(from string, msg []byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return status.Errorf(status.Closed, "receiving engine is closed")
	case len(q.items) >= maxQueuedNotes || q.bytes+len(msg) > maxQueuedBytes:
		return status.Errorf(status.Busy, "receiver's notification queue is full (%d messages)", len(q.items))
	}
	q.items = append(q.items, Notification{From: from, Msg: append([]byte(nil), msg...)})
	q.bytes += len(msg)
	close(q.wake)
	q.wake = make(chan struct{})
	return nil
}

// Recv returns the oldest notification, waiting up to timeout. take
// decides whether the message is consumed (false leaves it queued, for a
// caller whose buffer is too small).
func (q *notifyQueue) recv(timeout time.Duration, take func(Notification) bool) (Notification, error) {
	var timer *time.Timer
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return Notification{}, status.Errorf(status.Closed, "engine is closed")
		}
		if len(q.items) > 0 {
			n := q.items[0]
			if take(n) {
				q.items[0] = Notification{}
				q.items = q.items[1:]
				q.bytes -= len(n.Msg)
			}
			q.mu.Unlock()
			return n, nil
		}
		wake := q.wake
		q.mu.Unlock()
		if timeout <= 0 {
			return Notification{}, status.Errorf(status.Timeout, "no notification")
		}
		if timer == nil {
			timer = time.NewTimer(timeout)
			defer timer.Stop()
		}
		select {
		case <-wake:
		case <-timer.C:
			return Notification{}, status.Errorf(status.Timeout, "no notification within %v", timeout)
		}
	}
}

func (q *notifyQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.wake)
	}
}

func (q *notifyQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// RecvNotification takes the oldest notification, waiting up to timeout.
// take may refuse it (it then stays queued).
func (e *Engine) RecvNotification(timeout time.Duration, take func(Notification) bool) (Notification, error) {
	return e.notes.recv(timeout, take)
}

// SendNotification delivers msg to the segment's engine.
func (e *Engine) SendNotification(s *Segment, msg []byte) error {
	if s == nil || s.peer.e != e || s.closed.Load() {
		return status.Errorf(status.InvalidHandle, "segment is closed or belongs to another engine")
	}
	if len(msg) > MaxNotifyLen {
		return status.Errorf(status.InvalidArgument, "notification of %d bytes exceeds %d", len(msg), MaxNotifyLen)
	}
	if e.Closed() {
		return status.Errorf(status.Closed, "engine is closed")
	}
	return s.peer.notify(msg, time.Now().Add(e.opts.DefaultTimeout))
}

// notifyTargets sends a batch's notification to every peer it wrote to or
// read from, once each.
func (e *Engine) notifyTargets(b *Batch) error {
	seen := map[*Peer]bool{}
	for i := range b.reqs {
		p := b.reqs[i].Peer
		if seen[p] {
			continue
		}
		seen[p] = true
		if err := p.notify(b.notify, b.deadline); err != nil {
			return status.Errorf(status.CodeOf(err), "notification to %s: %w", p.name, err)
		}
	}
	return nil
}
