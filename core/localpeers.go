package core

import (
	"sync"

	"github.com/tent-dev/tent/status"
)

// LocalPeers is a set of live engines that reach each other directly,
// without the network: an engine given one in Options.LocalPeers is found
// there by the others given the same one, by its name in its directory's
// scope (and by its listen address where the scope names engines by
// address). The value is the caller's: a process that wants its engines to
// find each other shares one (libtent.so holds one for all its engines);
// an engine given none gets one of its own, and reaches only itself so.
// Safe for concurrent use.
type LocalPeers struct {
	mu     sync.Mutex
	byName map[localKey]*Engine
}

type localKey struct{ scope, name string }

// NewLocalPeers returns an empty set.
func NewLocalPeers() *LocalPeers {
	return &LocalPeers{byName: map[localKey]*Engine{}}
}

// add makes e reachable by its keys. A key another live engine holds is
// refused: opening it would reach the other engine, and data meant for e
// would land there. Directories that grant names themselves (etcd) have
// refused a taken one before this (New publishes first).
func (lp *LocalPeers) add(e *Engine) error {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	keys := []localKey{{e.scope, e.name}}
	if a := e.ln.addr(); a != e.name && e.byAddress {
		keys = append(keys, localKey{e.scope, a})
	}
	for _, k := range keys {
		if other, taken := lp.byName[k]; taken && other != e {
			return status.Errorf(status.NameInUse, "engine name %q is already used by another engine of this process", k.name)
		}
	}
	for _, k := range keys {
		lp.byName[k] = e
	}
	return nil
}

// remove forgets every key of e.
func (lp *LocalPeers) remove(e *Engine) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	for k, x := range lp.byName {
		if x == e {
			delete(lp.byName, k)
		}
	}
}

// lookup returns the engine answering to name in scope, or nil.
func (lp *LocalPeers) lookup(scope, name string) *Engine {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.byName[localKey{scope, name}]
}
