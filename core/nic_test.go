package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/core/coretest"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// nicMover names NICs for the even requests it serves, as a network
// transport does, and none for the odd ones.
type nicMover struct{ *coretest.Mover }

func (m nicMover) Submit(reqs []*core.Request) {
	for _, r := range reqs {
		if r.Index()%2 == 0 {
			r.MarkNIC(r.Index()+7, r.Index()%3+1)
		}
	}
	m.Mover.Submit(reqs)
}

// A request's status carries the NICs its transport named (with FlagNIC)
// and nothing for one that named none.
func TestStatusCarriesTheNICsATransportNamed(t *testing.T) {
	a := newLocalEngine(t, core.Options{})
	require.NoError(t, a.Uninstall("local"))
	require.NoError(t, a.Install(nicMover{coretest.NewMover("nics")}))
	b := newLocalEngine(t, core.Options{})
	src, _ := buf(t, a, 4096, 0)
	dst, _ := buf(t, b, 4096, core.PermRemoteWrite|core.PermRemoteRead)
	seg, err := a.OpenSegment(b.Name())
	require.NoError(t, err)
	var reqs []core.TransferRequest
	for i := range 6 {
		reqs = append(reqs, core.TransferRequest{Op: core.OpWrite, Local: host.Addr(src) + uint64(i*8), Segment: seg,
			Remote: host.Addr(dst) + uint64(i*8), Len: 8})
	}
	batch, err := a.Submit(reqs, core.TransferOptions{})
	require.NoError(t, err)
	defer a.ReleaseBatch(batch)
	code, _ := batch.Wait(-1)
	require.Equal(t, status.OK, code)
	st := make([]core.RequestStatus, len(reqs))
	_, done, _ := batch.Status(st)
	require.Equal(t, len(reqs), done)
	for i, s := range st {
		if i%2 == 0 {
			require.Equal(t, core.FlagNIC, s.Flags, "request %d", i)
			require.EqualValues(t, i+7, s.NIC, "request %d", i)
			require.EqualValues(t, i%3+1, s.NICs, "request %d", i)
		} else {
			require.Zero(t, s.Flags, "request %d", i)
			require.Zero(t, s.NIC, "request %d", i)
			require.Zero(t, s.NICs, "request %d", i)
		}
	}
}
