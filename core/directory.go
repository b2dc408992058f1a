package core

import (
	"strings"
	"sync"
	"time"

	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Directory is a metadata service that maps segment names to descriptors
// (etcd, for clusters). Without one (the "p2p" default) a segment name is
// its engine's address and the descriptor is asked of the engine itself.
type Directory interface {
	// Publish stores this engine's descriptor under its name. It is called
	// at start and after every registration change (register, unregister,
	// transport install or uninstall), and returns once the directory
	// holds desc or a newer descriptor, so the change is visible there when
	// the call that made it returns. Concurrent calls may be served by one
	// write. A directory that cannot confirm within its own bound returns
	// an error and keeps publishing in the background; the engine keeps
	// the change (peers that reach it over its control link see it).
	Publish(desc *wire.SegmentDesc, encoded []byte) error
	// Resolve returns the descriptor published under name.
	Resolve(name string, deadline time.Time) (*wire.SegmentDesc, error)
	// Close withdraws this engine's entry and releases the connection.
	Close() error
}

// DirectoryStats is implemented by directories that report counters
// (publications, timeouts, ...) for Engine.Stats.
type DirectoryStats interface {
	Stats() map[string]int64
}

// DirectoryFactory opens a directory for engine e from a metadata URL such
// as "etcd://127.0.0.1:2379". It may call e.InvalidatePeer when a watched
// descriptor changes.
type DirectoryFactory func(url string, e *Engine) (Directory, error)

var (
	dirMu        sync.Mutex
	dirFactories = map[string]DirectoryFactory{}
)

// RegisterDirectory makes a metadata backend available under a URL scheme.
func RegisterDirectory(scheme string, f DirectoryFactory) {
	dirMu.Lock()
	defer dirMu.Unlock()
	dirFactories[scheme] = f
}

func openDirectory(url string, e *Engine) (Directory, error) {
	scheme, _, ok := strings.Cut(url, "://")
	if !ok {
		return nil, status.Errorf(status.InvalidArgument, "metadata %q: want \"p2p\" or \"scheme://...\"", url)
	}
	dirMu.Lock()
	f := dirFactories[scheme]
	dirMu.Unlock()
	if f == nil {
		return nil, status.Errorf(status.Unsupported, "metadata backend %q is not available", scheme)
	}
	return f(url, e)
}

func (e *Engine) publish() error {
	b, d, err := e.descriptor()
	if err != nil {
		return err
	}
	return e.dir.Publish(d, b)
}

// InvalidatePeer marks the cached descriptor of the named peer stale, so
// the next transfer to it resolves it again. Directories call it from
// their watches.
func (e *Engine) InvalidatePeer(name string) {
	e.mu.Lock()
	p := e.peers[name]
	e.mu.Unlock()
	if p != nil {
		p.invalidate()
	}
}
