package wire

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tent-dev/tent/status"
)

type result struct {
	kind uint8
	name string
	err  error
}

// connPair returns two connected conns, over net.Pipe or TCP loopback.
func connPair(t *testing.T, tcp bool) (client, server net.Conn) {
	t.Helper()
	if !tcp {
		c, s := net.Pipe()
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- s
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, ok := <-accepted
	require.True(t, ok)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func transports(t *testing.T, f func(t *testing.T, tcp bool)) {
	t.Run("pipe", func(t *testing.T) { f(t, false) })
	t.Run("tcp", func(t *testing.T) { f(t, true) })
}

// soon is a deadline no healthy handshake reaches, even on a loaded
// machine; refusalBound is how long a refusal may take, well below it, so
// that a refusal that waited for the deadline is told apart.
func soon() time.Time { return time.Now().Add(time.Minute) }

const refusalBound = 20 * time.Second

// handshakePair runs both sides concurrently. Each side closes its conn when
// it fails, as real callers do, so that the other side is never left
// waiting for the deadline.
func handshakePair(t *testing.T, tcp bool, ccfg, scfg HandshakeConfig, kind uint8, cv, sv versionRange) (cli, srv result) {
	c, s := connPair(t, tcp)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		cli.name, cli.err = clientHandshake(c, ccfg, kind, cv)
		if cli.err != nil {
			c.Close()
		}
	}()
	go func() {
		defer wg.Done()
		srv.kind, srv.name, srv.err = serverHandshake(s, scfg, sv)
		if srv.err != nil {
			s.Close()
		}
	}()
	wg.Wait()
	return cli, srv
}

func TestHandshake(t *testing.T) {
	secret := []byte("correct horse battery staple")
	v1 := thisVersion
	for _, tc := range []struct {
		name           string
		cli, srv       HandshakeConfig
		cv, sv         versionRange
		cliErr, srvErr status.Code
		cliMsg, srvMsg string
	}{
		{name: "no secret", cli: HandshakeConfig{LocalName: "client-a"}, srv: HandshakeConfig{LocalName: "server-b"}},
		{name: "matching secrets", cli: HandshakeConfig{LocalName: "client-a", Secret: secret},
			srv: HandshakeConfig{LocalName: "server-b", Secret: append([]byte(nil), secret...)}},
		{name: "empty names", cli: HandshakeConfig{Secret: secret}, srv: HandshakeConfig{Secret: secret}},
		{name: "max names", cli: HandshakeConfig{LocalName: strings.Repeat("c", MaxNameLen), Secret: secret},
			srv: HandshakeConfig{LocalName: strings.Repeat("s", MaxNameLen), Secret: secret}},
		{name: "wrong secret", cli: HandshakeConfig{LocalName: "client-a", Secret: []byte("wrong")},
			srv:    HandshakeConfig{LocalName: "server-b", Secret: secret},
			cliErr: status.AuthFailed, cliMsg: "server rejected our proof",
			srvErr: status.AuthFailed, srvMsg: `client "client-a" failed to prove`},
		{name: "secret only on server", cli: HandshakeConfig{LocalName: "client-a"}, srv: HandshakeConfig{Secret: secret},
			cliErr: status.AuthFailed, cliMsg: "server requires authentication but no secret is configured here",
			srvErr: status.AuthFailed, srvMsg: `client "client-a" has no secret but this engine requires authentication`},
		{name: "secret only on client", cli: HandshakeConfig{LocalName: "client-a", Secret: secret}, srv: HandshakeConfig{},
			cliErr: status.AuthFailed, cliMsg: "server has none; refusing to continue unauthenticated",
			srvErr: status.AuthFailed, srvMsg: `client "client-a" wants authentication but no secret is configured here`},
		{name: "client too new", cli: HandshakeConfig{LocalName: "c"}, srv: HandshakeConfig{},
			cv:     versionRange{2, 2},
			cliErr: status.VersionMismatch, cliMsg: "server chose protocol version 1, this build speaks versions 2 to 2",
			srvErr: status.VersionMismatch, srvMsg: `client "c" refused protocol version 1`},
		{name: "server too new", cli: HandshakeConfig{LocalName: "c", Secret: secret}, srv: HandshakeConfig{Secret: secret},
			sv:     versionRange{2, 3},
			cliErr: status.VersionMismatch, cliMsg: "server refused protocol version 1 (it speaks versions up to 3)",
			srvErr: status.VersionMismatch, srvMsg: `client "c" speaks protocol version 1, this build speaks versions 2 to 3`},
		{name: "newer client meets older server", cli: HandshakeConfig{LocalName: "c", Secret: secret},
			srv: HandshakeConfig{Secret: secret}, cv: versionRange{1, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			transports(t, func(t *testing.T, tcp bool) {
				cv, sv := tc.cv, tc.sv
				if cv == (versionRange{}) {
					cv = v1
				}
				if sv == (versionRange{}) {
					sv = v1
				}
				tc.cli.Deadline, tc.srv.Deadline = soon(), soon()
				start := time.Now()
				cli, srv := handshakePair(t, tcp, tc.cli, tc.srv, 2, cv, sv)
				require.Less(t, time.Since(start), refusalBound, "a refusal must not wait for the deadline")
				if tc.cliErr == status.OK {
					require.NoError(t, cli.err)
					require.NoError(t, srv.err)
					require.Equal(t, tc.srv.LocalName, cli.name)
					require.Equal(t, tc.cli.LocalName, srv.name)
					require.Equal(t, uint8(2), srv.kind)
					return
				}
				requireCode(t, cli.err, tc.cliErr)
				require.Contains(t, cli.err.Error(), tc.cliMsg)
				requireCode(t, srv.err, tc.srvErr)
				require.Contains(t, srv.err.Error(), tc.srvMsg)
			})
		})
	}
}

func TestHandshakeKinds(t *testing.T) {
	for _, kind := range []uint8{0, 1, 2, 3, 4, 255} {
		cli, srv := handshakePair(t, false, HandshakeConfig{Secret: []byte("s")}, HandshakeConfig{Secret: []byte("s")}, kind, thisVersion, thisVersion)
		require.NoError(t, cli.err)
		require.NoError(t, srv.err)
		require.Equal(t, kind, srv.kind)
	}
}

func TestHandshakeThenTraffic(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		// The deadline is short so that the test outlives it. A handshake
		// that did not finish before it (a loaded machine) proves nothing:
		// again with a longer one.
		for wait := 150 * time.Millisecond; ; wait *= 2 {
			c, s := connPair(t, tcp)
			deadline := time.Now().Add(wait)
			errc := make(chan error, 1)
			go func() {
				_, _, err := ServerHandshake(s, HandshakeConfig{Deadline: deadline, Secret: []byte("k")})
				if err == nil {
					time.Sleep(time.Until(deadline) + 50*time.Millisecond)
					err = WriteFrame(s, 7, []byte("after the deadline"))
				}
				if err != nil {
					s.Close()
				}
				errc <- err
			}()
			_, err := ClientHandshake(c, HandshakeConfig{Deadline: deadline, Secret: []byte("k")}, 1)
			if err != nil && status.CodeOf(err) == status.Timeout && wait < 10*time.Second {
				t.Logf("handshake did not finish within %v: %v", wait, err)
				c.Close()
				<-errc
				continue
			}
			require.NoError(t, err)
			// The handshake deadline must be cleared: this read starts
			// before it and ends after it.
			typ, p, err := ReadFrame(c, 0, nil)
			require.NoError(t, err)
			require.Equal(t, uint8(7), typ)
			require.Equal(t, "after the deadline", string(p))
			require.NoError(t, <-errc)
			return
		}
	})
}

func TestHandshakeGarbage(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		for _, tc := range []struct {
			name string
			in   []byte
			msg  string
		}{
			{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), `bad magic "GET "`},
			{"zeros", make([]byte, 64), "bad magic"},
			{"short then close", []byte("TE"), "peer closed the connection after 2 of 4 bytes"},
			{"magic only", []byte("TENT"), "peer closed the connection after 0 of 38 bytes"},
			{"unknown flags", append([]byte("TENT\x01\x00\x01\x80"), make([]byte, 34)...), "unknown flags 0x80"},
			{"name too long", append(append([]byte("TENT\x01\x00\x01\x00"), make([]byte, 32)...), 0x01, 0x04), "client name length 1025 exceeds limit 1024"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c, s := connPair(t, tcp)
				go func() {
					c.Write(tc.in)
					c.Close()
				}()
				start := time.Now()
				_, _, err := ServerHandshake(s, HandshakeConfig{Deadline: soon()})
				requireCode(t, err, status.Protocol)
				require.Contains(t, err.Error(), tc.msg)
				require.Less(t, time.Since(start), refusalBound)
			})
		}
	})
}

func TestClientHandshakeGarbageServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply []byte
		code  status.Code
		msg   string
	}{
		{"ssh banner", []byte("SSH-2.0-OpenSSH_9.6\r\n" + strings.Repeat("x", 40)), status.Protocol, `bad magic "SSH-"`},
		{"closed", nil, status.TransportError, "before sending any of the 40 bytes of the server hello"},
		{"unknown verdict", append([]byte("TENT\x01\x00\x09\x00"), make([]byte, 32)...), status.Protocol, "unknown verdict 9"},
		{"unknown flags", append([]byte("TENT\x01\x00\x00\x04"), make([]byte, 32)...), status.Protocol, "unknown flags 0x4"},
		{"version zero", append([]byte("TENT\x00\x00\x00\x00"), make([]byte, 32)...), status.VersionMismatch, "server chose protocol version 0"},
		{"auth flag without secret", append([]byte("TENT\x01\x00\x00\x01"), make([]byte, 32)...), status.AuthFailed, "mismatched authentication"},
		{"proof without secret", append(append([]byte("TENT\x01\x00\x00\x00"), make([]byte, 32)...), append([]byte{0, 1}, make([]byte, 33)...)...), status.Protocol, "sent a proof although neither side has a secret"},
		{"server name too long", append(append([]byte("TENT\x01\x00\x00\x00"), make([]byte, 32)...), append(make([]byte, 33), 0xff, 0xff)...), status.Protocol, "server name length 65535 exceeds limit 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := connPair(t, false)
			go func() {
				// Read the client hello, answer with the canned hello and
				// finish, then swallow whatever the client says until it
				// hangs up. Writes follow the protocol's turns, which a
				// synchronous pipe requires.
				hello := make([]byte, clientHelloFixed)
				if _, err := io.ReadFull(s, hello); err != nil {
					return
				}
				defer s.Close()
				first := tc.reply[:min(len(tc.reply), serverHelloSize)]
				if len(first) == 0 {
					return
				}
				s.Write(first)
				if rest := tc.reply[len(first):]; len(rest) > 0 {
					if _, err := io.ReadFull(s, make([]byte, clientFinishSize)); err != nil {
						return
					}
					s.Write(rest)
				}
				io.Copy(io.Discard, s)
			}()
			_, err := ClientHandshake(c, HandshakeConfig{Deadline: soon()}, 1)
			c.Close()
			requireCode(t, err, tc.code)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestHandshakeSilentPeerTimesOut(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		t.Run("server waits for client", func(t *testing.T) {
			_, s := connPair(t, tcp)
			start := time.Now()
			_, _, err := ServerHandshake(s, HandshakeConfig{Deadline: time.Now().Add(50 * time.Millisecond)})
			requireCode(t, err, status.Timeout)
			require.Contains(t, err.Error(), "deadline exceeded waiting for the client hello")
			require.Less(t, time.Since(start), refusalBound, "the deadline ends the wait")
		})
		t.Run("client waits for server", func(t *testing.T) {
			c, s := connPair(t, tcp)
			go io.Copy(io.Discard, s) // reads the hello, never answers
			start := time.Now()
			_, err := ClientHandshake(c, HandshakeConfig{Deadline: time.Now().Add(50 * time.Millisecond)}, 1)
			requireCode(t, err, status.Timeout)
			require.Less(t, time.Since(start), refusalBound, "the deadline ends the wait")
		})
		t.Run("server stalls after hello", func(t *testing.T) {
			c, s := connPair(t, tcp)
			go func() {
				// A client that sends its hello, reads the reply and goes quiet.
				var hello []byte
				hello = append(hello, HandshakeMagic...)
				hello = append(hello, 1, 0, 1, 0)
				hello = append(hello, make([]byte, NonceSize+2)...)
				c.Write(hello)
				io.Copy(io.Discard, c)
			}()
			_, _, err := ServerHandshake(s, HandshakeConfig{Deadline: time.Now().Add(50 * time.Millisecond)})
			requireCode(t, err, status.Timeout)
			require.Contains(t, err.Error(), "client finish")
		})
	})
}

func TestHandshakePastDeadline(t *testing.T) {
	c, _ := connPair(t, false)
	_, err := ClientHandshake(c, HandshakeConfig{Deadline: time.Now().Add(-time.Second)}, 1)
	requireCode(t, err, status.Timeout)
}

func TestHandshakeLocalNameTooLong(t *testing.T) {
	c, s := connPair(t, false)
	_, err := ClientHandshake(c, HandshakeConfig{LocalName: strings.Repeat("x", MaxNameLen+1)}, 1)
	requireCode(t, err, status.InvalidArgument)
	_, _, err = ServerHandshake(s, HandshakeConfig{LocalName: strings.Repeat("x", MaxNameLen+1)})
	requireCode(t, err, status.InvalidArgument)
}

func TestHandshakeClosedConn(t *testing.T) {
	c, _ := connPair(t, true)
	c.Close()
	_, err := ClientHandshake(c, HandshakeConfig{}, 1)
	requireCode(t, err, status.Closed)
}

// recorder keeps a copy of everything written through it.
type recorder struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, append([]byte(nil), b...))
	r.mu.Unlock()
	return r.Conn.Write(b)
}

func TestHandshakeReplayFails(t *testing.T) {
	secret := []byte("s3cret")
	// Record an honest client's messages.
	c, s := connPair(t, false)
	rec := &recorder{Conn: c}
	errc := make(chan error, 1)
	go func() {
		_, _, err := ServerHandshake(s, HandshakeConfig{Secret: secret, LocalName: "srv", Deadline: soon()})
		errc <- err
	}()
	_, err := ClientHandshake(rec, HandshakeConfig{Secret: secret, LocalName: "cli", Deadline: soon()}, 2)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Len(t, rec.writes, 2, "client hello and client finish")
	hello, finish := rec.writes[0], rec.writes[1]

	// Replay them, verbatim, to a fresh server.
	transports(t, func(t *testing.T, tcp bool) {
		c, s := connPair(t, tcp)
		go func() {
			defer c.Close()
			c.Write(hello)
			serverHello := make([]byte, serverHelloSize)
			if _, err := io.ReadFull(c, serverHello); err != nil {
				return
			}
			c.Write(finish)
			io.Copy(io.Discard, c)
		}()
		_, _, err := ServerHandshake(s, HandshakeConfig{Secret: secret, LocalName: "srv", Deadline: soon()})
		requireCode(t, err, status.AuthFailed)
		require.Contains(t, err.Error(), `client "cli" failed to prove`)
	})
}

// tamper flips one byte of the first write, as an active attacker between
// the engines could.
type tamper struct {
	net.Conn
	once sync.Once
	at   int
}

func (t *tamper) Write(b []byte) (int, error) {
	t.once.Do(func() {
		b = append([]byte(nil), b...)
		b[t.at] ^= 0x01
	})
	return t.Conn.Write(b)
}

func TestHandshakeTamperedHelloFails(t *testing.T) {
	secret := []byte("s3cret")
	for _, tc := range []struct {
		name string
		at   int
	}{
		{"kind", 6},
		{"nonce", 8},
		{"name", clientHelloFixed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := connPair(t, false)
			errc := make(chan error, 1)
			go func() {
				_, _, err := ServerHandshake(s, HandshakeConfig{Secret: secret, Deadline: soon()})
				errc <- err
			}()
			_, err := ClientHandshake(&tamper{Conn: c, at: tc.at}, HandshakeConfig{Secret: secret, LocalName: "cli", Deadline: soon()}, 2)
			requireCode(t, err, status.AuthFailed)
			requireCode(t, <-errc, status.AuthFailed)
		})
	}
}

func TestHandshakeServerProofChecked(t *testing.T) {
	// A server that knows the client's proof passed (it relays it) but not
	// the secret cannot forge its own proof. Simulate by letting a real
	// server with the right secret answer, and corrupting its proof in
	// flight.
	secret := []byte("s3cret")
	c, s := connPair(t, false)
	go func() {
		ServerHandshake(&corruptProof{Conn: s}, HandshakeConfig{Secret: secret, LocalName: "srv", Deadline: soon()})
	}()
	_, err := ClientHandshake(c, HandshakeConfig{Secret: secret, Deadline: soon()}, 1)
	requireCode(t, err, status.AuthFailed)
	require.Contains(t, err.Error(), `server "srv" failed to prove`)
}

// corruptProof flips a bit of the server proof (the second write).
type corruptProof struct {
	net.Conn
	n int
}

func (c *corruptProof) Write(b []byte) (int, error) {
	c.n++
	if c.n == 2 {
		b = bytes.Clone(b)
		b[5] ^= 0x80
	}
	return c.Conn.Write(b)
}
