package core

import (
	"sync"
	"time"

	"github.com/tent-dev/tent/status"
)

// Notification is a message another engine sent this one.
type Notification struct {
	From string
	Msg  []byte
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
