package netaddr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		addr         string
		dial, listen bool
	}{
		{"127.0.0.1:8080", true, true},
		{"localhost:1", true, true},
		{"node-1.cluster.local:65535", true, true},
		{"etcd_0:2379", true, true},
		{"[::1]:80", true, true},
		{"[fe80::1%eth0]:80", true, true},
		{"127.0.0.1:0", false, true},
		{":8080", false, true},
		{":0", false, true},
		{"127.0.0.1:99999", false, false},
		{"127.0.0.1:65536", false, false},
		{"127.0.0.1:-1", false, false},
		{"127.0.0.1:+80", false, false},
		{"127.0.0.1:080", false, false},
		{"127.0.0.1:12ab", false, false},
		{"127.0.0.1:http", false, false},
		{"127.0.0.1:", false, false},
		{"127.0.0.1", false, false},
		{"", false, false},
		{"::1:80", false, false},
		{"[127.0.0.1]:80", false, false},
		{"[nothost]:80", false, false},
		{"999.1.1.1:80", false, false},
		{"1.2.3:80", false, false},
		{"-bad.host:80", false, false},
		{"bad-.host:80", false, false},
		{"a..b:80", false, false},
		{"a b:80", false, false},
		{"host/path:80", false, false},
		{"h\x00:80", false, false},
		{strings.Repeat("a", 64) + ":80", false, false},
		{strings.Repeat("a.", 130) + "a:80", false, false},
	} {
		require.Equal(t, c.dial, CheckDial(c.addr) == nil, "CheckDial(%q): %v", c.addr, CheckDial(c.addr))
		require.Equal(t, c.listen, CheckListen(c.addr) == nil, "CheckListen(%q): %v", c.addr, CheckListen(c.addr))
	}
}

func FuzzCheck(f *testing.F) {
	f.Add("127.0.0.1:80")
	f.Add("[::1]:0")
	f.Fuzz(func(t *testing.T, s string) {
		if CheckDial(s) == nil {
			require.NoError(t, CheckListen(s), "a dialable address is listenable")
		}
	})
}
