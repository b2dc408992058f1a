//go:build linux

package shm

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/core"
)

// holdGrants takes one reference per run of requests under one grant,
// and putGrants gives back exactly those: a revoke waits for the copy
// while it holds any, and not a moment past it.
func TestGrantReferencesPerRun(t *testing.T) {
	c := &conn{t: &Transport{}, grantIDs: map[uint64]*standing{}}
	c.gidle = sync.NewCond(&c.gmu)
	require.NoError(t, c.addGrants([]standingDesc{
		{id: 1, base: 0x1000, len: 0x1000, perm: core.PermRemoteWrite},
		{id: 2, base: 0x4000, len: 0x1000, perm: core.PermRemoteWrite},
	}))
	at := func(addr uint64) *core.Request {
		return &core.Request{Op: core.OpWrite, Remote: addr, Len: 0x100}
	}
	// Two runs under grant 1 around one under grant 2.
	reqs := []*core.Request{at(0x1000), at(0x1100), at(0x4000), at(0x4100), at(0x1200)}
	out := make([]*standing, len(reqs))
	require.True(t, c.holdGrants(reqs, out))
	g1, g2 := c.grantIDs[1], c.grantIDs[2]
	require.Equal(t, []*standing{g1, g1, g2, g2, g1}, out)
	require.Equal(t, 2, g1.refs)
	require.Equal(t, 1, g2.refs)

	revoked := make(chan struct{})
	go func() { c.revokeGrants([]uint64{1}); close(revoked) }()
	require.Eventually(t, g1.dead.Load, 10e9, 1e6, "the revoke marked the grant")
	select {
	case <-revoked:
		t.Fatal("the revoke returned while a copy held the grant")
	default:
	}
	c.putGrants(out)
	<-revoked
	require.Zero(t, g1.refs)
	require.Zero(t, g2.refs)
}
