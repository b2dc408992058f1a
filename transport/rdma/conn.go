package rdma

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// connKey names an initiator queue pair: one per peer incarnation, local
// NIC and remote NIC.
type connKey struct {
	peer        string
	incarnation uint64
	local       int
	remote      int
}

// qpState is where an initiator queue pair is in its life.
type qpState int

const (
	qpConnecting qpState = iota
	qpReady
	qpBroken
)

// queuePair is one initiator queue pair and the work waiting for it. Its
// mutable fields are guarded by its NIC's mu.
type queuePair struct {
	key   connKey
	nic   *nic
	addr  string // the peer's listener
	state qpState
	qp    devQP
	conn  net.Conn
	queue []*workRequest // not yet posted
	// posted counts work requests posted and not yet completed; sent
	// holds them in posting order (the order their completions come in).
	posted int
	sent   []*workRequest
	// err is why the queue pair broke: what work that arrives later fails
	// with.
	err      error
	teardown sync.Once
}

// QP sizes: the send queue bounds work requests in flight per queue pair;
// nothing is received (one-sided operations only).
const (
	sendDepth = 256
	maxPost   = 64 // work requests chained into one post (one doorbell)
)

var queuePairCaps = qpCaps{MaxSendWR: sendDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}

// connectTimeout bounds a queue pair's set-up when the request that asked
// for it has a later deadline.
const connectTimeout = 10 * time.Second

func randomPSN() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

// queuePairFor returns the live queue pair for key, starting one (its
// set-up runs in the background) when there is none or the last one broke.
func (t *Transport) queuePairFor(key connKey, addr string, deadline time.Time) (*queuePair, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, status.Errorf(status.Closed, "rdma transport is uninstalled")
	}
	qp := t.conns[key]
	if qp != nil {
		n := qp.nic
		n.mu.Lock()
		broken := qp.state == qpBroken
		n.mu.Unlock()
		if !broken {
			return qp, nil
		}
	}
	qp = &queuePair{key: key, nic: t.nics[key.local], addr: addr}
	t.conns[key] = qp
	if d := time.Now().Add(connectTimeout); deadline.IsZero() || deadline.After(d) {
		deadline = d
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.connect(qp, deadline)
	}()
	return qp, nil
}

// connect creates the queue pair, exchanges its parameters with the peer
// over the authenticated connect channel, brings it to RTS and posts what
// waited for it. Any failure breaks it: its work fails (and core retries
// it on the next transport).
func (t *Transport) connect(qp *queuePair, deadline time.Time) {
	n := qp.nic
	vqp, conn, err := t.dialQP(qp, deadline)
	n.mu.Lock()
	if err == nil && qp.state == qpBroken {
		err = status.Errorf(status.Closed, "rdma transport is uninstalled")
	}
	if err != nil {
		n.mu.Unlock()
		if vqp != nil {
			_ = vqp.Destroy()
			t.qpsLive(n, -1)
		}
		if conn != nil {
			_ = conn.Close()
		}
		t.breakQP(qp, err)
		return
	}
	qp.qp, qp.conn, qp.state = vqp, conn, qpReady
	failed := t.flushLocked(qp)
	n.mu.Unlock()
	n.poke()
	if failed != nil {
		t.breakQP(qp, failed)
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		// Nothing is sent after the exchange: a read returns only when the
		// peer closes, dies, or we tear the queue pair down.
		_, _ = io.Copy(io.Discard, conn)
		t.breakQP(qp, status.Errorf(status.TransportError, "rdma: connection to %s for queue pair closed", qp.key.peer))
	}()
}

// dialQP makes an RTS queue pair connected to the peer's, or fails with
// everything it made returned for the caller to release.
func (t *Transport) dialQP(qp *queuePair, deadline time.Time) (devQP, net.Conn, error) {
	n := qp.nic
	vqp, err := n.pd.CreateRCQP(n.cq, queuePairCaps)
	if err != nil {
		return nil, nil, status.Errorf(status.TransportError, "rdma: %v", err)
	}
	t.qpsLive(n, 1)
	// The initiator's queue pair serves no remote access: peers write and
	// read only through the queue pairs they connect to us.
	vqp.SetSourceGIDIndex(uint8(t.gidIndex))
	if err := vqp.ToInit(n.port, 0); err != nil {
		return vqp, nil, status.Errorf(status.TransportError, "rdma: %v", err)
	}
	psn := randomPSN()
	conn, err := t.e.DialContext(t.ctx, qp.addr, KindConnect, deadline)
	if err != nil {
		return vqp, nil, err
	}
	_ = conn.SetDeadline(deadline)
	enc := wire.NewEncoder(nil)
	enc.U8(uint8(qp.key.remote))
	enc.U64(qp.key.incarnation)
	putAddr(&enc, n.addr(vqp.Num(), psn))
	enc.U8(uint8(n.attr.ActiveMTU))
	if err := wire.WriteFrame(conn, frameConnect, enc.Out()); err != nil {
		return vqp, conn, status.Errorf(status.TransportError, "rdma: sending queue pair to %s: %v", qp.key.peer, err)
	}
	typ, payload, err := wire.ReadFrame(conn, maxFrame, nil)
	if err != nil {
		return vqp, conn, status.Errorf(status.TransportError, "rdma: queue pair reply from %s: %v", qp.key.peer, err)
	}
	remote, pathMTU, err := decodeReply(typ, payload, qp.key.peer)
	if err != nil {
		return vqp, conn, err
	}
	if n.attr.ActiveMTU < pathMTU {
		pathMTU = n.attr.ActiveMTU
	}
	if err := vqp.ToRTR(remote, pathMTU); err != nil {
		return vqp, conn, status.Errorf(status.TransportError, "rdma: %v", err)
	}
	if err := vqp.ToRTS(psn); err != nil {
		return vqp, conn, status.Errorf(status.TransportError, "rdma: %v", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return vqp, conn, nil
}

func (t *Transport) qpsLive(n *nic, d int) {
	n.mu.Lock()
	n.qps += d
	n.mu.Unlock()
}

// breakQP takes a queue pair out of service: to the error state, every
// work request posted or waiting on it failed with err, then destroyed
// with its connection (the peer destroys its half when that closes). Late
// completions of the failed work requests are ignored. The next request
// for its key builds a new one.
func (t *Transport) breakQP(qp *queuePair, err error) {
	n := qp.nic
	n.mu.Lock()
	qp.state = qpBroken
	if qp.err == nil {
		qp.err = err
	}
	var failed []*workRequest
	for id, wr := range n.inflight {
		if wr.qp == qp {
			failed = append(failed, wr)
			delete(n.inflight, id)
		}
	}
	failed = append(failed, qp.queue...)
	qp.queue, qp.posted, qp.sent = nil, 0, nil
	vqp, conn := qp.qp, qp.conn
	n.mu.Unlock()
	qp.teardown.Do(func() {
		if vqp != nil {
			// To the error state first: the NIC stops working on it before
			// its requests are reported and their memory let go.
			_ = vqp.ToError()
			_ = vqp.Destroy()
			t.qpsLive(n, -1)
		}
		if conn != nil {
			_ = conn.Close()
		}
	})
	for _, wr := range failed {
		wr.req.complete(n, wr, 0, err)
	}
}

// serveConnect is the target side of one queue pair: it checks the
// request, makes a queue pair on the NIC asked for, connects it to the
// initiator's and answers; the queue pair lives until the connection
// closes.
func (t *Transport) serveConnect(c net.Conn, peer string) {
	if !t.targets.add(c) {
		_ = c.Close()
		return
	}
	defer t.targets.remove(c)
	_ = c.SetDeadline(time.Now().Add(connectTimeout))
	typ, payload, err := wire.ReadFrame(c, maxFrame, nil)
	if err != nil || typ != frameConnect {
		return
	}
	d := wire.NewDecoder(payload)
	nicIdx := int(d.U8())
	incarnation := d.U64()
	remote := getAddr(&d)
	pathMTU := mtu(d.U8())
	if err := d.Finish(); err != nil {
		refuse(c, status.Protocol, "malformed connect frame")
		return
	}
	if incarnation != t.e.Incarnation() {
		refuse(c, status.TransportError, "stale descriptor: engine restarted")
		return
	}
	if nicIdx >= len(t.nics) {
		refuse(c, status.Protocol, fmt.Sprintf("no NIC %d (%d NICs)", nicIdx, len(t.nics)))
		return
	}
	n := t.nics[nicIdx]
	psn := randomPSN()
	vqp, err := t.acceptQP(n, remote, pathMTU, psn)
	if err != nil {
		refuse(c, status.TransportError, err.Error())
		return
	}
	defer func() {
		_ = vqp.ToError()
		_ = vqp.Destroy()
		t.qpsLive(n, -1)
		t.targetQPs.Add(-1)
	}()
	t.targetQPs.Add(1)
	if n.attr.ActiveMTU < pathMTU {
		pathMTU = n.attr.ActiveMTU
	}
	enc := wire.NewEncoder(nil)
	putAddr(&enc, n.addr(vqp.Num(), psn))
	enc.U8(uint8(pathMTU))
	if err := wire.WriteFrame(c, frameAccept, enc.Out()); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, c)
	t.e.Logger().Debug("rdma queue pair closed", "peer", peer, "nic", n.info.Name)
}

// acceptQP makes the target's queue pair, RTS and connected to remote.
// Its access lets peers read and write: what each may touch is the MRs'
// access (register.go), checked by the NIC.
func (t *Transport) acceptQP(n *nic, remote qpAddr, pathMTU mtu, psn uint32) (devQP, error) {
	vqp, err := n.pd.CreateRCQP(n.cq, queuePairCaps)
	if err != nil {
		return nil, err
	}
	t.qpsLive(n, 1)
	fail := func(err error) (devQP, error) {
		_ = vqp.Destroy()
		t.qpsLive(n, -1)
		return nil, err
	}
	vqp.SetSourceGIDIndex(uint8(t.gidIndex))
	if err := vqp.ToInit(n.port, accessLocalWrite|accessRemoteRead|accessRemoteWrite); err != nil {
		return fail(err)
	}
	if n.attr.ActiveMTU < pathMTU {
		pathMTU = n.attr.ActiveMTU
	}
	if err := vqp.ToRTR(remote, pathMTU); err != nil {
		return fail(err)
	}
	if err := vqp.ToRTS(psn); err != nil {
		return fail(err)
	}
	return vqp, nil
}

func refuse(c net.Conn, code status.Code, why string) {
	enc := wire.NewEncoder(nil)
	enc.U32(uint32(int32(code)))
	if len(why) > maxReason {
		why = why[:maxReason]
	}
	enc.String(why)
	_ = wire.WriteFrame(c, frameRefuse, enc.Out())
}

// connSet is the target's open connect-channel connections, closed by
// Uninstall.
type connSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// closeAll closes every connection and waits for their handlers, which
// destroy their queue pairs.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
