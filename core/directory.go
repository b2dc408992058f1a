package core

import (
	"time"

	"github.com/tent-dev/tent/metadata/p2p"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// Directory maps segment names to where their engines are: metadata/p2p
// (the default: a name is its engine's "host:port") or metadata/etcd (a
// name is a key in etcd). Core asks the engine found there for its
// current descriptor over a control link in either case, so a directory
// only has to lead to the right engine; the target checks every request
// itself.
type Directory interface {
	// Resolve returns the descriptor known under name. It holds at least
	// the engine's control endpoint (wire.ControlEndpoint); a directory
	// that cannot tell where name leads refuses it.
	Resolve(name string, deadline time.Time) (*wire.SegmentDesc, error)
	// Scope names the namespace of the directory's names. Engines of this
	// process with one scope reach each other by name directly, without
	// the network, and two of them cannot answer to one name; byAddress
	// says an engine also answers to its listen address there.
	Scope() (scope string, byAddress bool)
	// Close withdraws this engine's entry and releases the connection.
	Close() error
}

// Publisher is implemented by directories that store descriptors (etcd).
// Publish stores this engine's descriptor under its name. It is called at
// start and after every registration change (register, unregister,
// transport install or uninstall), and returns once the directory holds
// desc or a newer descriptor, so the change is visible there when the call
// that made it returns. Concurrent calls may be served by one write. A
// directory that cannot confirm within its own bound returns an error and
// keeps publishing in the background; the engine keeps the change (peers
// that reach it over its control link see it).
type Publisher interface {
	Publish(desc *wire.SegmentDesc, encoded []byte) error
}

// DirectoryStats is implemented by directories that report counters
// (publications, timeouts, ...) for Engine.Stats.
type DirectoryStats interface {
	Stats() map[string]int64
}

// DirectoryFactory opens the directory of engine e (Options.Directory),
// for example from its Options.Metadata URL. It may call e.InvalidatePeer
// when a watched descriptor changes.
type DirectoryFactory func(e *Engine) (Directory, error)

// openDirectory opens Options.Directory, or the p2p directory without
// one. Which directories exist is the caller's choice (capi maps the
// metadata URL), not a registry in core.
func openDirectory(e *Engine) (Directory, error) {
	if e.opts.Directory == nil {
		if e.opts.Metadata != p2p.Scheme {
			// Silently p2p would leave the engine unfindable by the
			// names its peers resolve in the service the URL names.
			return nil, status.Errorf(status.Unsupported,
				"metadata %q: no directory given for it (Options.Directory)", e.opts.Metadata)
		}
		return p2p.New(), nil
	}
	return e.opts.Directory(e)
}

// publish hands the current descriptor to a directory that stores it.
func (e *Engine) publish() error {
	pub, ok := e.dir.(Publisher)
	if !ok {
		return nil
	}
	b, d, err := e.descriptor()
	if err != nil {
		return err
	}
	return pub.Publish(d, b)
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
