package p2p

import (
	"time"

	"github.com/tent-dev/tent/internal/netaddr"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Scheme is the metadata URL of this directory ("p2p", the default).
const Scheme = "p2p"

// Directory is the p2p directory of one engine. It holds no state.
type Directory struct{}

// New returns a p2p directory.
func New() *Directory { return &Directory{} }

// Resolve answers where the segment named name listens: name itself,
// which must be a dialable "host:port".
func (*Directory) Resolve(name string, _ time.Time) (*wire.SegmentDesc, error) {
	if err := netaddr.CheckDial(name); err != nil {
		return nil, status.Errorf(status.InvalidArgument,
			"segment name %q: with p2p metadata a segment is named by its engine's \"host:port\": %v", name, err)
	}
	return &wire.SegmentDesc{Name: name, Endpoints: []wire.Endpoint{{Transport: wire.ControlEndpoint, Addr: name}}}, nil
}

// Scope is the namespace of p2p names: one per process, in which engines
// answer to their names and to their listen addresses.
func (*Directory) Scope() (scope string, byAddress bool) { return Scheme, true }

// Close has nothing to release.
func (*Directory) Close() error { return nil }
