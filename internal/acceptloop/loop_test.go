package acceptloop

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/internal/logbuf"
)

// envDial makes the test binary a client that connects to the abstract
// Unix socket it names and waits for the server to close the connection.
const envDial = "ACCEPTLOOP_TEST_DIAL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(envDial); addr != "" {
		c, err := net.Dial("unix", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			os.Exit(2)
		}
		_, _ = io.Copy(io.Discard, c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeListener returns what the test feeds it, one result per Accept.
type fakeListener struct {
	results   chan acceptResult
	closed    chan struct{}
	closeOnce sync.Once
}

type acceptResult struct {
	c   net.Conn
	err error
}

func newFakeListener() *fakeListener {
	return &fakeListener{results: make(chan acceptResult), closed: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	select {
	case r := <-f.results:
		return r.c, r.err
	case <-f.closed:
		return nil, fmt.Errorf("accept: %w", net.ErrClosed)
	}
}

func (f *fakeListener) Close() error {
	f.closeOnce.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// feedConn hands the loop one end of a pipe and returns the other.
func (f *fakeListener) feedConn(t *testing.T) net.Conn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	f.results <- acceptResult{c: server}
	return client
}

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// admission is one connection the loop passed to its handler.
type admission struct {
	c net.Conn
	p *Pending
}

// startLoop makes a loop over ln whose handler passes admissions on got;
// serve runs it, closing served when Serve returns.
func startLoop(t *testing.T, ln net.Listener, cfg Config) (l *Loop, got chan admission, served chan struct{}) {
	t.Helper()
	return New(ln, cfg), make(chan admission, 16), make(chan struct{})
}

func serve(l *Loop, got chan admission, served chan struct{}) {
	go func() {
		defer close(served)
		l.Serve(func(c net.Conn, p *Pending) { got <- admission{c, p} })
	}()
}

func TestTransientAcceptErrorsAreRetriedAndCounted(t *testing.T) {
	const n = 12
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{Name: "test"})
	var pauses []time.Duration
	l.pause = func(d time.Duration) bool { pauses = append(pauses, d); return true } // on the loop's goroutine
	serve(l, got, served)

	for i := 0; i < n; i++ {
		ln.results <- acceptResult{err: emfile()}
	}
	ln.feedConn(t)
	a := <-got // still serving after n failures
	a.p.Done(true)

	ln.results <- acceptResult{err: emfile()} // a success reset the backoff
	ln.feedConn(t)
	(<-got).p.Done(false)

	s := l.Stats()
	require.EqualValues(t, n+1, s.AcceptErrors)
	require.EqualValues(t, 2, s.Accepted)
	require.EqualValues(t, 1, s.Authenticated)
	require.EqualValues(t, 1, s.HandshakeFailures)
	require.Contains(t, s.LastAcceptError, "too many open files")

	want := []time.Duration{}
	for d := DefaultMinBackoff; len(want) < n; d = min(2*d, DefaultMaxBackoff) {
		want = append(want, d)
	}
	want = append(want, DefaultMinBackoff)
	require.NoError(t, l.Close())
	<-served
	require.Equal(t, want, pauses) // read after Serve returned: no race
	require.Equal(t, DefaultMaxBackoff, pauses[n-1], "the backoff is capped")
}

func TestCloseEndsABackoffAtOnce(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{MinBackoff: time.Hour})
	serve(l, got, served)
	ln.results <- acceptResult{err: emfile()}
	require.Eventually(t, func() bool { return l.Stats().AcceptErrors == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still pausing after Close")
	}
}

func TestServeEndsWhenTheListenerCloses(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{})
	serve(l, got, served)
	ln.Close()
	<-served
	require.Zero(t, l.Stats().AcceptErrors, "net.ErrClosed is the end, not an error")
}

func TestTheOldestUnauthenticatedConnectionMakesRoom(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{MaxUnauthenticated: 2})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()

	first := ln.feedConn(t)
	a1 := <-got
	ln.feedConn(t)
	a2 := <-got
	require.Equal(t, 2, l.Stats().Unauthenticated)

	ln.feedConn(t)
	a3 := <-got
	_, err := first.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the oldest was closed")
	s := l.Stats()
	require.EqualValues(t, 1, s.Evicted)
	require.Equal(t, 2, s.Unauthenticated)

	a1.p.Done(false) // its owner finds out later: not counted again
	a2.p.Done(true)
	a3.p.Done(true)
	s = l.Stats()
	require.EqualValues(t, 2, s.Authenticated)
	require.Zero(t, s.HandshakeFailures)
	require.Zero(t, s.Unauthenticated)
}

func TestAuthenticatedConnectionsAreNotBounded(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{MaxUnauthenticated: 1})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	var clients []net.Conn
	for i := 0; i < 5; i++ {
		clients = append(clients, ln.feedConn(t))
		a := <-got
		a.p.Done(true)
		go func() { _, _ = io.Copy(io.Discard, a.c) }() // the connection is still open: it echoes nothing
	}
	for _, c := range clients {
		_, err := c.Write([]byte{1})
		require.NoError(t, err)
	}
	s := l.Stats()
	require.Zero(t, s.Evicted)
	require.EqualValues(t, 5, s.Authenticated)
}

func TestAnIdleConnectionIsClosedAtTheHandshakeTimeout(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{HandshakeTimeout: 20 * time.Millisecond})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()

	before := time.Now()
	idle := ln.feedConn(t)
	a := <-got
	require.False(t, a.p.Deadline().Before(before.Add(20*time.Millisecond)))
	require.False(t, a.p.Deadline().After(time.Now().Add(20*time.Millisecond)))
	_, err := idle.Read(make([]byte, 1)) // returns when the loop closes it
	require.ErrorIs(t, err, io.EOF)
	s := l.Stats()
	require.EqualValues(t, 1, s.HandshakeTimeouts)
	require.Zero(t, s.Unauthenticated)
	a.p.Done(false)
	require.EqualValues(t, 1, l.Stats().HandshakeTimeouts, "counted once")
}

func TestAHandshakeThatHitsItsDeadlineCountsAsATimeout(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{HandshakeTimeout: time.Hour})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	ln.feedConn(t)
	a := <-got
	a.p.deadline = time.Now() // as if the owner's read hit the deadline just now
	a.p.Done(false)
	s := l.Stats()
	require.EqualValues(t, 1, s.HandshakeTimeouts)
	require.Zero(t, s.HandshakeFailures)
}

func TestCloseClosesUnauthenticatedConnections(t *testing.T) {
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{})
	serve(l, got, served)
	c := ln.feedConn(t)
	a := <-got
	require.NoError(t, l.Close())
	<-served
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	a.p.Done(true) // after Close: nothing to count
	require.Zero(t, l.Stats().Authenticated)
}

func TestSameUserAdmitsThisUser(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@acceptloop-test-%d-same", os.Getpid()), Net: "unix"})
	require.NoError(t, err)
	l, got, served := startLoop(t, ln, Config{SameUser: true})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	c, err := net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	a := <-got
	a.p.Done(true)
	uid, err := PeerUID(a.c.(*net.UnixConn))
	require.NoError(t, err)
	require.Equal(t, os.Getuid(), uid)
	cred, ok := a.p.Peer()
	require.True(t, ok, "the credentials checked at accept are kept")
	require.Equal(t, os.Getpid(), cred.PID)
	require.EqualValues(t, os.Getuid(), cred.UID)
	require.Zero(t, l.Stats().PeerRejected)
}

func TestSameUserRefusesTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l, got, served := startLoop(t, ln, Config{SameUser: true})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.EqualValues(t, 1, l.Stats().PeerRejected)
	require.Empty(t, got)
}

// TestSameUserRefusesAnotherUser connects from a process running as
// nobody, which needs root to start.
func TestSameUserRefusesAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("starting a process as another user needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	// The test binary lives in a directory only we may enter: give the
	// other user a copy it can run.
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "acceptloop")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "client")
	raw, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, raw, 0o755))

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("@acceptloop-test-%d-other", os.Getpid()), Net: "unix"})
	require.NoError(t, err)
	l, got, served := startLoop(t, ln, Config{SameUser: true})
	serve(l, got, served)
	defer func() { l.Close(); <-served }()

	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin)
	cmd.Env = append(os.Environ(), envDial+"="+ln.Addr().String())
	out, err := cmd.CombinedOutput() // returns once the loop closed the connection
	require.NoError(t, err, "%s", out)
	require.EqualValues(t, 1, l.Stats().PeerRejected)
	require.Empty(t, got)
}

// Same-host capabilities go only to peers of this uid, or root.
func TestSameUserOrRoot(t *testing.T) {
	require.True(t, SameUserOrRoot(1000, 1000))
	require.True(t, SameUserOrRoot(0, 1000), "root can take them anyway")
	require.False(t, SameUserOrRoot(1001, 1000))
	require.False(t, SameUserOrRoot(1000, 0), "root's go to root only")
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	require.Equal(t, DefaultMaxUnauthenticated, c.MaxUnauthenticated)
	require.Equal(t, DefaultHandshakeTimeout, c.HandshakeTimeout)
	require.Equal(t, DefaultMaxConnsPerPeer, c.MaxConnsPerPeer)
	require.Equal(t, DefaultMaxConns, c.MaxConns)
	require.Equal(t, DefaultMinBackoff, c.MinBackoff)
	require.Equal(t, DefaultMaxBackoff, c.MaxBackoff)
	require.NotNil(t, c.Logger)
	c = Config{MinBackoff: 2 * time.Second}.withDefaults()
	require.Equal(t, 2*time.Second, c.MaxBackoff, "the cap is never below the start")
}

func TestAcceptErrorsAreLogged(t *testing.T) {
	var buf logbuf.Buffer
	ln := newFakeListener()
	l, got, served := startLoop(t, ln, Config{Name: "test", Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	l.pause = func(time.Duration) bool { return true }
	serve(l, got, served)
	ln.results <- acceptResult{err: emfile()}
	ln.feedConn(t) // the loop is past the error once it admits this
	(<-got).p.Done(true)
	require.NoError(t, l.Close())
	<-served
	out := buf.String()
	require.Contains(t, out, "accept failed")
	require.Contains(t, out, "listener=test")
	require.Contains(t, out, "too many open files")
}

// Many clients at once over real TCP, finishing the handshake, failing it
// or staying idle: the bound holds at every admission, and every accepted
// connection ends up counted exactly once.
func TestStressEveryConnectionCountedOnce(t *testing.T) {
	const (
		bound   = 4
		clients = 300
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := New(ln, Config{MaxUnauthenticated: bound, HandshakeTimeout: 50 * time.Millisecond,
		MaxConnsPerPeer: clients})
	var (
		handlers sync.WaitGroup
		mu       sync.Mutex
		overs    []int
	)
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.Serve(func(c net.Conn, p *Pending) {
			if n := l.Stats().Unauthenticated; n > bound {
				mu.Lock()
				overs = append(overs, n)
				mu.Unlock()
			}
			handlers.Add(1)
			go func() { // the "handshake": one byte, 1 means ok
				defer handlers.Done()
				defer c.Close()
				b := make([]byte, 1)
				_, err := io.ReadFull(c, b)
				p.Done(err == nil && b[0] == 1)
				if err == nil && b[0] == 1 {
					_, _ = c.Write([]byte{1})
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
			switch i % 3 {
			case 0: // a client: handshake, then wait for the answer or the eviction
				_, _ = c.Write([]byte{1})
			case 1: // a bad handshake
				_, _ = c.Write([]byte{0})
			}
			_, _ = c.Read(make([]byte, 1)) // case 2 idles until evicted or timed out
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return l.Stats().Accepted == clients }, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	<-served
	handlers.Wait()

	s := l.Stats()
	require.Empty(t, overs, "unauthenticated connections past the bound")
	require.Zero(t, s.Unauthenticated)
	require.EqualValues(t, clients, s.Authenticated+s.HandshakeFailures+s.HandshakeTimeouts+s.Evicted,
		"every connection counted once: %+v", s)
	t.Logf("%+v", s)
}
