package acceptloop

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/internal/logbuf"
)

// fromIP is a pipe end that reports a TCP peer address, so that the fake
// listener can feed connections of distinct peers.
type fromIP struct {
	net.Conn
	ip net.IP
}

func (c fromIP) RemoteAddr() net.Addr { return &net.TCPAddr{IP: c.ip, Port: 4000} }

// feedFrom hands the loop a connection from ip and returns the other end.
func (f *fakeListener) feedFrom(t *testing.T, ip string) net.Conn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	f.results <- acceptResult{c: fromIP{server, net.ParseIP(ip)}}
	return client
}

// requireRefused waits for the loop to close c without admitting it.
func requireRefused(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the connection past the cap is closed")
}

func TestThePerPeerCapRefusesPastItLogsOnceAndReleaseMakesRoom(t *testing.T) {
	const perPeer = 3
	var buf logbuf.Buffer
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{Name: "test", MaxConnsPerPeer: perPeer,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()

	var held []admission
	for i := 0; i < perPeer; i++ {
		ln.feedFrom(t, "10.0.0.1")
		a := <-got
		a.p.Done(true)
		held = append(held, a)
	}
	for i := 0; i < 3; i++ {
		requireRefused(t, ln.feedFrom(t, "10.0.0.1"))
	}
	// Another peer is unaffected.
	ln.feedFrom(t, "10.0.0.2")
	other := <-got
	other.p.Done(true)

	s := l.Stats()
	require.EqualValues(t, 3, s.Refused)
	require.Equal(t, perPeer+1, s.Live)
	require.Equal(t, 1, strings.Count(buf.String(), "connection refused"), "logged once per peer:\n%s", buf.String())
	require.Contains(t, buf.String(), "peer=ip:10.0.0.1")

	// One released: room for exactly one more.
	held[0].c.Close()
	held[0].p.Release()
	held[0].p.Release() // idempotent
	require.Equal(t, perPeer, l.Stats().Live)
	ln.feedFrom(t, "10.0.0.1")
	a := <-got
	a.p.Done(true)
	held[0] = a
	requireRefused(t, ln.feedFrom(t, "10.0.0.1"))
	require.Equal(t, 1, strings.Count(buf.String(), "connection refused"), "still logged once: the peer never went to zero")

	for _, a := range append(held, other) {
		a.c.Close()
		a.p.Release()
	}
	require.Zero(t, l.Stats().Live)
	// The peer's slate is clean once it held none: a new refusal is logged.
	for i := 0; i < perPeer; i++ {
		ln.feedFrom(t, "10.0.0.1")
		a := <-got
		a.p.Done(true)
		defer a.p.Release()
	}
	requireRefused(t, ln.feedFrom(t, "10.0.0.1"))
	require.Equal(t, 2, strings.Count(buf.String(), "connection refused"))
}

func TestTheGlobalCapRefusesEveryPeerPastItAndLogsOnce(t *testing.T) {
	const all = 4
	var buf logbuf.Buffer
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{MaxConnsPerPeer: 10, MaxConns: all,
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	logged := func() int { return strings.Count(buf.String(), "connection refused") }

	var held []admission
	for i := 0; i < all; i++ {
		ln.feedFrom(t, fmt.Sprintf("10.0.0.%d", i))
		held = append(held, <-got)
	}
	requireRefused(t, ln.feedFrom(t, "10.0.1.1"))
	requireRefused(t, ln.feedFrom(t, "10.0.0.1")) // a peer with one: the global cap, not its own
	requireRefused(t, ln.feedFrom(t, "10.0.1.2"))
	require.EqualValues(t, 3, l.Stats().Refused)
	require.Equal(t, 1, logged(), "one line for the global cap:\n%s", buf.String())

	// Released even when the owner drops it before the handshake ends;
	// a flood held at the cap takes the room and is refused again, with
	// no new line.
	held[0].p.Done(false)
	held[0].c.Close()
	held[0].p.Release()
	ln.feedFrom(t, "10.0.1.3")
	held[0] = <-got
	requireRefused(t, ln.feedFrom(t, "10.0.1.4"))
	require.Equal(t, 1, logged())
	require.Equal(t, all, l.Stats().Live)

	for _, a := range held {
		a.c.Close()
		a.p.Release()
	}
	require.Zero(t, l.Stats().Live)
	// Below half the cap the slate is clean: the next refusal is logged.
	for i := 0; i < all; i++ {
		ln.feedFrom(t, "10.0.2.1")
		defer (<-got).p.Release()
	}
	requireRefused(t, ln.feedFrom(t, "10.0.2.2"))
	require.Equal(t, 2, logged())
}

// A refused connection gets no handshake clock: nothing is left pending.
func TestARefusedConnectionIsNeverPending(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{MaxConnsPerPeer: 1})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	ln.feedFrom(t, "10.0.0.1")
	a := <-got
	requireRefused(t, ln.feedFrom(t, "10.0.0.1"))
	s := l.Stats()
	require.Equal(t, 1, s.Unauthenticated)
	require.EqualValues(t, 2, s.Accepted)
	require.Zero(t, s.Evicted)
	a.p.Done(true)
	a.c.Close()
	a.p.Release()
}

// Many clients over real TCP (one peer, 127.0.0.1) connecting and closing
// at once against a small cap: no admission ever sees more than the cap
// live, every connection is either admitted or refused, and once all are
// closed the count is back to zero.
func TestConcurrentAcceptsAndClosesKeepTheCountExact(t *testing.T) {
	const (
		limit   = 8
		clients = 200
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := New(ln, Config{MaxConnsPerPeer: limit})
	var (
		handlers sync.WaitGroup
		mu       sync.Mutex
		overs    []int
		admitted int
	)
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(func(c net.Conn, p *Pending) {
			if n := l.Stats().Live; n > limit {
				mu.Lock()
				overs = append(overs, n)
				mu.Unlock()
			}
			mu.Lock()
			handlers.Add(1) // before admitted counts it, so that Wait sees it
			admitted++
			mu.Unlock()
			go func() { // echo one byte, then wait for the client to close
				defer handlers.Done()
				defer p.Release()
				defer c.Close()
				b := make([]byte, 1)
				_, err := io.ReadFull(c, b)
				p.Done(err == nil)
				if err == nil {
					_, _ = c.Write(b)
					_, _ = c.Read(b)
				}
			}()
		})
	}()

	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_, _ = c.Write([]byte{1})
			_, _ = c.Read(make([]byte, 1)) // the echo, or EOF when refused
		}()
	}
	wg.Wait()
	// The server's side of the last clients may trail their close.
	decided := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return uint64(admitted)+l.Stats().Refused == clients
	}
	require.Eventually(t, decided, 20*time.Second, time.Millisecond)
	handlers.Wait()
	require.Zero(t, l.Stats().Live)
	require.NoError(t, l.Close())
	<-served

	s := l.Stats()
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, overs, "live connections past the cap")
	require.EqualValues(t, clients, uint64(admitted)+s.Refused, "%+v", s)
	require.Zero(t, s.Live)
	t.Logf("admitted %d refused %d", admitted, s.Refused)
}
