package etcd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

func TestParseURL(t *testing.T) {
	good := []struct {
		url, prefix string
		eps         []string
		pfx         string
		ttl, dial   time.Duration
	}{
		{"etcd://127.0.0.1:2379", "", []string{"127.0.0.1:2379"}, "/tent", DefaultTTL, DefaultDialTimeout},
		{"etcd://a:1,b:2, c:3/", "/x/", []string{"a:1", "b:2", "c:3"}, "/x", DefaultTTL, DefaultDialTimeout},
		{"etcd://[::1]:2379?ttl=2", "/", []string{"[::1]:2379"}, "", 2 * time.Second, DefaultDialTimeout},
		{"etcd://h:1/?ttl=1500ms&dial_timeout=0.5", "p", []string{"h:1"}, "p", 1500 * time.Millisecond, 500 * time.Millisecond},
	}
	for _, g := range good {
		c, err := parseURL(g.url, g.prefix)
		require.NoError(t, err, g.url)
		require.Equal(t, g.eps, c.endpoints, g.url)
		require.Equal(t, g.pfx, c.prefix, g.url)
		require.Equal(t, g.ttl, c.ttl, g.url)
		require.Equal(t, g.dial, c.dialTimeout, g.url)
	}
	c, _ := parseURL("etcd://h:1?ttl=1500ms", "")
	require.EqualValues(t, 2, c.ttlSeconds())
	require.Equal(t, "/tent/segments/n/with/slash", c.segmentKey("n/with/slash"))

	for _, bad := range []string{
		"etcd://", "etcd://host", "etcd://host:", "etcd://host:0", "etcd://host:99999", "etcd://:2379",
		"etcd://a:1,,b:2", "etcd://a:1/path", "etcd://a:1?ttl=0", "etcd://a:1?ttl=-3", "etcd://a:1?ttl=2h",
		"etcd://a:1?ttl=soon", "etcd://a:1?dial_timeout=0", "etcd://a:1?tll=2", "etcd://a:1?ttl=2&ttl=3",
		"etcd://a:1?%zz", "127.0.0.1:2379",
	} {
		_, err := parseURL(bad, "")
		require.Equal(t, status.InvalidArgument, status.CodeOf(err), "%q: %v", bad, err)
		require.Contains(t, err.Error(), bad)
	}
}

// A descriptor too large for etcd is stored without its regions.
func TestValueTooLargeIsSlimmed(t *testing.T) {
	d := &wire.SegmentDesc{Name: "big", MachineID: "m", PID: 1, Incarnation: 7, Generation: 3,
		Endpoints: []wire.Endpoint{{Transport: "ctl", Addr: "127.0.0.1:1"}}}
	small, err := d.MarshalBinary()
	require.NoError(t, err)
	v, err := value(d, small)
	require.NoError(t, err)
	require.Equal(t, small, v)

	for i := 0; len(d.Regions)*40 < 2*maxValue; i++ {
		d.Regions = append(d.Regions, wire.RegionDesc{Addr: uint64(i+1) << 20, Len: 4096, Perm: wire.PermRead, Location: "cpu"})
	}
	big, err := d.MarshalBinary()
	require.NoError(t, err)
	require.Greater(t, len(big), maxValue)
	v, err = value(d, big)
	require.NoError(t, err)
	require.LessOrEqual(t, len(v), maxValue)
	got, err := decode("big", "k", v)
	require.NoError(t, err)
	require.Empty(t, got.Regions)
	require.Equal(t, d.Incarnation, got.Incarnation)
	require.Equal(t, d.Generation, got.Generation)
	require.Equal(t, d.Endpoints, got.Endpoints)
	require.Len(t, d.Regions, len(d.Regions)) // the caller's descriptor is untouched

	_, err = decode("big", "k", make([]byte, wire.MaxDescriptorSize+1))
	require.Equal(t, status.Protocol, status.CodeOf(err))
}
