package rdma

import (
	"errors"
	"fmt"

	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// The transport reaches the NICs through these interfaces. Tests
// substitute an in-process fabric (fabric_test.go) with faults switched
// on at an exact step; a verbs binding implements them for real NICs.
type (
	devLibrary interface {
		Devices() ([]device, error)
		OpenDevice(name string) (devContext, error)
		Close() error
	}
	devContext interface {
		QueryPort(port uint8) (portAttr, error)
		QueryGID(port uint8, index int) (gid, error)
		AllocPD() (devPD, error)
		CreateCQ(entries int) (devCQ, error)
		Close() error
	}
	devPD interface {
		RegMR(addr uintptr, length uint64, acc access) (devMR, error)
		CreateRCQP(cq devCQ, caps qpCaps) (devQP, error)
		Dealloc() error
	}
	devMR interface {
		LKey() uint32
		RKey() uint32
		Dereg() error
	}
	devCQ interface {
		Poll(out []completion) (int, error)
		Destroy() error
	}
	devQP interface {
		Num() uint32
		SetSourceGIDIndex(i uint8)
		ToInit(port uint8, acc access) error
		ToRTR(remote qpAddr, pathMTU mtu) error
		ToRTS(psn uint32) error
		ToError() error
		PostSend(wrs []sendWR) error
		Destroy() error
	}
)

// errNoContexts is why the transport is unavailable while package verbs
// only lists devices: it cannot open one yet.
var errNoContexts = errors.New("the verbs binding in this build lists devices but cannot open them (no queue pairs yet)")

// openVerbs opens libibverbs at path through package verbs.
func openVerbs(path string) (devLibrary, error) {
	l, err := verbs.Open(path)
	if err != nil {
		return nil, err
	}
	return verbsLibrary{l}, nil
}

type verbsLibrary struct{ l *verbs.Library }

func (v verbsLibrary) Devices() ([]device, error) {
	devs, err := v.l.Devices()
	if err != nil {
		return nil, err
	}
	out := make([]device, len(devs))
	for i, d := range devs {
		out[i] = device{Name: d.Name, NUMANode: d.NUMANode, PCIAddress: d.PCIAddress}
	}
	return out, nil
}

func (v verbsLibrary) OpenDevice(name string) (devContext, error) {
	return nil, fmt.Errorf("%s: %w", name, errNoContexts)
}

func (v verbsLibrary) Close() error {
	return v.l.Close()
}
