package acceptloop

import (
	"container/list"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxUnauthenticated = 64
	// DefaultMaxConnsPerPeer leaves room for every engine a host runs
	// against one listener (tcp opens 4 data connections per peer, plus
	// control and per-transport channels) while keeping one peer from
	// holding thousands of goroutines and descriptors.
	DefaultMaxConnsPerPeer  = 256
	DefaultMaxConns         = 4096
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMinBackoff       = 5 * time.Millisecond
	DefaultMaxBackoff       = time.Second
)

// Config sets a loop's limits; zero values take the defaults above.
type Config struct {
	// Name tells listeners apart in logs ("engine", "shm", "cuda").
	Name string
	// Logger receives accept errors and refused connections; nil discards.
	Logger *slog.Logger
	// MaxUnauthenticated bounds the connections between accept and the end
	// of their handshake.
	MaxUnauthenticated int
	// HandshakeTimeout bounds the time from accept to the end of the
	// handshake.
	HandshakeTimeout time.Duration
	// SameUser admits only Unix-socket peers that run as this process's
	// user or as root (SO_PEERCRED, checked at accept, before the handler
	// sees the connection); any other connection is refused and counted
	// in Stats.PeerRejected. Pending.Peer then reports the credentials.
	SameUser bool
	// MaxConnsPerPeer bounds the connections one peer (a remote IP for
	// TCP, a process for a SameUser Unix socket, every Unix peer together
	// otherwise) holds open at once, from accept until the owner calls
	// Pending.Release; MaxConns bounds them all. A connection past either
	// is closed at accept, before any handshake state exists, counted in
	// Stats.Refused and logged once per peer until the peer's count drops
	// to zero (for the global cap, until the total drops to half of it).
	MaxConnsPerPeer, MaxConns int
	// MinBackoff and MaxBackoff bound the pause after a failed accept.
	MinBackoff, MaxBackoff time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxUnauthenticated <= 0 {
		c.MaxUnauthenticated = DefaultMaxUnauthenticated
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Stats counts what a loop has seen since it started.
type Stats struct {
	Accepted        uint64 `json:"accepted"`
	AcceptErrors    uint64 `json:"accept_errors"`
	LastAcceptError string `json:"last_accept_error"`
	// Unauthenticated is the number of connections in their handshake now.
	Unauthenticated   int    `json:"unauthenticated"`
	Authenticated     uint64 `json:"authenticated"`
	HandshakeFailures uint64 `json:"handshake_failures"`
	HandshakeTimeouts uint64 `json:"handshake_timeouts"`
	// Evicted counts unauthenticated connections closed to admit a newer
	// one past MaxUnauthenticated.
	Evicted uint64 `json:"evicted"`
	// PeerRejected counts connections refused by the SameUser check.
	PeerRejected uint64 `json:"peer_rejected"`
	// Live is the number of connections held now (accept to Release).
	Live int `json:"live"`
	// Refused counts connections closed at accept past MaxConnsPerPeer or
	// MaxConns.
	Refused uint64 `json:"refused"`
}

// Handler takes one admitted connection. It runs on the loop's goroutine,
// so it must hand the connection to a goroutine of its own and return; it
// owns c and must call p.Done once the handshake ends, either way, and
// p.Release once it has closed c.
type Handler func(c net.Conn, p *Pending)

// Loop accepts connections from one listener. Serve runs it; Close stops it.
type Loop struct {
	ln   net.Listener
	cfg  Config
	uid  int
	done chan struct{}
	// pause waits d after a failed accept; false when the loop is closed.
	// Tests replace it to observe the backoff without waiting.
	pause func(d time.Duration) bool

	mu      sync.Mutex
	closed  bool
	pending list.List // *Pending, oldest first
	lastErr string
	live    int
	peers   map[string]*peerCount
	warned  bool // the global cap was logged since live was last at half of it

	accepted, acceptErrors, authenticated atomic.Uint64
	failures, timeouts, evicted, rejected atomic.Uint64
	refused                               atomic.Uint64
}

// peerCount is one peer's live connections; it exists while n > 0.
type peerCount struct {
	n      int
	warned bool
}

// New returns a loop over ln; Serve starts accepting.
func New(ln net.Listener, cfg Config) *Loop {
	l := &Loop{ln: ln, cfg: cfg.withDefaults(), uid: os.Getuid(), done: make(chan struct{}),
		peers: map[string]*peerCount{}}
	l.pause = l.sleep
	return l
}

// Serve accepts until the listener is closed, passing each admitted
// connection to handle.
func (l *Loop) Serve(handle Handler) {
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.isClosed() {
				return
			}
			backoff = nextBackoff(backoff, l.cfg.MinBackoff, l.cfg.MaxBackoff)
			l.noteAcceptError(err, backoff)
			if !l.pause(backoff) {
				return
			}
			continue
		}
		backoff = 0
		l.accepted.Add(1)
		var cred *Cred
		if l.cfg.SameUser {
			got, err := checkSameUser(c, l.uid)
			if err != nil {
				l.rejected.Add(1)
				l.cfg.Logger.Warn("connection refused", "listener", l.cfg.Name, "remote", remote(c), "err", err)
				_ = c.Close()
				continue
			}
			cred = &got
		}
		key := peerKey(c, cred)
		if !l.hold(key) {
			_ = c.Close()
			continue
		}
		p := l.admit(c, cred, key)
		if p == nil {
			l.drop(key)
			_ = c.Close()
			return
		}
		handle(c, p)
	}
}

// nextBackoff doubles the previous pause, from lo up to hi.
func nextBackoff(prev, lo, hi time.Duration) time.Duration {
	if prev <= 0 {
		return lo
	}
	return min(2*prev, hi)
}

// remote names c's peer for logs (a Unix peer may have no address).
func remote(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

func (l *Loop) noteAcceptError(err error, retry time.Duration) {
	n := l.acceptErrors.Add(1)
	l.mu.Lock()
	l.lastErr = err.Error()
	l.mu.Unlock()
	l.cfg.Logger.Warn("accept failed; retrying", "listener", l.cfg.Name, "err", err,
		"retry_in", retry, "accept_errors", n)
}

func (l *Loop) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

func (l *Loop) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// peerKey names the peer a connection counts against: the remote IP of a
// TCP connection, the process of a Unix peer whose credentials were
// checked, and one key for every other peer.
func peerKey(c net.Conn, cred *Cred) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok && a != nil {
		return "ip:" + a.IP.String()
	}
	if cred != nil {
		return "pid:" + strconv.Itoa(cred.PID)
	}
	return "unix"
}

// hold counts one more connection of key, or refuses it (false) past
// either cap; nothing is allocated for a refused connection beyond the
// map entry of a peer already holding some.
func (l *Loop) hold(key string) bool {
	l.mu.Lock()
	pc := l.peers[key]
	n := 0
	if pc != nil {
		n = pc.n
	}
	if n >= l.cfg.MaxConnsPerPeer || l.live >= l.cfg.MaxConns {
		// Each cap logs for itself: a flood from many addresses against the
		// global cap logs once, not once per address.
		logPeer := n >= l.cfg.MaxConnsPerPeer && !pc.warned
		if logPeer {
			pc.warned = true
		}
		live := l.live
		logAll := live >= l.cfg.MaxConns && !l.warned
		if logAll {
			l.warned = true
		}
		l.mu.Unlock()
		l.refused.Add(1)
		if logPeer || logAll {
			l.cfg.Logger.Warn("connection refused: too many connections", "listener", l.cfg.Name,
				"peer", key, "peer_conns", n, "conns", live,
				"max_conns_per_peer", l.cfg.MaxConnsPerPeer, "max_conns", l.cfg.MaxConns)
		}
		return false
	}
	if pc == nil {
		pc = &peerCount{}
		l.peers[key] = pc
	}
	pc.n++
	l.live++
	l.mu.Unlock()
	return true
}

// drop uncounts one connection of key.
func (l *Loop) drop(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pc := l.peers[key]; pc != nil {
		if pc.n--; pc.n <= 0 {
			delete(l.peers, key)
		}
	}
	l.live--
	// Half, not just below: a flood held at the cap frees and refuses one
	// connection after another, and must not log each.
	if l.live <= l.cfg.MaxConns/2 {
		l.warned = false
	}
}

// admit starts c's handshake clock, making room by evicting the oldest
// unauthenticated connection if needed; nil once the loop is closed.
func (l *Loop) admit(c net.Conn, cred *Cred, key string) *Pending {
	p := &Pending{l: l, c: c, cred: cred, key: key, deadline: time.Now().Add(l.cfg.HandshakeTimeout)}
	_ = c.SetDeadline(p.deadline)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	var victim *Pending
	if l.pending.Len() >= l.cfg.MaxUnauthenticated {
		victim = l.pending.Front().Value.(*Pending)
		l.removeLocked(victim)
	}
	p.elem = l.pending.PushBack(p)
	p.timer = time.AfterFunc(l.cfg.HandshakeTimeout, p.expire)
	l.mu.Unlock()
	if victim != nil {
		victim.timer.Stop()
		l.evicted.Add(1)
		l.cfg.Logger.Debug("unauthenticated connection closed to make room", "listener", l.cfg.Name,
			"remote", remote(victim.c), "max_unauthenticated", l.cfg.MaxUnauthenticated)
		_ = victim.c.Close()
	}
	return p
}

// removeLocked takes p off the pending list; l.mu is held.
func (l *Loop) removeLocked(p *Pending) {
	l.pending.Remove(p.elem)
	p.elem = nil
}

// Close stops the loop: the listener closes, a pause in progress ends,
// and the unauthenticated connections close. Serve returns soon after.
// Idempotent.
func (l *Loop) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	var conns []net.Conn
	for e := l.pending.Front(); e != nil; e = e.Next() {
		p := e.Value.(*Pending)
		p.timer.Stop()
		p.elem = nil
		conns = append(conns, p.c)
	}
	l.pending.Init()
	l.mu.Unlock()
	err := l.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	return err
}

// Addr is the listener's address.
func (l *Loop) Addr() net.Addr { return l.ln.Addr() }

// Stats returns the loop's counts.
func (l *Loop) Stats() Stats {
	l.mu.Lock()
	s := Stats{Unauthenticated: l.pending.Len(), LastAcceptError: l.lastErr, Live: l.live}
	l.mu.Unlock()
	s.Accepted = l.accepted.Load()
	s.AcceptErrors = l.acceptErrors.Load()
	s.Authenticated = l.authenticated.Load()
	s.HandshakeFailures = l.failures.Load()
	s.HandshakeTimeouts = l.timeouts.Load()
	s.Evicted = l.evicted.Load()
	s.PeerRejected = l.rejected.Load()
	s.Refused = l.refused.Load()
	return s
}

// Pending is an admitted connection whose handshake has not ended.
type Pending struct {
	l        *Loop
	c        net.Conn
	cred     *Cred  // nil unless SameUser checked it
	key      string // what the connection counts against (hold)
	released atomic.Bool
	deadline time.Time
	elem     *list.Element // nil once off the list (on l.mu)
	timer    *time.Timer
}

// Peer is the peer's credentials as checked at accept; ok is false when
// the loop checks none (Config.SameUser off).
func (p *Pending) Peer() (c Cred, ok bool) {
	if p.cred == nil {
		return Cred{}, false
	}
	return *p.cred, true
}

// Release uncounts the connection from its peer's and the loop's caps;
// the owner calls it once the connection is closed. Idempotent.
func (p *Pending) Release() {
	if p.released.CompareAndSwap(false, true) {
		p.l.drop(p.key)
	}
}

// Deadline is when the handshake must be done; the connection's deadline
// is already set to it.
func (p *Pending) Deadline() time.Time { return p.deadline }

// Done ends the handshake phase. With ok, the connection counts as
// authenticated and its deadline is cleared; otherwise as a failed
// handshake (a timeout when past the deadline), and the owner closes it.
// Only the first call counts, and none after the loop closed the
// connection (eviction, timeout, Close).
func (p *Pending) Done(ok bool) {
	l := p.l
	if !p.leave() {
		return
	}
	p.timer.Stop()
	switch {
	case ok:
		l.authenticated.Add(1)
		_ = p.c.SetDeadline(time.Time{})
	case !time.Now().Before(p.deadline):
		l.timeouts.Add(1)
	default:
		l.failures.Add(1)
	}
}

// leave takes p off the pending list; false if something else (Done,
// expiry, eviction, Close) already did, which then owns the outcome.
func (p *Pending) leave() bool {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.elem == nil {
		return false
	}
	l.removeLocked(p)
	return true
}

// expire closes a connection still in its handshake at the deadline.
func (p *Pending) expire() {
	l := p.l
	if !p.leave() {
		return
	}
	l.timeouts.Add(1)
	l.cfg.Logger.Debug("handshake timed out", "listener", l.cfg.Name,
		"remote", remote(p.c), "timeout", l.cfg.HandshakeTimeout)
	_ = p.c.Close()
}
