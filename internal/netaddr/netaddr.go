package netaddr

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MaxLen bounds a "host:port" string: a DNS name is at most 253 bytes, an
// IPv6 literal with a zone and brackets far less.
const MaxLen = 300

// CheckDial checks an address to connect to: a host (IPv4, [IPv6] or DNS
// name) and a port in [1, 65535].
func CheckDial(s string) error { return check(s, false) }

// CheckListen checks an address to listen on: as CheckDial, but the host
// may be empty (every interface) and the port 0 (any free port).
func CheckListen(s string) error { return check(s, true) }

func check(s string, listen bool) error {
	if len(s) > MaxLen {
		return fmt.Errorf("address of %d bytes is longer than %d", len(s), MaxLen)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want \"host:port\": %v", err)
	}
	if err := checkPort(port, listen); err != nil {
		return err
	}
	if host == "" {
		if listen {
			return nil
		}
		return fmt.Errorf("empty host")
	}
	if strings.Contains(s, "[") {
		// Brackets are for IPv6 literals only ("[::1]:80"), with an
		// optional zone ("[fe80::1%eth0]:80").
		addr, _, _ := strings.Cut(host, "%")
		if ip := net.ParseIP(addr); ip == nil || ip.To4() != nil {
			return fmt.Errorf("host %q in brackets is not an IPv6 address", host)
		}
		return nil
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	return checkHostname(host)
}

// checkPort accepts a decimal port in canonical form (no sign, no leading
// zeros), 1..65535, or 0 when listening.
func checkPort(port string, listen bool) error {
	n, err := strconv.Atoi(port)
	if err != nil || port != strconv.Itoa(n) || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number in [1, 65535]", port)
	}
	if n == 0 && !listen {
		return fmt.Errorf("port 0 cannot be connected to")
	}
	return nil
}

// checkHostname accepts DNS names: dot-separated labels of letters,
// digits, '-' and '_' (as container and service names use), each 1..63
// bytes and not starting or ending with '-'; at most 253 bytes. A name of
// digits and dots only would be a malformed IPv4 address.
func checkHostname(h string) error {
	if len(h) > 253 {
		return fmt.Errorf("host name of %d bytes is longer than 253", len(h))
	}
	allDigits := true
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q is not an IP address or a DNS name", h)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
				allDigits = false
			default:
				return fmt.Errorf("host %q is not an IP address or a DNS name", h)
			}
		}
	}
	if allDigits {
		return fmt.Errorf("host %q is not a valid IPv4 address", h)
	}
	return nil
}
