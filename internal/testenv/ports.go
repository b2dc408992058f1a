package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// ServerAddr returns a loopback address whose port was free a moment ago,
// for a server a test starts in another process or restarts at the same
// address. The port comes from below the kernel's ephemeral range when
// there is room: the kernel hands ephemeral ports to every connect and
// every bind to port 0 on the machine (other test packages run beside
// this one), so a port from that range can be taken between this check
// and the server's bind, or while the server is down. Nothing assigns a
// port below the range on its own. The caller still handles a lost bind
// (an explicit bind elsewhere can take any port).
func ServerAddr(t testing.TB) string {
	t.Helper()
	if lo := ephemeralLow(); lo-firstServerPort >= 1000 {
		for range 100 {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(firstServerPort+rand.IntN(lo-firstServerPort)))
			if l, err := net.Listen("tcp", addr); err == nil {
				l.Close()
				return addr
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("no free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// firstServerPort keeps clear of well-known and registered low ports.
const firstServerPort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range, 32768
// (Linux's default) when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}
