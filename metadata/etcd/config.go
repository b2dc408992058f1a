package etcd

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tent-dev/tent/internal/netaddr"
	"github.com/tent-dev/tent/status"
)

const (
	// DefaultPrefix is the key prefix when Options.MetadataPrefix is empty.
	DefaultPrefix = "/tent"
	// DefaultTTL is the lease TTL of a published descriptor.
	DefaultTTL = 10 * time.Second
	// DefaultDialTimeout bounds how long engine creation waits for etcd.
	DefaultDialTimeout = 5 * time.Second
	// maxTTL keeps a typo from holding a dead engine's name for days.
	maxTTL = time.Hour
)

// config is a parsed metadata URL plus the key prefix.
type config struct {
	endpoints   []string // host:port
	prefix      string   // without a trailing slash
	ttl         time.Duration
	dialTimeout time.Duration
}

// parseURL parses "etcd://host:port[,host:port...][/][?ttl=N&dial_timeout=D]".
// ttl and dial_timeout take a Go duration ("2s", "500ms") or a number of
// seconds ("2"). Unknown parameters are refused, so a typo is not silently
// ignored.
func parseURL(raw, prefix string) (config, error) {
	bad := func(format string, args ...any) (config, error) {
		return config{}, status.Errorf(status.InvalidArgument, "metadata %q: "+format, append([]any{raw}, args...)...)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" {
		return bad("want \"etcd://host:port[,host:port...]\"")
	}
	hosts, query, _ := strings.Cut(rest, "?")
	hosts = strings.TrimSuffix(hosts, "/")
	if strings.Contains(hosts, "/") {
		return bad("a path is not allowed (the key prefix is the metadata_prefix option)")
	}
	c := config{ttl: DefaultTTL, dialTimeout: DefaultDialTimeout}
	for _, h := range strings.Split(hosts, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return bad("empty endpoint")
		}
		if err := netaddr.CheckDial(h); err != nil {
			return bad("endpoint %q: %v", h, err)
		}
		c.endpoints = append(c.endpoints, h)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("bad query: %v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return bad("parameter %q given %d times", k, len(vs))
		}
		d, err := parseDuration(vs[0])
		if err != nil {
			return bad("parameter %s=%q: %v", k, vs[0], err)
		}
		switch k {
		case "ttl":
			if d < time.Second || d > maxTTL {
				return bad("ttl %v is outside [1s, %v]", d, maxTTL)
			}
			c.ttl = d
		case "dial_timeout":
			if d <= 0 || d > time.Minute {
				return bad("dial_timeout %v is outside (0, 1m]", d)
			}
			c.dialTimeout = d
		default:
			return bad("unknown parameter %q (known: ttl, dial_timeout)", k)
		}
	}
	c.prefix = normalizePrefix(prefix)
	return c, nil
}

func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		if n <= 0 || n > 1e6 {
			return 0, status.Errorf(status.InvalidArgument, "out of range")
		}
		return time.Duration(n * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// normalizePrefix returns the prefix without trailing slashes; "" means
// DefaultPrefix, "/" means the root of the key space.
func normalizePrefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	return strings.TrimRight(p, "/")
}

// ttlSeconds is the lease TTL etcd is asked for (whole seconds, rounded
// up; etcd may raise it to its minimum).
func (c config) ttlSeconds() int64 {
	return int64((c.ttl + time.Second - 1) / time.Second)
}

// segmentKey is where the descriptor of the segment name lives.
func (c config) segmentKey(name string) string {
	return c.prefix + "/segments/" + name
}
