package tcp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/transport/tcp"
)

// A batch of many small requests is written by its submitter, one large
// group per Submit call: 128 WRITEs of 16 KiB over two idle streams (1
// MiB each) put one group on the submitter and wake the other stream's
// writer, so the two are written in parallel; 128 READs of 16 KiB (their
// headers only on the wire) are written by the submitter on both.
func TestSubmitterWritesOneLargeGroup(t *testing.T) {
	const n, block = 128, 16 << 10
	peer := startPeer(t, n*block)
	e, tr := newEngineWith(t, core.Options{}, tcp.Options{Streams: 2})
	src := alloc(t, e, n*block, 0)
	dst := alloc(t, e, n*block, 0)
	seg := openSegment(t, e, peer.Name)
	remote := peer.Buffers[0].Addr
	batch := func(op core.Op, local []byte) []core.TransferRequest {
		reqs := make([]core.TransferRequest, n)
		for i := range reqs {
			off := uint64(i * block)
			reqs[i] = core.TransferRequest{Op: op, Local: host.Addr(local) + off, Segment: seg, Remote: remote + off, Len: block}
		}
		return reqs
	}
	quiet := func() {
		t.Helper()
		require.Eventually(t, func() bool { return !tr.Writing() }, 10*time.Second, time.Millisecond)
	}
	// Both streams are dialed (by their writers) and then idle.
	code, _, err := run(t, e, batch(core.OpWrite, src), 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	require.Equal(t, int64(2), tr.Stats()["dials"])
	quiet()

	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	before := tr.Stats()
	code, _, err = run(t, e, batch(core.OpWrite, src), 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	quiet()
	after := tr.Stats()
	require.Equal(t, int64(1), after["writes_inline"]-before["writes_inline"],
		"one stream's 1 MiB written by the submitter, the other's by its writer: %v", after)
	require.Positive(t, after["writes_by_writer"]-before["writes_by_writer"], "%v", after)

	before = after
	code, _, err = run(t, e, batch(core.OpRead, dst), 30*time.Second)
	require.Equal(t, status.OK, code, "%v", err)
	quiet()
	after = tr.Stats()
	require.Equal(t, int64(2), after["writes_inline"]-before["writes_inline"],
		"a READ group is its headers: both written by the submitter: %v", after)
	require.True(t, bytes.Equal(src, dst), "the data read back differs from the data written")
	require.Zero(t, after["protocol_errors"], "%v", after)
	require.Equal(t, int64(2), after["dials"], "%v", after)
	require.Zero(t, e.Stats().DuplicateCompletions)
}
