package rdma

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// rawConnect opens a connect-channel session by hand, as a peer with no
// engine would: the handshake, a frameConnect for NIC 0 naming a made-up
// queue pair, and the target's frameAccept. The target holds a queue pair
// for as long as the connection stays open.
func rawConnect(t *testing.T, addr string, incarnation uint64) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = wire.ClientHandshake(c, wire.HandshakeConfig{LocalName: "flooder"}, KindConnect)
	require.NoError(t, err)
	enc := wire.NewEncoder(nil)
	enc.U8(0)
	enc.U64(incarnation)
	putAddr(&enc, qpAddr{QPN: 0xdead, PSN: 1, Port: 1})
	enc.U8(uint8(mtu(5)))
	require.NoError(t, wire.WriteFrame(c, frameConnect, enc.Out()))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a bound for a broken target only
	typ, payload, err := wire.ReadFrame(c, maxFrame, nil)
	require.NoError(t, err)
	_, _, err = decodeReply(typ, payload, addr)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Time{})
	return c
}

// The connect channel arrives on the engine's listener, so its caps
// (Options.MaxConnsPerPeer, MaxConns) bound it, and with it the target's
// queue pairs, each of which lives exactly as long as its connection: a
// raw peer fills the per-peer cap with sessions that each hold a target
// queue pair, the sessions past it are closed at accept with no queue pair
// made, the pair's queue pairs made before the flood keep carrying its
// transfers, and once the flood closes the live count and the queue pairs
// (the transport's and the fake NIC's) are back to the baseline.
func TestConnectChannelCapsRefuseAFloodAndSpareARealPair(t *testing.T) {
	const perPeer = 12
	p := newPairWith(t, core.Options{MaxConnsPerPeer: perPeer, MaxConns: 64}, false, "fake0")
	const n = 1 << 20
	src, _ := buf(t, p.a, n, 0)
	dst, _ := buf(t, p.b, n, rw)
	transfer := func() {
		t.Helper()
		_, _ = rand.Read(src)
		code, st, err := run(t, p.a, ops(core.OpWrite, src, p.seg, dst, 1, n), core.TransferOptions{})
		require.Equal(t, status.OK, code, "%v", err)
		require.EqualValues(t, ID, st[0].Transport)
		require.True(t, bytes.Equal(src, dst))
	}
	transfer()

	engineStats := func() core.ListenerStats { return p.b.Stats().Listeners["engine"] }
	targetQPs := func() int64 { return p.tb.Stats()["target_qps"] }
	base, baseQPs, baseNIC := engineStats().Live, targetQPs(), p.f.counts().QPs
	require.Positive(t, base)
	require.Less(t, base, perPeer)
	require.EqualValues(t, 1, baseQPs, "the pair's one queue pair")
	refusedBefore := engineStats().Refused
	d, err := p.b.Descriptor()
	require.NoError(t, err)

	var raw []net.Conn
	defer func() {
		for _, c := range raw {
			c.Close()
		}
	}()
	for i := base; i < perPeer; i++ {
		raw = append(raw, rawConnect(t, p.b.ListenAddr(), d.Incarnation))
	}
	held := int64(perPeer - base)
	require.Equal(t, perPeer, engineStats().Live)
	require.Equal(t, baseQPs+held, targetQPs())
	require.Equal(t, baseNIC+int(held), p.f.counts().QPs)

	const extra = 5
	for range extra {
		c, err := net.Dial("tcp", p.b.ListenAddr())
		require.NoError(t, err)
		raw = append(raw, c)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := c.Read(make([]byte, 1))
		require.Zero(t, got)
		require.ErrorIs(t, err, io.EOF, "a session past the cap is closed at accept")
	}
	require.EqualValues(t, extra, engineStats().Refused-refusedBefore)
	require.Equal(t, baseQPs+held, targetQPs(), "no queue pair for a refused session")
	require.Equal(t, baseNIC+int(held), p.f.counts().QPs)

	transfer() // over the queue pair made before the flood

	for _, c := range raw {
		c.Close()
	}
	raw = nil
	require.Eventually(t, func() bool {
		return engineStats().Live == base && targetQPs() == baseQPs && p.f.counts().QPs == baseNIC
	}, 20*time.Second, time.Millisecond, "live connections or queue pairs not back to the baseline")
	transfer()
	p.uninstall(t)
}
