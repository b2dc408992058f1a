package wire

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"

	"github.com/tent-dev/tent/status"
)

// Handshake constants. HandshakeMagic and the version that follows it are
// fixed for all versions, so any build can tell an incompatible peer from a
// stranger.
const (
	HandshakeMagic = "TENT"
	// HandshakeVersion is the newest handshake and channel protocol version
	// this build speaks; MinHandshakeVersion the oldest it still accepts.
	HandshakeVersion    = 1
	MinHandshakeVersion = 1
	// DefaultHandshakeTimeout applies when HandshakeConfig.Deadline is zero:
	// a peer must never be able to hold a handshake open forever.
	DefaultHandshakeTimeout = 10 * time.Second

	NonceSize = 32
	ProofSize = sha256.Size
)

// Verdicts open every handshake reply so that a refusal reaches the peer
// with its reason instead of as a bare disconnect.
const (
	verdictOK        = 0
	verdictVersion   = 1 // no common version
	verdictNeedAuth  = 2 // the sender has a secret, the peer has none
	verdictNoAuth    = 3 // the sender has no secret, the peer has one
	verdictBadProof  = 4 // the peer's proof did not verify
	verdictMax       = verdictBadProof
	flagSecret       = 1 << 0
	flagsKnown       = flagSecret
	clientHelloFixed = 4 + 2 + 1 + 1 + NonceSize + 2
	serverHelloSize  = 4 + 2 + 1 + 1 + NonceSize
	clientFinishSize = 1 + ProofSize
	serverFinishHead = 1 + ProofSize + 2
)

// Domain separation: a proof made by one role never verifies as the other.
const (
	clientLabel = "tent-client"
	serverLabel = "tent-server"
)

// HandshakeConfig configures either side of a handshake.
type HandshakeConfig struct {
	// Secret, when non-empty, turns on mutual HMAC-SHA256 authentication.
	// Both sides must have one, and the same one.
	Secret []byte
	// Deadline bounds the whole handshake; zero means now plus
	// DefaultHandshakeTimeout.
	Deadline time.Time
	// LocalName is sent to the peer (at most MaxNameLen bytes).
	LocalName string
}

type versionRange struct{ min, max uint16 }

var thisVersion = versionRange{MinHandshakeVersion, HandshakeVersion}

// ClientHandshake runs the client side of the handshake on conn, asking for
// a channel of the given kind, and returns the server's name. On error the
// caller must close conn.
//
//	client                                  server
//	hello: magic version kind flags nonceC name  ->
//	                          <- hello: magic version verdict flags nonceS
//	finish: verdict proofC                  ->
//	                          <- finish: verdict proofS name
func ClientHandshake(conn net.Conn, cfg HandshakeConfig, kind uint8) (peerName string, err error) {
	return clientHandshake(conn, cfg, kind, thisVersion)
}

func clientHandshake(conn net.Conn, cfg HandshakeConfig, kind uint8, vr versionRange) (peerName string, err error) {
	if len(cfg.LocalName) > MaxNameLen {
		return "", status.Errorf(status.InvalidArgument,
			"handshake: local name length %d exceeds limit %d", len(cfg.LocalName), MaxNameLen)
	}
	if err := setDeadline(conn, cfg.Deadline); err != nil {
		return "", err
	}
	defer conn.SetDeadline(time.Time{})

	c := &clientSide{conn: conn, cfg: cfg, kind: kind, auth: len(cfg.Secret) > 0}
	if _, err := rand.Read(c.nonceC[:]); err != nil {
		return "", status.Errorf(status.Internal, "handshake: random nonce: %w", err)
	}
	if err := c.sendHello(vr); err != nil {
		return "", err
	}
	if err := c.readHello(vr); err != nil {
		return "", err
	}
	if err := c.sendFinish(); err != nil {
		return "", err
	}
	return c.readFinish()
}

// clientSide is the client's state through the four messages of a
// handshake, one method per message.
type clientSide struct {
	conn    net.Conn
	cfg     HandshakeConfig
	kind    uint8
	auth    bool // a secret is configured here
	nonceC  [NonceSize]byte
	nonceS  []byte // from the server hello
	version uint16 // chosen by the server
}

// sendHello offers the newest version of vr and the channel kind.
func (c *clientSide) sendHello(vr versionRange) error {
	var flags uint8
	if c.auth {
		flags |= flagSecret
	}
	e := NewEncoder(make([]byte, 0, clientHelloFixed+len(c.cfg.LocalName)))
	e.RawString(HandshakeMagic)
	e.U16(vr.max)
	e.U8(c.kind)
	e.U8(flags)
	e.Raw(c.nonceC[:])
	e.U16(uint16(len(c.cfg.LocalName)))
	e.RawString(c.cfg.LocalName)
	return writeAll(c.conn, e.Out(), "client hello")
}

// readHello reads the server's verdict on the hello, its version (which must
// lie in vr) and its nonce, and refuses mismatched authentication settings.
func (c *clientSide) readHello(vr versionRange) error {
	// The hellos have the same layout in every version, so both are read
	// whole even when the answer is a refusal.
	hello := make([]byte, serverHelloSize)
	// A server that sends nothing at all went away (killed while being
	// dialed): a transport failure the caller may retry elsewhere, not
	// bytes that break the protocol.
	if err := readFullOr(c.conn, hello, "server hello", status.TransportError); err != nil {
		return err
	}
	if string(hello[:4]) != HandshakeMagic {
		return status.Errorf(status.Protocol, "handshake: server hello has bad magic %q, want %q",
			hello[:4], HandshakeMagic)
	}
	version := binary.LittleEndian.Uint16(hello[4:])
	switch v := hello[6]; v {
	case verdictOK:
	case verdictVersion:
		return status.Errorf(status.VersionMismatch,
			"handshake: server refused protocol version %d (it speaks versions up to %d)", vr.max, version)
	case verdictNeedAuth:
		return status.Errorf(status.AuthFailed,
			"handshake: server requires authentication but no secret is configured here")
	case verdictNoAuth:
		return status.Errorf(status.AuthFailed,
			"handshake: a secret is configured here but the server has none; refusing to continue unauthenticated")
	default:
		return status.Errorf(status.Protocol, "handshake: server hello has unknown verdict %d", v)
	}
	if version > vr.max || version < vr.min {
		reject(c.conn, verdictVersion)
		return status.Errorf(status.VersionMismatch,
			"handshake: server chose protocol version %d, this build speaks versions %d to %d",
			version, vr.min, vr.max)
	}
	sflags := hello[7]
	if sflags&^flagsKnown != 0 {
		return status.Errorf(status.Protocol, "handshake: server hello has unknown flags %#x", sflags)
	}
	// A correct server has already refused a mismatch; one that did not is
	// broken or an impostor, and we still never continue unauthenticated.
	if (sflags&flagSecret != 0) != c.auth {
		if c.auth {
			reject(c.conn, verdictNeedAuth)
		} else {
			reject(c.conn, verdictNoAuth)
		}
		return status.Errorf(status.AuthFailed,
			"handshake: server accepted mismatched authentication settings (server secret %v, local secret %v)",
			sflags&flagSecret != 0, c.auth)
	}
	c.version, c.nonceS = version, hello[8:8+NonceSize]
	return nil
}

// sendFinish sends the client's proof (zeros without a secret).
func (c *clientSide) sendFinish() error {
	finish := make([]byte, clientFinishSize)
	finish[0] = verdictOK
	if c.auth {
		mac := hmac.New(sha256.New, c.cfg.Secret)
		writeTranscript(mac, clientLabel, c.version, c.kind, c.nonceC[:], c.nonceS, c.cfg.LocalName)
		mac.Sum(finish[1:1])
	}
	return writeAll(c.conn, finish, "client finish")
}

// readFinish reads the server's verdict on the proof, its name and its own
// proof, which must verify (or be zeros without a secret).
func (c *clientSide) readFinish() (peerName string, err error) {
	head := make([]byte, serverFinishHead)
	if err := readFull(c.conn, head[:1], "server finish"); err != nil {
		return "", err
	}
	switch v := head[0]; v {
	case verdictOK:
	case verdictBadProof:
		return "", status.Errorf(status.AuthFailed,
			"handshake: server rejected our proof: the secrets differ")
	default:
		return "", status.Errorf(status.Protocol, "handshake: server finish has unexpected verdict %d", v)
	}
	if err := readFull(c.conn, head[1:], "server finish"); err != nil {
		return "", err
	}
	peerName, err = readName(c.conn, binary.LittleEndian.Uint16(head[1+ProofSize:]), "server name")
	if err != nil {
		return "", err
	}
	proof := head[1 : 1+ProofSize]
	if c.auth {
		mac := hmac.New(sha256.New, c.cfg.Secret)
		writeTranscript(mac, serverLabel, c.version, c.kind, c.nonceC[:], c.nonceS, c.cfg.LocalName, peerName)
		if !hmac.Equal(mac.Sum(nil), proof) {
			return "", status.Errorf(status.AuthFailed,
				"handshake: server %q failed to prove knowledge of the secret", peerName)
		}
	} else if !allZero(proof) {
		return "", status.Errorf(status.Protocol,
			"handshake: server %q sent a proof although neither side has a secret", peerName)
	}
	return peerName, nil
}

// ServerHandshake runs the server side of the handshake on conn and returns
// the channel kind the client asked for and the client's name. Nothing the
// server says before the client has proved itself depends on the secret or
// the server's name. On error the caller must close conn.
func ServerHandshake(conn net.Conn, cfg HandshakeConfig) (kind uint8, peerName string, err error) {
	return serverHandshake(conn, cfg, thisVersion)
}

func serverHandshake(conn net.Conn, cfg HandshakeConfig, vr versionRange) (kind uint8, peerName string, err error) {
	if len(cfg.LocalName) > MaxNameLen {
		return 0, "", status.Errorf(status.InvalidArgument,
			"handshake: local name length %d exceeds limit %d", len(cfg.LocalName), MaxNameLen)
	}
	if err := setDeadline(conn, cfg.Deadline); err != nil {
		return 0, "", err
	}
	defer conn.SetDeadline(time.Time{})
	auth := len(cfg.Secret) > 0

	hello := make([]byte, clientHelloFixed)
	// Check the magic before waiting for more, so a stray client (an HTTP
	// probe, a port scanner) is dropped at once.
	if err := readFull(conn, hello[:4], "client hello"); err != nil {
		return 0, "", err
	}
	if string(hello[:4]) != HandshakeMagic {
		return 0, "", status.Errorf(status.Protocol, "handshake: client hello has bad magic %q, want %q",
			hello[:4], HandshakeMagic)
	}
	if err := readFull(conn, hello[4:], "client hello"); err != nil {
		return 0, "", err
	}
	cversion := binary.LittleEndian.Uint16(hello[4:])
	kind = hello[6]
	cflags := hello[7]
	nonceC := hello[8 : 8+NonceSize]
	if cflags&^flagsKnown != 0 {
		return 0, "", status.Errorf(status.Protocol, "handshake: client hello has unknown flags %#x", cflags)
	}
	peerName, err = readName(conn, binary.LittleEndian.Uint16(hello[8+NonceSize:]), "client name")
	if err != nil {
		return 0, "", err
	}
	version := min(cversion, vr.max)
	if version < vr.min {
		sendServerHello(conn, vr.max, verdictVersion, 0, nil)
		return 0, "", status.Errorf(status.VersionMismatch,
			"handshake: client %q speaks protocol version %d, this build speaks versions %d to %d",
			peerName, cversion, vr.min, vr.max)
	}
	if cauth := cflags&flagSecret != 0; cauth != auth {
		if auth {
			sendServerHello(conn, version, verdictNeedAuth, 0, nil)
			return 0, "", status.Errorf(status.AuthFailed,
				"handshake: client %q has no secret but this engine requires authentication", peerName)
		}
		sendServerHello(conn, version, verdictNoAuth, 0, nil)
		return 0, "", status.Errorf(status.AuthFailed,
			"handshake: client %q wants authentication but no secret is configured here", peerName)
	}

	var nonceS [NonceSize]byte
	if _, err := rand.Read(nonceS[:]); err != nil {
		return 0, "", status.Errorf(status.Internal, "handshake: random nonce: %w", err)
	}
	var flags uint8
	if auth {
		flags |= flagSecret
	}
	if err := sendServerHello(conn, version, verdictOK, flags, nonceS[:]); err != nil {
		return 0, "", err
	}

	finish := make([]byte, clientFinishSize)
	if err := readFull(conn, finish[:1], "client finish"); err != nil {
		return 0, "", err
	}
	switch v := finish[0]; v {
	case verdictOK:
	case verdictVersion:
		return 0, "", status.Errorf(status.VersionMismatch,
			"handshake: client %q refused protocol version %d", peerName, version)
	case verdictNeedAuth, verdictNoAuth:
		return 0, "", status.Errorf(status.AuthFailed,
			"handshake: client %q refused our authentication settings", peerName)
	default:
		return 0, "", status.Errorf(status.Protocol, "handshake: client finish has unexpected verdict %d", v)
	}
	if err := readFull(conn, finish[1:], "client finish"); err != nil {
		return 0, "", err
	}
	var proofS []byte
	if auth {
		mac := hmac.New(sha256.New, cfg.Secret)
		writeTranscript(mac, clientLabel, version, kind, nonceC, nonceS[:], peerName)
		if !hmac.Equal(mac.Sum(nil), finish[1:]) {
			reject(conn, verdictBadProof)
			return 0, "", status.Errorf(status.AuthFailed,
				"handshake: client %q failed to prove knowledge of the secret", peerName)
		}
		mac = hmac.New(sha256.New, cfg.Secret)
		writeTranscript(mac, serverLabel, version, kind, nonceC, nonceS[:], peerName, cfg.LocalName)
		proofS = mac.Sum(nil)
	} else if !allZero(finish[1:]) {
		return 0, "", status.Errorf(status.Protocol,
			"handshake: client %q sent a proof although neither side has a secret", peerName)
	}

	e := NewEncoder(make([]byte, 0, serverFinishHead+len(cfg.LocalName)))
	e.U8(verdictOK)
	if proofS != nil {
		e.Raw(proofS)
	} else {
		e.Raw(make([]byte, ProofSize))
	}
	e.U16(uint16(len(cfg.LocalName)))
	e.RawString(cfg.LocalName)
	if err := writeAll(conn, e.Out(), "server finish"); err != nil {
		return 0, "", err
	}
	return kind, peerName, nil
}

// writeTranscript feeds the MAC everything both sides agreed on. Every
// variable-length field is length-prefixed so that no two transcripts
// concatenate to the same bytes.
func writeTranscript(w io.Writer, label string, version uint16, kind uint8, nonceC, nonceS []byte, names ...string) {
	e := NewEncoder(make([]byte, 0, 128))
	e.RawString(label)
	e.U16(version)
	e.U8(kind)
	e.Raw(nonceC)
	e.Raw(nonceS)
	for _, n := range names {
		e.U16(uint16(len(n)))
		e.RawString(n)
	}
	w.Write(e.Out())
}

func sendServerHello(conn net.Conn, version uint16, verdict, flags uint8, nonce []byte) error {
	e := NewEncoder(make([]byte, 0, serverHelloSize))
	e.RawString(HandshakeMagic)
	e.U16(version)
	e.U8(verdict)
	e.U8(flags)
	if nonce != nil {
		e.Raw(nonce)
	} else {
		e.Raw(make([]byte, NonceSize))
	}
	return writeAll(conn, e.Out(), "server hello")
}

// reject tells the peer why we are giving up, best effort: the error we
// return matters more than whether the peer heard it. A refusal is the lone
// verdict byte, which the peer reads before the rest of a finish message, so
// the write completes even on a synchronous pipe.
func reject(conn net.Conn, verdict uint8) {
	conn.Write([]byte{verdict})
}

func readName(conn net.Conn, n uint16, what string) (string, error) {
	if n > MaxNameLen {
		return "", status.Errorf(status.Protocol, "handshake: %s length %d exceeds limit %d", what, n, MaxNameLen)
	}
	if n == 0 {
		return "", nil
	}
	b := make([]byte, n)
	if err := readFull(conn, b, what); err != nil {
		return "", err
	}
	return string(b), nil
}

func setDeadline(conn net.Conn, d time.Time) error {
	if d.IsZero() {
		d = time.Now().Add(DefaultHandshakeTimeout)
	}
	if err := conn.SetDeadline(d); err != nil {
		return ioError("handshake: set deadline", err)
	}
	return nil
}

func readFull(conn net.Conn, b []byte, what string) error {
	return readFullOr(conn, b, what, status.Protocol)
}

// readFullOr is readFull with closedEmpty the code for a peer that closed
// before sending any of b.
func readFullOr(conn net.Conn, b []byte, what string, closedEmpty status.Code) error {
	n, err := io.ReadFull(conn, b)
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) && n == 0 && closedEmpty != status.Protocol {
		return status.Errorf(closedEmpty,
			"handshake: peer closed the connection before sending any of the %d bytes of the %s", len(b), what)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return status.Errorf(status.Protocol,
			"handshake: peer closed the connection after %d of %d bytes of the %s", n, len(b), what)
	}
	if isTimeout(err) {
		return status.Errorf(status.Timeout, "handshake: deadline exceeded waiting for the %s: %w", what, err)
	}
	return ioError("handshake: reading the "+what, err)
}

func writeAll(conn net.Conn, b []byte, what string) error {
	if _, err := conn.Write(b); err != nil {
		if isTimeout(err) {
			return status.Errorf(status.Timeout, "handshake: deadline exceeded sending the %s: %w", what, err)
		}
		return ioError("handshake: sending the "+what, err)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
