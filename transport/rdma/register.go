package rdma

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// registration is one region's memory regions, one per NIC (index = NIC),
// and how they were made.
type registration struct {
	mrs  []devMR
	path regPath
}

// regPath is how a region's memory was registered with the NICs.
type regPath int

const (
	pathHost    regPath = iota // ibv_reg_mr on host memory
	pathDMABuf                 // GPU memory: ibv_reg_dmabuf_mr on the CUDA driver's dmabuf fd
	pathPeerMem                // GPU memory: ibv_reg_mr on the device pointer (nvidia-peermem)
)

func (p regPath) String() string {
	return [...]string{"host", "dmabuf", "peermem"}[p]
}

// accessFor is the access a region's MRs get: local write always (an RDMA
// READ lands in local memory), and remote read or write exactly as the
// region permits peers. A read-only region's MRs have no remote write, so
// the NIC itself refuses a peer's write to it.
func accessFor(p core.Perm) access {
	a := accessLocalWrite
	if p&core.PermRemoteRead != 0 {
		a |= accessRemoteRead
	}
	if p&core.PermRemoteWrite != 0 {
		a |= accessRemoteWrite
	}
	return a
}

// RegisterMemory registers each region on every NIC. All or nothing: if a
// registration fails on NIC k (or panics), the MRs already made for the
// batch, NICs 0..k-1 of this region included, are deregistered before it
// returns, and the engine releases its reservation. GPU memory is tried
// as a dmabuf, then as a device pointer (registerGPU); memory that no path
// registers is left to the other transports (tcp stages it), not an error.
func (t *Transport) RegisterMemory(regions []*core.Region) (err error) {
	if t.why != "" {
		return nil
	}
	made := map[*core.Region]*registration{}
	committed := false
	defer func() {
		// Runs on an error and while a panic unwinds (core recovers it):
		// either way no MR of the batch may outlive the call.
		if !committed {
			for _, reg := range made {
				_ = reg.dereg()
			}
		}
	}()
	for _, r := range regions {
		reg := &registration{}
		made[r] = reg
		if r.Loc.IsCUDA() {
			if !t.registerGPU(r, reg) {
				delete(made, r)
			}
			continue
		}
		if err := t.regAll(r, reg, t.regMR); err != nil {
			return err
		}
	}
	t.mu.Lock()
	for r, reg := range made {
		t.regs[r] = reg
	}
	t.mu.Unlock()
	t.mrs.Add(int64(len(made) * len(t.nics)))
	committed = true
	return nil
}

// registerGPU registers GPU memory on every NIC by the first path that
// works on all of them: a dmabuf from the engine's GPU memory kind
// (ibv_reg_dmabuf_mr; needs CUDA 11.7+, a kernel and NIC with dmabuf
// support), else ibv_reg_mr on the device pointer (needs nvidia-peermem).
// A path that fails on some NIC is undone before the next is tried; false
// when none works, with nothing left registered.
func (t *Transport) registerGPU(r *core.Region, reg *registration) bool {
	var why []string
	if exp, ok := t.e.Memory().Kind(r.Loc.Kind).(memory.DMABufExporter); ok {
		err := t.regDMABuf(r, reg, exp)
		if err == nil {
			reg.path = pathDMABuf
			return true
		}
		why = append(why, "dmabuf: "+err.Error())
	} else {
		why = append(why, "dmabuf: the engine's "+r.Loc.Kind+" memory cannot export one")
	}
	err := t.regAll(r, reg, t.regMR)
	if err == nil {
		reg.path = pathPeerMem
		return true
	}
	why = append(why, "device pointer: "+err.Error())
	t.e.Logger().Debug("rdma: GPU memory not registered with the NICs; other transports serve it",
		"region", fmt.Sprintf("[%#x, %#x)", r.Addr, r.End()), "location", r.Loc.String(), "why", strings.Join(why, "; "))
	return false
}

// regDMABuf registers r on every NIC from one dmabuf of r's memory; the fd
// is closed once the MRs hold the dmabuf. On error no MR is left.
func (t *Transport) regDMABuf(r *core.Region, reg *registration, exp memory.DMABufExporter) error {
	fd, off, err := exp.DMABuf(r.Addr, r.Len)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	return t.regAll(r, reg, func(n *nic, r *core.Region) (devMR, error) {
		return n.pd.RegDmabufMR(off, r.Len, r.Addr, fd, accessFor(r.Perm))
	})
}

// regAll makes one MR per NIC with reg1, each behind the test hook that
// lets a test panic in the middle of a batch. On error the region's MRs
// made so far are deregistered (a panic leaves them to the batch's
// rollback).
func (t *Transport) regAll(r *core.Region, reg *registration, reg1 func(*nic, *core.Region) (devMR, error)) error {
	for _, n := range t.nics {
		if t.opts.beforeRegMR != nil {
			t.opts.beforeRegMR(n.idx)
		}
		mr, err := reg1(n, r)
		if err != nil {
			_ = reg.dereg()
			return status.Errorf(status.TransportError, "rdma: registering [%#x, %#x) on %s: %v",
				r.Addr, r.End(), n.info.Name, err)
		}
		reg.mrs = append(reg.mrs, mr)
	}
	return nil
}

// regMR is one ibv_reg_mr of r's memory.
func (t *Transport) regMR(n *nic, r *core.Region) (devMR, error) {
	return n.pd.RegMR(uintptr(r.Addr), r.Len, accessFor(r.Perm))
}

func (reg *registration) dereg() error {
	var errs []error
	for _, mr := range reg.mrs {
		errs = append(errs, mr.Dereg())
	}
	reg.mrs = nil
	return errors.Join(errs...)
}

// UnregisterMemory deregisters each region's MRs on every NIC before it
// returns: from then on its rkeys are dead at the NIC, whatever a peer
// still holds. The engine calls it once no local transfer uses the regions.
func (t *Transport) UnregisterMemory(regions []*core.Region) error {
	var errs []error
	for _, r := range regions {
		t.mu.Lock()
		reg := t.regs[r]
		delete(t.regs, r)
		t.mu.Unlock()
		if reg == nil {
			continue
		}
		t.mrs.Add(-int64(len(reg.mrs)))
		if err := reg.dereg(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lkeys returns the local keys of r's MRs, or nil when r is not
// registered with the transport.
func (t *Transport) lkeys(r *core.Region) []uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	reg := t.regs[r]
	if reg == nil {
		return nil
	}
	out := make([]uint32, len(reg.mrs))
	for i, mr := range reg.mrs {
		out[i] = mr.LKey()
	}
	return out
}

// Attachments publishes, for a region peers may access, its rkey on each
// NIC and which NICs are near its memory. Nothing is published for a
// region with no remote permission. The descriptor goes only to
// authenticated peers, and an rkey is usable only over a queue pair this
// engine connected for one (conn.go).
func (t *Transport) Attachments(r *core.Region) []wire.Attachment {
	if r.Perm&(core.PermRemoteRead|core.PermRemoteWrite) == 0 {
		return nil
	}
	t.mu.Lock()
	reg := t.regs[r]
	var rkeys []uint32
	if reg != nil {
		for _, mr := range reg.mrs {
			rkeys = append(rkeys, mr.RKey())
		}
	}
	t.mu.Unlock()
	if rkeys == nil {
		return nil
	}
	near := map[int]bool{}
	for _, i := range nicsFor(t.infos(), numaOf(r.Loc)) {
		near[i] = true
	}
	keys := make([]remoteKey, len(rkeys))
	for i, k := range rkeys {
		keys[i] = remoteKey{NIC: uint8(i), RKey: k, Near: near[i]}
	}
	return []wire.Attachment{{Transport: Name, Data: encodeKeys(keys)}}
}

func (t *Transport) infos() []nicInfo {
	out := make([]nicInfo, len(t.nics))
	for i, n := range t.nics {
		out[i] = n.info
	}
	return out
}

// remoteKey is one NIC's rkey for a region, as a peer publishes it.
type remoteKey struct {
	NIC  uint8
	RKey uint32
	Near bool // the NIC is near the region's memory: prefer it
}

// maxNICs bounds the NICs one engine uses and a peer may list.
const maxNICs = 64

func encodeKeys(keys []remoteKey) []byte {
	enc := wire.NewEncoder(nil)
	enc.U8(uint8(len(keys)))
	for _, k := range keys {
		enc.U8(k.NIC)
		enc.U32(k.RKey)
		near := uint8(0)
		if k.Near {
			near = 1
		}
		enc.U8(near)
	}
	return enc.Out()
}

// decodeKeys parses a peer's attachment; anything malformed is an error,
// never a guess.
func decodeKeys(b []byte) ([]remoteKey, error) {
	d := wire.NewDecoder(b)
	n := int(d.U8())
	if n == 0 || n > maxNICs {
		return nil, fmt.Errorf("rdma attachment lists %d NICs", n)
	}
	keys := make([]remoteKey, n)
	for i := range keys {
		keys[i] = remoteKey{NIC: d.U8(), RKey: d.U32(), Near: d.U8() == 1}
		if int(keys[i].NIC) >= maxNICs {
			return nil, fmt.Errorf("rdma attachment names NIC %d", keys[i].NIC)
		}
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	return keys, nil
}

// remoteKeys finds the rdma attachment of a peer's region.
func remoteKeys(rd *wire.RegionDesc) ([]remoteKey, error) {
	for _, a := range rd.Attachments {
		if a.Transport == Name {
			return decodeKeys(a.Data)
		}
	}
	return nil, errors.New("region has no rdma keys")
}
