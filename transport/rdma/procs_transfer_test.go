package rdma

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/internal/peertest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// Bytes written to and read from another process arrive intact over one
// and two NICs; a large request is striped over both NICs, small ones
// share posts, and everything is released afterwards.
func TestTransfersBetweenProcesses(t *testing.T) {
	for _, devices := range []string{"fake0", "fake0,fake1"} {
		t.Run(devices, func(t *testing.T) {
			f := useFake(t, devices)
			const n = 8 << 20
			p := startPeer(t, f, peertest.Buffer{Size: n, Perm: rw})
			e, tr := newProcEngine(t, false)
			src, _ := localBuf(t, e, n)
			seg, err := e.OpenSegment(p.Name)
			require.NoError(t, err)
			remote := p.Buffers[0].Addr

			code, st, _ := run(t, e, []core.TransferRequest{{Op: core.OpWrite, Local: host.Addr(src), Segment: seg, Remote: remote, Len: n}}, core.TransferOptions{})
			require.Equal(t, status.OK, code)
			nics := strings.Split(devices, ",")
			require.Equal(t, core.FlagNIC, st[0].Flags, "the status names the NICs that carried it")
			require.EqualValues(t, len(nics), st[0].NICs, "8 MiB striped over every NIC")
			require.Less(t, int(st[0].NIC), len(nics))
			require.Equal(t, core.RequestStatus{Code: status.OK, Transport: ID, Bytes: n, Flags: core.FlagNIC,
				NIC: st[0].NIC, NICs: uint16(len(nics))}, st[0])
			require.Equal(t, peertest.Sum(src), sum(t, p, 0), "the peer holds what was written")

			_, err = p.Cmd("fill 0 7")
			require.NoError(t, err)
			back, _ := localBuf(t, e, n)
			code, st, _ = run(t, e, []core.TransferRequest{{Op: core.OpRead, Local: host.Addr(back), Segment: seg, Remote: remote, Len: n}}, core.TransferOptions{})
			require.Equal(t, status.OK, code)
			require.EqualValues(t, ID, st[0].Transport)
			require.Equal(t, peertest.Sum(peertest.Pattern(7, n)), peertest.Sum(back), "read back what the peer holds")

			stats := tr.Stats()
			for _, dev := range strings.Split(devices, ",") {
				require.Positive(t, stats["nic."+dev+".bytes"], "the 8 MiB requests were striped over %s too: %v", dev, stats)
			}

			// 32 small requests in one batch: posted as chains, not one by one.
			const small = 4 << 10
			before := tr.Stats()
			posts := before["posts"]
			var reqs []core.TransferRequest
			for i := range 32 {
				reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i*small), Segment: seg,
					Remote: remote + uint64(i*small), Len: small})
			}
			code, st, _ = run(t, e, reqs, core.TransferOptions{})
			require.Equal(t, status.OK, code)
			perNIC := map[uint16]int64{}
			for _, s := range st {
				require.EqualValues(t, ID, s.Transport)
				require.Equal(t, core.FlagNIC, s.Flags)
				require.EqualValues(t, 1, s.NICs, "a small request is one work request on one NIC")
				perNIC[s.NIC]++
			}
			after := tr.Stats()
			for _, dev := range nics {
				idx := uint16(after["nic."+dev+".index"])
				require.Equal(t, perNIC[idx], after["nic."+dev+".requests"]-before["nic."+dev+".requests"],
					"%s's request count is the statuses that name it", dev)
				require.Positive(t, perNIC[idx], "small requests rotate over %s too", dev)
			}
			require.LessOrEqual(t, tr.Stats()["posts"]-posts, int64(2*len(strings.Split(devices, ","))),
				"32 small requests took one post per queue pair")
			// Selective signalling: one completion per 16 work requests of a
			// chain (and the chain's last): 32 requests in chains of 32 or
			// 2x16 ask for 2 completions, and none is left in flight.
			require.EqualValues(t, 2, after["signaled"]-before["signaled"], "%v", after)
			require.Zero(t, after["inflight"])
			want := append(append([]byte(nil), src[:32*small]...), peertest.Pattern(7, n)[32*small:]...)
			require.Equal(t, peertest.Sum(want), sum(t, p, 0))

			require.NoError(t, e.Uninstall(Name))
			f.requireNoObjects(t)
		})
	}
}
