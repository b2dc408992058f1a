//go:build linux

package shm

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/acceptloop"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/internal/lease"
	"github.com/tent-dev/tent/wire"
)

// client is the initiator's state for one incarnation of one peer: the
// address of its listener and the current connection. A peer that
// restarts has a new incarnation and gets a new client, so nothing of the
// old one (connection, mappings) can be used for it.
type client struct {
	t    *Transport
	peer *core.Peer
	inc  uint64
	name string
	addr string
	pid  uint32 // the descriptor's pid, checked against the kernel's answer

	mu      sync.Mutex
	conn    *conn
	dialing chan struct{} // non-nil while a dial runs (single flight)
}

// conn is one initiator connection: leases waiting for their grant, and
// the mappings of the memfds received on it. Mappings live no longer than
// the connection, so the target's per-connection record of what it sent
// always matches what is mapped.
type conn struct {
	t   *Transport
	cl  *client
	c   *net.UnixConn
	pid int // the target's pid, from SO_PEERCRED (0: not visible here)

	wmu  sync.Mutex
	wbuf []byte // release frames

	mu      sync.Mutex
	pending map[uint64]*job // lease id -> job waiting for its grant
	nextID  uint64
	maps    map[uint64]*mapping // allocation id -> mapping
	epoch   uint64              // the peer epoch the mappings were checked at
	err     error               // set once the connection is dead
	dead    chan struct{}
	down    atomic.Bool // set just before dead closes: what a copy checks between requests
	users   int         // jobs between their lease request and its release
	retired bool        // replaced (peer restarted): close when users reach 0

	// Standing grants (see cache.go), on their own lock: the per-batch
	// lookup takes it, and a revoke waits on it for copies to end.
	gmu      sync.Mutex
	gidle    *sync.Cond // on gmu: a dead grant's last copy ended
	grants   []*standing
	grantIDs map[uint64]*standing
}

// mapping is a target's memfd mapped here. refs counts copies in
// progress; a dropped mapping is unmapped when the last one ends, so no
// copy ever runs on unmapped memory.
type mapping struct {
	alloc    uint64
	base     uint64
	size     uint64
	gen      uint64 // the target's generation when it was granted
	writable bool
	mem      []byte
	refs     int         // on conn.mu
	dropped  atomic.Bool // set on conn.mu; read without it by a copy that holds a reference
}

// clientFor returns the client for r's peer at the incarnation of r's
// descriptor, replacing (and closing) one for an older incarnation.
func (t *Transport) clientFor(r *core.Request) (*client, error) {
	d := r.Desc
	addr := endpoint(d)
	if addr == "" {
		return nil, status.Errorf(status.Unsupported, "peer %s publishes no shm endpoint", r.Peer.Name())
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, core.ErrUninstalled
	}
	cl := t.clients[r.Peer]
	var old *client
	if cl == nil || cl.inc != d.Incarnation || cl.addr != addr {
		old = cl
		cl = &client{t: t, peer: r.Peer, inc: d.Incarnation, name: d.Name, addr: addr, pid: d.PID}
		t.clients[r.Peer] = cl
	}
	t.mu.Unlock()
	if old != nil {
		old.retire()
	}
	return cl, nil
}

// retire detaches the client's connection; it closes once the jobs using
// it have released their leases (closing it earlier would make the target
// release leases under copies still running).
func (cl *client) retire() {
	cl.mu.Lock()
	c := cl.conn
	cl.conn = nil
	cl.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	c.retired = true
	idle := c.users == 0
	c.mu.Unlock()
	if idle {
		c.fail(status.Errorf(status.TransportError, "peer %s restarted", cl.name))
	}
}

// use registers a job on the connection and allocates its lease id; it
// fails if the connection is dead.
func (c *conn) use(j *job) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, status.Errorf(status.TransportError, "shm: connection to %s lost: %v", c.cl.name, c.err)
	}
	c.users++
	c.nextID++
	c.pending[c.nextID] = j
	return c.nextID, nil
}

// unuse ends a job's use; the last user of a retired connection closes it.
func (c *conn) unuse() {
	c.mu.Lock()
	c.users--
	last := c.retired && c.users == 0
	c.mu.Unlock()
	if last {
		c.fail(status.Errorf(status.TransportError, "peer %s restarted", c.cl.name))
	}
}

// live returns the client's connection if it is up, never dialing.
func (cl *client) live() *conn {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if c := cl.conn; c != nil && !c.isDead() {
		return c
	}
	return nil
}

// connect returns a live connection, dialing one by deadline if needed.
func (cl *client) connect(deadline time.Time) (*conn, error) {
	t := cl.t
	for {
		cl.mu.Lock()
		if c := cl.conn; c != nil && !c.isDead() {
			cl.mu.Unlock()
			return c, nil
		}
		if w := cl.dialing; w != nil {
			cl.mu.Unlock()
			timer := time.NewTimer(time.Until(deadline))
			select {
			case <-w:
				timer.Stop()
				continue
			case <-timer.C:
				return nil, status.Errorf(status.Timeout, "shm: connecting to %s timed out", cl.name)
			case <-t.done:
				timer.Stop()
				return nil, core.ErrUninstalled
			}
		}
		w := make(chan struct{})
		cl.dialing = w
		cl.mu.Unlock()
		c, err := cl.dial(deadline)
		if err != nil {
			t.log.Debug("shm session failed to connect", "peer", cl.name, "addr", cl.addr, "err", err)
		} else {
			t.log.Debug("shm session up", "peer", cl.name, "addr", cl.addr, "pid", c.pid)
		}
		cl.mu.Lock()
		cl.dialing = nil
		if err == nil {
			cl.conn = c
		}
		cl.mu.Unlock()
		close(w)
		return c, err
	}
}

func (cl *client) dial(deadline time.Time) (*conn, error) {
	t := cl.t
	d := net.Dialer{Deadline: deadline}
	nc, err := d.Dial("unix", cl.addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			// Nobody listens there: the peer is gone or restarted, so its
			// descriptor is stale. (Or it lives in another network
			// namespace, where abstract sockets are not shared: then every
			// batch pays this refused dial and a retry on the next
			// transport; give such hosts distinct TENT_MACHINE_IDs.)
			t.e.InvalidatePeer(cl.peer.Name())
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil, status.Errorf(status.Timeout, "shm: connect to %s at %s: %w", cl.name, cl.addr, err)
		}
		return nil, status.Errorf(status.TransportError, "shm: connect to %s at %s: %w", cl.name, cl.addr, err)
	}
	uc := nc.(*net.UnixConn)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = uc.Close()
		return nil, core.ErrUninstalled
	}
	t.dials[uc] = struct{}{} // so Uninstall can cut a handshake short
	t.mu.Unlock()
	untrack := func() {
		t.mu.Lock()
		delete(t.dials, uc)
		t.mu.Unlock()
	}
	name, err := wire.ClientHandshake(uc, wire.HandshakeConfig{
		Secret: t.secret, Deadline: deadline, LocalName: t.e.Name(),
	}, kindShm)
	if err == nil && name != cl.name {
		err = status.Errorf(status.TransportError, "shm: %s answers as %q, not %q", cl.addr, name, cl.name)
	}
	var pid int
	if err == nil {
		pid, err = peerPID(uc)
	}
	if err != nil {
		untrack()
		_ = uc.Close()
		if status.CodeOf(err) == status.Internal {
			err = status.Errorf(status.TransportError, "shm: %s: %w", cl.name, err)
		}
		return nil, err
	}
	c := &conn{t: t, cl: cl, c: uc, pid: pid, pending: map[uint64]*job{}, maps: map[uint64]*mapping{},
		dead: make(chan struct{}), epoch: cl.peer.Epoch(), grantIDs: map[uint64]*standing{}}
	c.gidle = sync.NewCond(&c.gmu)
	t.mu.Lock()
	delete(t.dials, uc)
	if t.closed {
		t.mu.Unlock()
		_ = uc.Close()
		return nil, core.ErrUninstalled
	}
	t.conns[c] = struct{}{}
	t.spawnLocked(c.readLoop)
	t.mu.Unlock()
	return c, nil
}

// peerPID asks the kernel who is at the other end: the pid process_vm
// needs, valid in this process's pid namespace whatever the descriptor
// says (0 if the peer is not visible in it).
func peerPID(uc *net.UnixConn) (int, error) {
	cred, err := acceptloop.PeerCred(uc)
	if err != nil {
		return 0, status.Errorf(status.TransportError, "shm: %w", err)
	}
	return cred.PID, nil // 0 when the peer's pid namespace is not ours: no process_vm
}

func (c *conn) isDead() bool { return c.down.Load() }

// fail marks the connection dead, wakes every waiter, drops every mapping
// (unmapped now, or when the last copy using it ends) and closes the
// socket, which ends the reader. Idempotent.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.down.Store(true)
	close(c.dead)
	c.t.log.Debug("shm session closed", "peer", c.cl.name, "pending", len(c.pending), "mappings", len(c.maps), "reason", err)
	clear(c.pending)
	for id, m := range c.maps {
		delete(c.maps, id)
		c.dropLocked(m)
	}
	c.mu.Unlock()
	c.dropGrants()
	_ = c.c.Close()
}

func (c *conn) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// dropLocked retires m; c.mu is held.
func (c *conn) dropLocked(m *mapping) {
	m.dropped.Store(true)
	if m.refs == 0 {
		c.unmap(m)
	}
}

func (c *conn) unmap(m *mapping) {
	if m.mem == nil {
		return
	}
	_ = unix.Munmap(m.mem)
	m.mem = nil
	c.t.mappings.Add(-1)
	c.t.mappedBytes.Add(-int64(m.size))
}

// getMapping returns the live mapping of allocation id with a reference
// held, or nil. This is the check before every use: the id comes from the
// target's grant for this very copy, the mapping belongs to this
// connection (hence to the peer's current incarnation), and a dropped
// mapping is never handed out.
func (c *conn) getMapping(id uint64) *mapping {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.maps[id]
	if m == nil || m.dropped.Load() || c.err != nil {
		return nil
	}
	m.refs++
	return m
}

func (c *conn) putMapping(m *mapping) {
	c.mu.Lock()
	m.refs--
	if m.dropped.Load() && m.refs == 0 {
		c.unmap(m)
	}
	c.mu.Unlock()
}

// checkEpoch drops mappings of allocations that the peer's descriptor no
// longer lists, when the descriptor has changed since the last check. A
// descriptor older than a mapping's grant proves nothing and is ignored
// for it. (The target's revoke normally gets there first.)
func (c *conn) checkEpoch(p *core.Peer, routed *wire.SegmentDesc) {
	ep := p.Epoch()
	c.mu.Lock()
	defer c.mu.Unlock()
	if ep == c.epoch {
		return
	}
	c.epoch = ep
	if len(c.maps) == 0 {
		return
	}
	d := p.Desc()
	if d == nil || d.Incarnation != c.cl.inc || (routed != nil && routed.Generation > d.Generation) {
		d = routed
	}
	if d == nil || d.Incarnation != c.cl.inc {
		return
	}
	listed := make(map[uint64]struct{}, len(c.maps))
	for i := range d.Regions {
		if id := d.Regions[i].AllocID; id != 0 {
			listed[id] = struct{}{}
		}
	}
	for id, m := range c.maps {
		if _, ok := listed[id]; !ok && m.gen <= d.Generation {
			delete(c.maps, id)
			c.dropLocked(m)
			c.t.invalidated.Add(1)
		}
	}
}

// write sends a frame by deadline.
func (c *conn) write(b []byte, deadline time.Time) error {
	c.wmu.Lock()
	_ = c.c.SetWriteDeadline(deadline)
	_, err := c.c.Write(b)
	c.wmu.Unlock()
	if err != nil {
		c.fail(status.Errorf(status.TransportError, "shm: connection to %s: write: %w", c.cl.name, err))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return status.Errorf(status.Timeout, "shm: sending to %s: %w", c.cl.name, err)
		}
		return status.Errorf(status.TransportError, "shm: sending to %s: %w", c.cl.name, err)
	}
	return nil
}

// release gives a lease back; the target does not answer.
func (c *conn) release(id uint64) {
	c.wmu.Lock()
	c.wbuf = appendRelease(c.wbuf[:0], id)
	_ = c.c.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	_, err := c.c.Write(c.wbuf)
	c.wmu.Unlock()
	if err != nil {
		c.fail(status.Errorf(status.TransportError, "shm: connection to %s: release: %w", c.cl.name, err))
	}
}

// readLoop receives grants (mapping the descriptors they carry before
// handing them to their waiter) and revokes, until the connection dies.
func (c *conn) readLoop() {
	t := c.t
	fr := lease.NewFDReader(c.c, maxGrantFDs, lease.FDCounts{Held: &t.fds, Received: &t.fdsReceived})
	defer func() {
		fr.CloseAll()
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}()
	var (
		buf  []byte
		head grantHead
		ids  []uint64
	)
	for {
		typ, payload, err := wire.ReadFrame(fr, maxFrame, buf)
		if err != nil {
			if !c.isDead() && !t.closing.Load() {
				// Not closed by us: the peer went away (or broke the
				// protocol), so its descriptor is probably stale too.
				t.e.InvalidatePeer(c.cl.peer.Name())
			}
			c.fail(status.Errorf(status.TransportError, "shm: connection to %s lost: %w", c.cl.name, err))
			return
		}
		if cap(payload) > cap(buf) {
			buf = payload[:0]
		}
		switch typ {
		case frameGrant, frameGrantCached:
			if err := c.onGrant(fr, typ, payload, &head); err != nil {
				c.fail(err)
				return
			}
		case frameRevokeGrant:
			seq, gids, err := decodeRevokeGrant(payload, ids)
			if err != nil {
				c.fail(err)
				return
			}
			ids = gids
			if c.t.hooks.swallowRevokeGrant.Load() {
				continue
			}
			c.revokeGrants(ids)
			c.ackRevoke(seq)
		case frameRevoke:
			if ids, err = decodeRevoke(payload, ids); err != nil {
				c.fail(err)
				return
			}
			if c.t.hooks.ignoreRevoke.Load() {
				continue
			}
			c.mu.Lock()
			for _, id := range ids {
				if m := c.maps[id]; m != nil {
					delete(c.maps, id)
					c.dropLocked(m)
					t.revoked.Add(1)
				}
			}
			c.mu.Unlock()
		default:
			c.fail(status.Errorf(status.Protocol, "shm: %s sent frame type %d", c.cl.name, typ))
			return
		}
	}
}

func (c *conn) onGrant(fr *lease.FDReader, typ uint8, payload []byte, h *grantHead) error {
	d := wire.NewDecoder(payload)
	decodeGrantHead(&d, h)
	h.standing = h.standing[:0]
	if typ == frameGrantCached {
		decodeStanding(&d, h)
	}
	if err := d.Err(); err != nil {
		return err
	}
	fds, err := fr.Take(len(h.fds))
	if err != nil {
		return err
	}
	for i, f := range h.fds {
		c.install(fr, f, h.gen, fds[i])
	}
	// Installed before the next frame is read, so a REVOKE_GRANT for
	// them always finds them.
	if err := c.addGrants(h.standing); err != nil {
		return err
	}
	rest := payload[d.Offset():]
	c.mu.Lock()
	j := c.pending[h.id]
	delete(c.pending, h.id)
	if j != nil {
		j.reply = append(j.reply[:0], rest...)
		j.grantTTL = h.ttl
		j.granted <- struct{}{} // buffered; the waiter drains it
	}
	c.mu.Unlock()
	if j == nil {
		// Its waiter gave up (deadline, cancel): nobody will copy.
		c.t.orphans.Add(1)
		c.release(h.id)
	}
	return nil
}

// install maps a received memfd and closes the descriptor; on any problem
// the allocation is simply not mapped and its requests use process_vm.
func (c *conn) install(fr *lease.FDReader, f grantFD, gen uint64, fd int) {
	t := c.t
	defer fr.Close([]int{fd})
	c.mu.Lock()
	_, have := c.maps[f.alloc]
	dead := c.err != nil
	c.mu.Unlock()
	if have || dead {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Size < 0 || uint64(st.Size) < f.size {
		return // a descriptor smaller than announced would fault (SIGBUS)
	}
	prot := unix.PROT_READ
	if f.writable {
		prot |= unix.PROT_WRITE
	}
	mem, err := unix.Mmap(fd, 0, int(f.size), prot, unix.MAP_SHARED)
	if err != nil {
		return
	}
	m := &mapping{alloc: f.alloc, base: f.base, size: f.size, gen: gen, writable: f.writable, mem: mem}
	t.mappings.Add(1)
	t.mappedBytes.Add(int64(f.size))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		c.unmap(m)
		return
	}
	c.maps[f.alloc] = m
}
