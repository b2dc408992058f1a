package rdma

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// fabric is an in-process stand-in for verbs NICs, shared by the engines
// of one test: MRs with keys, ranges and access flags, RC queue pairs
// connected by number, one-sided operations that copy memory after the
// checks a NIC makes, completions, live-object counts, and faults a test
// turns on at an exact step.
type fabric struct {
	devices []string

	mu      sync.Mutex
	nextKey uint32
	nextQPN uint32
	mrs     map[uint32]*fabricMR
	qps     map[uint32]*fabricQP
	live    fabricCounts
	// Faults.
	failRegMR   string // device whose ibv_reg_mr fails
	failRTS     bool
	errorAfter  int  // completions before one fails (0: never)
	completions int  // completed so far
	hang        bool // posted work never completes
}

type fabricCounts struct{ Contexts, PDs, MRs, CQs, QPs int }

func newFabric(devices ...string) *fabric {
	return &fabric{devices: devices, nextKey: 0x100, nextQPN: 0x10, mrs: map[uint32]*fabricMR{}, qps: map[uint32]*fabricQP{}}
}

func (f *fabric) counts() fabricCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live
}

func (f *fabric) set(change func(f *fabric)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

// open is Options.open for transports on this fabric.
func (f *fabric) open(string) (devLibrary, error) { return fabricLib{f}, nil }

type fabricLib struct{ f *fabric }

func (l fabricLib) Devices() ([]device, error) {
	if len(l.f.devices) == 0 {
		return nil, verbs.ErrNoDevice
	}
	var out []device
	for _, d := range l.f.devices {
		out = append(out, device{Name: d, NUMANode: -1})
	}
	return out, nil
}

func (l fabricLib) OpenDevice(name string) (devContext, error) {
	l.f.set(func(f *fabric) { f.live.Contexts++ })
	return &fabricCtx{f: l.f, dev: name}, nil
}

func (l fabricLib) Close() error { return nil }

type fabricCtx struct {
	f   *fabric
	dev string
}

func (c *fabricCtx) QueryPort(uint8) (portAttr, error) {
	return portAttr{ActiveMTU: mtu4096, LID: 1}, nil
}
func (c *fabricCtx) QueryGID(uint8, int) (gid, error) { return gid{}, nil }
func (c *fabricCtx) AllocPD() (devPD, error) {
	c.f.set(func(f *fabric) { f.live.PDs++ })
	return &fabricPD{f: c.f, dev: c.dev}, nil
}
func (c *fabricCtx) CreateCQ(int) (devCQ, error) {
	c.f.set(func(f *fabric) { f.live.CQs++ })
	return &fabricCQ{f: c.f}, nil
}
func (c *fabricCtx) Close() error { c.f.set(func(f *fabric) { f.live.Contexts-- }); return nil }

type fabricPD struct {
	f   *fabric
	dev string
}

// The in-process fabric has no dmabuf support (the fake libibverbs does).
func (p *fabricPD) RegDmabufMR(uint64, uint64, uint64, int, access) (devMR, error) {
	return nil, syscall.EOPNOTSUPP
}

func (p *fabricPD) RegMR(addr uintptr, length uint64, acc access) (devMR, error) {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRegMR == p.dev {
		return nil, fmt.Errorf("verbs: ibv_reg_mr on %s: injected: %w", p.dev, errors.ErrUnsupported)
	}
	f.nextKey++
	mr := &fabricMR{f: f, key: f.nextKey, addr: uint64(addr), len: length, access: acc, dev: p.dev}
	f.mrs[mr.key] = mr
	f.live.MRs++
	return mr, nil
}

func (p *fabricPD) CreateRCQP(cq devCQ, _ qpCaps) (devQP, error) {
	f := p.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextQPN++
	qp := &fabricQP{f: f, num: f.nextQPN, cq: cq.(*fabricCQ), dev: p.dev}
	f.qps[qp.num] = qp
	f.live.QPs++
	return qp, nil
}

func (p *fabricPD) Dealloc() error { p.f.set(func(f *fabric) { f.live.PDs-- }); return nil }

type fabricMR struct {
	f        *fabric
	key      uint32
	addr     uint64
	len      uint64
	access   access
	dev      string
	deregged bool
}

func (m *fabricMR) LKey() uint32 { return m.key }
func (m *fabricMR) RKey() uint32 { return m.key }
func (m *fabricMR) Dereg() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.deregged {
		return errors.New("ibv_dereg_mr: already deregistered")
	}
	m.deregged = true
	delete(m.f.mrs, m.key)
	m.f.live.MRs--
	return nil
}

func (m *fabricMR) covers(addr uint64, n uint32) bool {
	return addr >= m.addr && uint64(n) <= m.len && addr-m.addr <= m.len-uint64(n)
}

type fabricCQ struct {
	f   *fabric
	mu  sync.Mutex
	wcs []completion
}

func (c *fabricCQ) push(wc completion) {
	c.mu.Lock()
	c.wcs = append(c.wcs, wc)
	c.mu.Unlock()
}

func (c *fabricCQ) Poll(out []completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(out, c.wcs)
	c.wcs = c.wcs[n:]
	return n, nil
}

func (c *fabricCQ) Destroy() error { c.f.set(func(f *fabric) { f.live.CQs-- }); return nil }

type qpStateFabric int

const (
	fqReset qpStateFabric = iota
	fqInit
	fqRTR
	fqRTS
	fqError
)

type fabricQP struct {
	f       *fabric
	num     uint32
	cq      *fabricCQ
	dev     string
	state   qpStateFabric
	access  access
	remote  uint32
	pending []sendWR // posted while the fabric hangs
}

func (q *fabricQP) Num() uint32             { return q.num }
func (q *fabricQP) SetSourceGIDIndex(uint8) {}
func (q *fabricQP) ToInit(_ uint8, acc access) error {
	q.f.set(func(*fabric) { q.state, q.access = fqInit, acc })
	return nil
}
func (q *fabricQP) ToRTR(remote qpAddr, _ mtu) error {
	q.f.set(func(*fabric) { q.state, q.remote = fqRTR, remote.QPN })
	return nil
}
func (q *fabricQP) ToRTS(uint32) error {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	if q.f.failRTS {
		return errors.New("verbs: ibv_modify_qp(RTS) on fake: injected")
	}
	q.state = fqRTS
	return nil
}

// ToError flushes what hangs on the queue pair, as a NIC does.
func (q *fabricQP) ToError() error {
	q.f.mu.Lock()
	q.state = fqError
	flushed := q.pending
	q.pending = nil
	q.f.mu.Unlock()
	for _, wr := range flushed {
		q.cq.push(completion{ID: wr.ID, Status: wcWRFlushError, Op: wr.Op, QPN: q.num})
	}
	return nil
}

func (q *fabricQP) Destroy() error {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	if _, ok := q.f.qps[q.num]; !ok {
		return errors.New("ibv_destroy_qp: already destroyed")
	}
	delete(q.f.qps, q.num)
	q.f.live.QPs--
	return nil
}

// PostSend runs each work request at once: the checks a NIC makes, then
// the copy. A failed access moves the queue pair (and its peer) to error.
func (q *fabricQP) PostSend(wrs []sendWR) error {
	f := q.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, wr := range wrs {
		if f.hang && q.state == fqRTS {
			q.pending = append(q.pending, wr)
			continue
		}
		st := q.execute(wr)
		if f.errorAfter > 0 && st == wcSuccess {
			if f.completions++; f.completions > f.errorAfter {
				st = wcGeneralError
				f.errorAfter = 0
			}
		}
		if st != wcSuccess && q.state == fqRTS {
			q.state = fqError
		}
		q.cq.push(completion{ID: wr.ID, Status: st, Op: wr.Op, Bytes: wr.Length, QPN: q.num})
	}
	return nil
}

func (q *fabricQP) execute(wr sendWR) wcStatus {
	f := q.f
	if q.state != fqRTS {
		return wcWRFlushError
	}
	peer := f.qps[q.remote]
	if peer == nil || peer.state != fqRTS || peer.remote != q.num {
		return wcRetryExceeded
	}
	local := f.mrs[wr.LKey]
	if local == nil || local.dev != q.dev || !local.covers(wr.LocalAddr, wr.Length) {
		return wcLocalProtError
	}
	need := accessRemoteWrite
	if wr.Op == opRead {
		need = accessRemoteRead
	}
	remote := f.mrs[wr.RKey]
	if remote == nil || remote.dev != peer.dev || !remote.covers(wr.RemoteAddr, wr.Length) ||
		remote.access&need == 0 || peer.access&need == 0 {
		peer.state = fqError
		return wcRemoteAccessError
	}
	src, dst := wr.LocalAddr, wr.RemoteAddr
	if wr.Op == opRead {
		src, dst = dst, src
	}
	copy(host.Bytes(dst, uint64(wr.Length)), host.Bytes(src, uint64(wr.Length)))
	return wcSuccess
}
