package core_test

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Core's control frames a raw peer speaks: a notification, and its answer.
const (
	rawCtlNotify     = 4 // u64 id, str from, bytes message
	rawCtlNotifyDone = 5 // u64 id, status
)

// rawNotify is a peer command: it speaks core's control protocol by hand,
// with no engine behind it: "rawnotify ADDR SECRET|- HANDSHAKE_NAME CLAIMED MSG"
// handshakes with ADDR under HANDSHAKE_NAME, sends MSG naming CLAIMED as its
// sender and answers "ok" or "refused CODE" (the names are %-escaped).
func rawNotify(_ *core.Engine, args []string) (string, error) {
	if len(args) != 5 {
		return "", fmt.Errorf("rawnotify needs ADDR SECRET HANDSHAKE_NAME CLAIMED MSG")
	}
	addr, secret, msg := args[0], args[1], args[4]
	name, err := url.PathUnescape(args[2])
	if err != nil {
		return "", err
	}
	claimed, err := url.PathUnescape(args[3])
	if err != nil {
		return "", err
	}
	cfg := wire.HandshakeConfig{LocalName: name, Deadline: time.Now().Add(10 * time.Second)}
	if secret != "-" {
		cfg.Secret = []byte(secret)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := wire.ClientHandshake(c, cfg, core.KindControl); err != nil {
		return "", err
	}
	enc := wire.NewEncoder(nil)
	enc.U64(7)
	enc.String(claimed)
	enc.Bytes([]byte(msg))
	if err := wire.WriteFrame(c, rawCtlNotify, enc.Out()); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, payload, err := wire.ReadFrame(c, 1<<16, nil)
	if err != nil {
		return "", err
	}
	d := wire.NewDecoder(payload)
	id := d.U64()
	serr := d.Status(addr)
	if err := d.Finish(); err != nil || typ != rawCtlNotifyDone || id != 7 {
		return "", fmt.Errorf("bad answer: type %d id %d err %v", typ, id, err)
	}
	if serr != nil {
		return fmt.Sprintf("refused %d", status.CodeOf(serr)), nil
	}
	return "ok", nil
}

func takeNote(t *testing.T, e *core.Engine) core.Notification {
	t.Helper()
	n, err := e.RecvNotification(10*time.Second, func(core.Notification) bool { return true })
	require.NoError(t, err)
	return n
}

// A notification is delivered under the name its connection's handshake
// gave, never under one its frame claims: a raw peer in another process
// that names another engine as the sender is refused (counted, logged once
// per peer), the same peer under its own name is delivered as itself, and
// an engine's own notifications over the network arrive under its name.
// With a secret the handshake's name was proved by a holder of it; without
// one it is a claim too, but the frame still cannot differ from it.
func TestNotificationSenderIsTheConnectionsName(t *testing.T) {
	for _, secret := range []string{"s3cret", ""} {
		t.Run(fmt.Sprintf("secret=%q", secret), func(t *testing.T) {
			logger, lines := debugLogger(t)
			target := newLocalEngine(t, core.Options{Secret: []byte(secret), Logger: logger, DefaultTimeout: 5 * time.Second})
			// A set of its own: the victim reaches the target over the network.
			victim := newLocalEngine(t, core.Options{Secret: []byte(secret), LocalPeers: core.NewLocalPeers(),
				DefaultTimeout: 5 * time.Second})
			rogue := peertest.Start(t, peertest.Config{Transports: []string{"local"}, Secret: secret})
			arg := secret
			if arg == "" {
				arg = "-"
			}

			seg, err := victim.OpenSegment(target.Name())
			require.NoError(t, err)
			require.Nil(t, seg.Peer().Local(), "the victim must reach the target over the network")
			require.NoError(t, victim.SendNotification(seg, []byte("genuine")))
			n := takeNote(t, target)
			require.Equal(t, victim.Name(), n.From)
			require.Equal(t, "genuine", string(n.Msg))

			for range 2 {
				got, err := rogue.Cmd("rawnotify %s %s %s %s forged", target.ListenAddr(), arg, rogue.Name, victim.Name())
				require.NoError(t, err)
				require.Equal(t, fmt.Sprintf("refused %d", status.PermissionDenied), got)
			}
			_, err = target.RecvNotification(0, func(core.Notification) bool { return true })
			require.ErrorIs(t, err, status.ErrTimeout, "a forged notification was queued")
			require.EqualValues(t, 2, target.Stats().NotifySenderRefused)
			require.Len(t, lines.matching("notification refused", rogue.Name, victim.Name()), 1,
				"one line per peer, however often it tries")

			// C reads a sender up to its first NUL: such a name would
			// reach it as the victim's.
			nul := victim.Name() + "%00x"
			got, err := rogue.Cmd("rawnotify %s %s %s %s forged", target.ListenAddr(), arg, nul, nul)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("refused %d", status.PermissionDenied), got)
			require.EqualValues(t, 3, target.Stats().NotifySenderRefused)

			got, err = rogue.Cmd("rawnotify %s %s %s %s own", target.ListenAddr(), arg, rogue.Name, rogue.Name)
			require.NoError(t, err)
			require.Equal(t, "ok", got)
			n = takeNote(t, target)
			require.Equal(t, rogue.Name, n.From)
			require.Equal(t, "own", string(n.Msg))

			require.NoError(t, victim.SendNotification(seg, []byte("still genuine")))
			require.Equal(t, victim.Name(), takeNote(t, target).From)
			require.EqualValues(t, 3, target.Stats().NotifySenderRefused)
		})
	}
}
