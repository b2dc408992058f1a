package core

import (
	"github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

// newMemoryLayer builds an engine's memory layer from Options.Memory, with
// host memory added unless a host kind was given.
func newMemoryLayer(kinds []memory.Kind) (*memory.Layer, error) {
	all := kinds
	if !hasKind(kinds, memory.HostKind) {
		all = append(kinds[:len(kinds):len(kinds)], host.New())
	}
	l, err := memory.NewLayer(all...)
	if err != nil {
		return nil, status.Errorf(status.InvalidArgument, "engine options: %v", err)
	}
	return l, nil
}

func hasKind(kinds []memory.Kind, name string) bool {
	for _, k := range kinds {
		if k != nil && k.Name() == name {
			return true
		}
	}
	return false
}

// Memory returns the engine's memory layer: the kinds of memory it can
// register, detect, allocate and stage. It is fixed when the engine is
// created; transports take it from the engine they are installed in.
func (e *Engine) Memory() *memory.Layer { return e.mem }

// memoryKind returns the engine's kind for loc, or why it has none.
func (e *Engine) memoryKind(loc Location) (memory.Kind, error) {
	if k := e.mem.Kind(loc.Kind); k != nil {
		return k, nil
	}
	why := ""
	if loc.IsCUDA() {
		why = ": no CUDA driver with a GPU when the engine was created"
	}
	return nil, status.Errorf(status.Unsupported,
		"location %q names %s memory, which this engine was created without%s", loc, loc.Kind, why)
}

// detectLocation asks the engine's memory kinds where addr lives.
func (e *Engine) detectLocation(addr uint64) (Location, error) {
	k, dev, err := e.mem.Detect(addr)
	if err != nil {
		return Location{}, err
	}
	return Location{Kind: k.Name(), Device: dev}, nil
}

// checkDevice checks that the device an explicit location names exists
// here: a GPU the engine's CUDA memory sees (UNSUPPORTED when it has none),
// a NUMA node of this machine. Whether the memory really lives there is
// the memory kinds' check (memory.Verifier), made after this one.
func (e *Engine) checkDevice(loc Location) error {
	k, err := e.memoryKind(loc)
	if err != nil {
		return err
	}
	if err := k.CheckDevice(loc.Device); err != nil {
		return status.Errorf(status.CodeOf(err), "location %q: %w", loc, err)
	}
	return nil
}
