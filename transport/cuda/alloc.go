package cuda

import (
	"github.com/tent-dev/tent/core"
	cu "github.com/tent-dev/tent/cuda"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/status"
)

// driverOf returns the CUDA driver of the engine's GPU memory: the
// transport moves exactly the GPU memory its engine has, so an engine
// created without GPU memory gets an inert transport.
func driverOf(e *core.Engine) (*cu.Driver, error) {
	switch k := e.Memory().Kind(cumem.Kind).(type) {
	case *cumem.Memory:
		return k.Driver(), nil
	case nil:
		return nil, status.Errorf(status.Unsupported,
			"no CUDA driver: the engine was created without GPU memory (no %q memory kind)", cumem.Kind)
	default:
		return nil, status.Errorf(status.Unsupported,
			"the engine's %q memory (%T) is not on a CUDA driver", cumem.Kind, k)
	}
}

// lookupAlloc returns the GPU allocation behind a, or nil when a is not
// one of the engine's GPU allocations.
func lookupAlloc(a *core.Allocation) *allocRec {
	if a == nil {
		return nil
	}
	rec, _ := a.Detail.(*allocRec)
	return rec
}

// allocRec is the memory kind's record of a GPU allocation: its mapping,
// and whether it can be exported as a fabric handle.
type allocRec = cumem.Allocation
