package rdma

import (
	"errors"
	"fmt"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
	"github.com/tent-dev/tent/wire"
)

// registration is one region's memory regions, one per NIC (index = NIC).
type registration struct {
	mrs []devMR
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

// servable reports whether the transport registers r: host memory only
// (GPU memory needs dmabuf or peer-memory registration, not built yet;
// tcp staging serves it).
func servable(r *core.Region) bool { return !r.Loc.IsCUDA() }

// RegisterMemory registers each region on every NIC. All or nothing: if a
// registration fails on NIC k (or panics), the MRs already made for the
// batch, NICs 0..k-1 of this region included, are deregistered before it
// returns, and the engine releases its reservation.
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
		if !servable(r) {
			continue
		}
		reg := &registration{}
		made[r] = reg
		for _, n := range t.nics {
			mr, err := t.regMR(n, r)
			if err != nil {
				return status.Errorf(status.TransportError, "rdma: registering [%#x, %#x) on %s: %v",
					r.Addr, r.End(), n.info.Name, err)
			}
			reg.mrs = append(reg.mrs, mr)
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

// regMR is one ibv_reg_mr, behind the test hook that lets a test panic in
// the middle of a batch.
func (t *Transport) regMR(n *nic, r *core.Region) (devMR, error) {
	if t.opts.beforeRegMR != nil {
		t.opts.beforeRegMR(n.idx)
	}
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
	for _, i := range nicsFor(t.infos(), r.Loc.Device) {
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
