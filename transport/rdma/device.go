package rdma

import (
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
		// RegDmabufMR registers length bytes at offset of the dmabuf fd,
		// addressed as iova in work requests.
		RegDmabufMR(offset, length uint64, iova uint64, fd int, acc access) (devMR, error)
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
	c, err := v.l.OpenDevice(name)
	if err != nil {
		return nil, err
	}
	return verbsContext{c}, nil
}

func (v verbsLibrary) Close() error { return v.l.Close() }

type verbsContext struct{ c *verbs.Context }

func (v verbsContext) QueryPort(port uint8) (portAttr, error) {
	a, err := v.c.QueryPort(port)
	return portAttr{ActiveMTU: a.ActiveMTU, LID: a.LID}, err
}

func (v verbsContext) QueryGID(port uint8, index int) (gid, error) {
	g, err := v.c.QueryGID(port, index)
	return gid(g), err
}

func (v verbsContext) AllocPD() (devPD, error) {
	pd, err := v.c.AllocPD()
	if err != nil {
		return nil, err
	}
	return verbsPD{pd}, nil
}

func (v verbsContext) CreateCQ(entries int) (devCQ, error) {
	cq, err := v.c.CreateCQ(entries)
	if err != nil {
		return nil, err
	}
	return &verbsCQ{cq: cq}, nil
}

func (v verbsContext) Close() error { return v.c.Close() }

type verbsPD struct{ pd *verbs.PD }

func (v verbsPD) RegMR(addr uintptr, length uint64, acc access) (devMR, error) {
	mr, err := v.pd.RegMR(addr, length, acc)
	if err != nil {
		return nil, err
	}
	return mr, nil
}

func (v verbsPD) RegDmabufMR(offset, length uint64, iova uint64, fd int, acc access) (devMR, error) {
	mr, err := v.pd.RegDmabufMR(offset, length, iova, fd, acc)
	if err != nil {
		return nil, err
	}
	return mr, nil
}

func (v verbsPD) CreateRCQP(cq devCQ, caps qpCaps) (devQP, error) {
	vcq, ok := cq.(*verbsCQ)
	if !ok {
		return nil, fmt.Errorf("rdma: a CQ of another library (%T)", cq)
	}
	qp, err := v.pd.CreateRCQP(vcq.cq, vcq.cq, verbs.QPCaps(caps))
	if err != nil {
		return nil, err
	}
	return &verbsQP{qp: qp}, nil
}

func (v verbsPD) Dealloc() error { return v.pd.Dealloc() }

// verbsCQ converts completions; one poller per NIC calls Poll.
type verbsCQ struct {
	cq  *verbs.CQ
	buf []verbs.Completion
}

func (v *verbsCQ) Poll(out []completion) (int, error) {
	if len(v.buf) < len(out) {
		v.buf = make([]verbs.Completion, len(out))
	}
	n, err := v.cq.Poll(v.buf[:len(out)])
	for i := range n {
		c := v.buf[i]
		out[i] = completion{ID: c.ID, Status: c.Status, Op: c.Op, Bytes: c.Bytes, QPN: c.QPN}
	}
	return n, err
}

func (v *verbsCQ) Destroy() error { return v.cq.Destroy() }

// verbsQP converts work requests; posts are serialized by the NIC's lock.
type verbsQP struct {
	qp  *verbs.QP
	buf []verbs.SendWR
}

func (v *verbsQP) Num() uint32               { return v.qp.Num() }
func (v *verbsQP) SetSourceGIDIndex(i uint8) { v.qp.SetSourceGIDIndex(i) }
func (v *verbsQP) ToInit(port uint8, acc access) error {
	return v.qp.ToInit(port, acc)
}
func (v *verbsQP) ToRTR(r qpAddr, m mtu) error {
	return v.qp.ToRTR(verbs.QPAddr{QPN: r.QPN, PSN: r.PSN, LID: r.LID, GID: r.GID, Port: r.Port}, m)
}
func (v *verbsQP) ToRTS(psn uint32) error { return v.qp.ToRTS(psn) }
func (v *verbsQP) ToError() error         { return v.qp.ToError() }
func (v *verbsQP) Destroy() error         { return v.qp.Destroy() }
func (v *verbsQP) PostSend(wrs []sendWR) error {
	v.buf = v.buf[:0]
	for _, w := range wrs {
		v.buf = append(v.buf, verbs.SendWR{ID: w.ID, Op: w.Op, LocalAddr: w.LocalAddr, Length: w.Length,
			LKey: w.LKey, RemoteAddr: w.RemoteAddr, RKey: w.RKey, Signaled: w.Signaled})
	}
	return v.qp.PostSend(v.buf)
}
