package rdma

import (
	"runtime"
	"time"

	"github.com/tent-dev/tent/status"
)

// Polling: one goroutine per NIC polls its completion queue while work is
// in flight, yielding between empty polls and then sleeping briefly, and
// parks on the NIC's wake channel when nothing is in flight, so an idle
// transport costs no CPU.
const (
	pollBatch     = 64
	spinPolls     = 64
	idleSleep     = 20 * time.Microsecond
	deadlineCheck = 2 * time.Millisecond
)

func (t *Transport) poll(n *nic) {
	defer t.pollers.Done()
	buf := make([]completion, pollBatch)
	empty := 0
	lastCheck := time.Now()
	for {
		k, err := n.cq.Poll(buf)
		if err != nil {
			t.failNIC(n, status.Errorf(status.TransportError, "rdma: polling %s: %v", n.info.Name, err))
			select {
			case <-t.stop:
				return
			case <-time.After(time.Millisecond): // a failing CQ is not polled in a hot loop
			}
			continue
		}
		if k > 0 {
			t.completions(n, buf[:k])
			empty = 0
			continue
		}
		if now := time.Now(); now.Sub(lastCheck) >= deadlineCheck {
			lastCheck = now
			t.expire(n, now)
		}
		n.mu.Lock()
		idle := len(n.inflight) == 0
		n.mu.Unlock()
		if idle {
			select {
			case <-n.wake:
			case <-t.stop:
				return
			}
			continue
		}
		select {
		case <-t.stop:
			return
		default:
		}
		if empty++; empty < spinPolls {
			runtime.Gosched()
		} else {
			time.Sleep(idleSleep)
		}
	}
}

// completions handles polled completions: successes complete their work
// requests, a failure breaks its queue pair (failing the rest of its
// work), and freed send-queue room is used for queued work.
func (t *Transport) completions(n *nic, cs []completion) {
	type done struct {
		wr  *workRequest
		err error
	}
	var finished []done
	var broken []*queuePair
	var brokenErr []error
	touched := map[*queuePair]bool{}
	n.mu.Lock()
	for _, c := range cs {
		wr := n.inflight[c.ID]
		if wr == nil {
			continue // a queue pair already broken: its work was failed then
		}
		// Completions of a queue pair come in posting order: the
		// unsignalled work requests posted before this one are done, and
		// they succeeded (an error completes even unsignalled work).
		qp := wr.qp
		for len(qp.sent) > 0 {
			w := qp.sent[0]
			qp.sent = qp.sent[1:]
			delete(n.inflight, w.wr.ID)
			qp.posted--
			if w == wr {
				break
			}
			finished = append(finished, done{w, nil})
		}
		if c.Status != wcSuccess {
			err := wcError(c, wr.qp.key.peer)
			finished = append(finished, done{wr, err})
			if wr.qp.state != qpBroken {
				wr.qp.state = qpBroken
				broken = append(broken, wr.qp)
				brokenErr = append(brokenErr, status.Errorf(status.TransportError,
					"rdma: queue pair to %s failed (%v)", wr.qp.key.peer, c.Status))
			}
			continue
		}
		finished = append(finished, done{wr, nil})
		touched[wr.qp] = true
	}
	var postFailed []*queuePair
	var postErr []error
	for qp := range touched {
		if err := t.flushLocked(qp); err != nil {
			postFailed, postErr = append(postFailed, qp), append(postErr, err)
		}
	}
	n.mu.Unlock()
	for _, f := range finished {
		f.wr.req.complete(n, f.wr, uint64(f.wr.wr.Length), f.err)
	}
	for i, qp := range broken {
		t.breakQP(qp, brokenErr[i])
	}
	for i, qp := range postFailed {
		t.breakQP(qp, postErr[i])
	}
}

// expire breaks every queue pair with work past its deadline: the work
// fails with TIMEOUT (a peer that stopped answering cannot hold a request
// beyond it), and so does the rest of that queue pair's work.
func (t *Transport) expire(n *nic, now time.Time) {
	var late []*queuePair
	n.mu.Lock()
	seen := map[*queuePair]bool{}
	for _, wr := range n.inflight {
		if !wr.deadline.IsZero() && now.After(wr.deadline) && !seen[wr.qp] {
			seen[wr.qp] = true
			late = append(late, wr.qp)
		}
	}
	n.mu.Unlock()
	for _, qp := range late {
		t.breakQP(qp, status.Errorf(status.Timeout, "rdma: request to %s passed its deadline", qp.key.peer))
	}
}

// failNIC breaks every queue pair on n (its completion queue failed).
func (t *Transport) failNIC(n *nic, err error) {
	for _, qp := range t.queuePairs() {
		if qp.nic == n {
			t.breakQP(qp, err)
		}
	}
}
