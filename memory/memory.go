package memory

import (
	"fmt"
	"slices"
)

// HostKind is the name of host memory's kind, the location kind "cpu".
const HostKind = "cpu"

// Kind is one kind of memory. Its methods are safe for concurrent use, and
// one Kind may serve several engines.
type Kind interface {
	// Name is the location kind memory of this kind is registered under
	// ("cpu", "cuda").
	Name() string
	// CheckDevice reports whether device dev of this kind exists here
	// (a status error saying why not). dev is -1 for no particular device.
	CheckDevice(dev int) error
	// Detect reports whether addr is memory of this kind (ok) and on which
	// device (-1 for none in particular). An error means the kind cannot
	// tell.
	Detect(addr uint64) (dev int, ok bool, err error)
	// Alloc allocates at least size bytes on device dev.
	Alloc(size uint64, dev int) (*Allocation, error)
	// CopyOut copies len(dst) bytes of this kind's memory at src into dst,
	// host memory. A fault on either side is an error, never a crash.
	CopyOut(dst []byte, src uint64) error
	// CopyIn copies src, host memory, into this kind's memory at dst.
	CopyIn(dst uint64, src []byte) error
}

// Verifier is implemented by kinds that can tell whether memory given an
// explicit location really lives there. Memory of one kind registered as
// another would make a transport touch it the wrong way (a socket reading
// into GPU memory as if it were host memory), so registration asks every
// such kind.
type Verifier interface {
	// Verify checks that [addr, addr+n) may be registered at the location
	// of kind kind (any kind, not only the verifier's) on device dev. A
	// kind that cannot tell trusts the caller.
	Verify(addr, n uint64, kind string, dev int) error
}

// DMABufExporter is implemented by kinds whose memory a device (an RDMA
// NIC) can import as a dmabuf: GPU memory, through the CUDA driver's
// cuMemGetHandleForAddressRange.
type DMABufExporter interface {
	// DMABuf exports a range covering [addr, addr+n) as a dmabuf: fd, which
	// the caller closes, and offset, where addr lies in it. An error says
	// why not (UNSUPPORTED: the driver cannot).
	DMABuf(addr, n uint64) (fd int, offset uint64, err error)
}

// Allocation is memory a Kind allocated.
type Allocation struct {
	Addr uint64
	Size uint64 // bytes mapped: the requested size rounded up
	FD   int    // a descriptor same-host peers may map (a memfd), or -1
	// Free releases the memory. It is called exactly once.
	Free func() error
	// Detail is the kind's own record of the allocation (for GPU memory,
	// the *cuda.Allocation of package memory/cuda, which the cuda
	// transport exports); nil when there is none.
	Detail any
}

// Layer is the set of memory kinds of one engine. It is immutable.
type Layer struct {
	kinds []Kind // host last: it claims whatever the others do not
}

// NewLayer gathers kinds, which must include the host kind and must not
// name a kind twice.
func NewLayer(kinds ...Kind) (*Layer, error) {
	l := &Layer{}
	var host Kind
	for _, k := range kinds {
		switch {
		case k == nil:
			return nil, fmt.Errorf("memory: nil kind")
		case k.Name() == HostKind:
			if host != nil {
				return nil, fmt.Errorf("memory: kind %q given twice", HostKind)
			}
			host = k
		case l.Kind(k.Name()) != nil:
			return nil, fmt.Errorf("memory: kind %q given twice", k.Name())
		default:
			l.kinds = append(l.kinds, k)
		}
	}
	if host == nil {
		return nil, fmt.Errorf("memory: no host memory kind (%q)", HostKind)
	}
	l.kinds = append(l.kinds, host)
	return l, nil
}

// Kind returns the kind called name, or nil when the layer has none.
func (l *Layer) Kind(name string) Kind {
	for _, k := range l.kinds {
		if k.Name() == name {
			return k
		}
	}
	return nil
}

// Host returns the host memory kind.
func (l *Layer) Host() Kind { return l.kinds[len(l.kinds)-1] }

// Names lists the layer's kinds, host last.
func (l *Layer) Names() []string {
	out := make([]string, len(l.kinds))
	for i, k := range l.kinds {
		out[i] = k.Name()
	}
	return out
}

// Detect finds the kind addr belongs to: the first kind other than host
// that claims it, else host memory. An error of a kind that cannot tell is
// returned with that kind.
func (l *Layer) Detect(addr uint64) (k Kind, dev int, err error) {
	for _, k := range l.kinds[:len(l.kinds)-1] {
		dev, ok, err := k.Detect(addr)
		if err != nil {
			return k, -1, err
		}
		if ok {
			return k, dev, nil
		}
	}
	return l.Host(), -1, nil
}

// Verify asks every kind that is a Verifier whether [addr, addr+n) may be
// registered at location kind, device dev.
func (l *Layer) Verify(addr, n uint64, kind string, dev int) error {
	for _, k := range l.kinds {
		if v, ok := k.(Verifier); ok {
			if err := v.Verify(addr, n, kind, dev); err != nil {
				return err
			}
		}
	}
	return nil
}

// Has reports whether the layer has a kind called name.
func (l *Layer) Has(name string) bool { return slices.Contains(l.Names(), name) }
