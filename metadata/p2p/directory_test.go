package p2p_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/metadata/p2p"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// A name leads to the control endpoint at that address, and only a
// dialable "host:port" is a name.
func TestResolve(t *testing.T) {
	d := p2p.New()
	desc, err := d.Resolve("127.0.0.1:4000", time.Now())
	require.NoError(t, err)
	require.Equal(t, []wire.Endpoint{{Transport: wire.ControlEndpoint, Addr: "127.0.0.1:4000"}}, desc.Endpoints)
	require.Zero(t, desc.Incarnation, "p2p knows nothing of the engine but where it is")

	for _, bad := range []string{"", "worker-1", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "host name:1", ":4000"} {
		_, err := d.Resolve(bad, time.Now())
		require.ErrorIs(t, err, status.ErrInvalidArgument, "%q", bad)
	}
	scope, byAddress := d.Scope()
	require.Equal(t, p2p.Scheme, scope)
	require.True(t, byAddress)
	require.NoError(t, d.Close())
}
