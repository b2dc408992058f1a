package core

import (
	"os"
	"strings"

	"github.com/tent-dev/tent/wire"
)

// Endpointer is implemented by transports that peers reach at an address.
type Endpointer interface {
	Endpoints() []wire.Endpoint
}

// Attacher is implemented by transports that publish per-region data (a
// shareable handle, say) in the descriptor.
type Attacher interface {
	Attachments(r *Region) []wire.Attachment
}

// Descriptor returns this engine's segment descriptor: who it is, where
// it listens, and what memory peers may access.
func (e *Engine) Descriptor() (*wire.SegmentDesc, error) {
	_, d, err := e.descriptor()
	return d, err
}

// EncodedDescriptor returns the descriptor in its wire encoding.
func (e *Engine) EncodedDescriptor() ([]byte, error) {
	b, _, err := e.descriptor()
	return b, err
}

// descriptor builds the descriptor once per generation.
func (e *Engine) descriptor() ([]byte, *wire.SegmentDesc, error) {
	e.descMu.Lock()
	defer e.descMu.Unlock()
	gen := e.Generation()
	if e.descCache != nil && e.descGen == gen {
		return e.descBytes, e.descCache, nil
	}
	d := &wire.SegmentDesc{
		Name:        e.name,
		MachineID:   e.machine,
		PID:         uint32(os.Getpid()),
		Incarnation: e.incarnation,
		Generation:  gen,
		Endpoints:   []wire.Endpoint{{Transport: wire.ControlEndpoint, Addr: e.ln.addr()}},
	}
	regions := e.Regions()
	// Transports are asked inside their gates (not while uninstalling) and
	// with panics caught, like every other call into a transport.
	e.mu.Lock()
	ts := e.transports
	e.mu.Unlock()
	attach := make([][]wire.Attachment, len(regions))
	for _, in := range ts {
		if !in.gate.enter() {
			continue
		}
		_ = safeCall(in.t.Name()+" descriptor", func() error {
			if ep, ok := in.t.(Endpointer); ok {
				d.Endpoints = append(d.Endpoints, ep.Endpoints()...)
			}
			if at, ok := in.t.(Attacher); ok {
				for i, r := range regions {
					attach[i] = append(attach[i], at.Attachments(r)...)
				}
			}
			return nil
		})
		in.gate.exit()
	}
	for i, r := range regions {
		rd := wire.RegionDesc{Addr: r.Addr, Len: r.Len, Perm: wire.Perm(r.Perm), Location: r.Loc.String(),
			Attachments: attach[i]}
		if r.Alloc != nil {
			rd.AllocID = r.Alloc.ID
		}
		d.Regions = append(d.Regions, rd)
	}
	b, err := d.MarshalBinary()
	if err != nil {
		return nil, nil, err
	}
	e.descBytes, e.descCache, e.descGen = b, d, gen
	return b, d, nil
}

// readMachineID identifies this host: TENT_MACHINE_ID, else the machine
// id and boot id, else the host name.
func readMachineID() string {
	if id := os.Getenv("TENT_MACHINE_ID"); id != "" {
		return id
	}
	var parts []string
	for _, f := range []string{"/etc/machine-id", "/proc/sys/kernel/random/boot_id"} {
		if b, err := os.ReadFile(f); err == nil {
			parts = append(parts, strings.TrimSpace(string(b)))
		}
	}
	if len(parts) == 0 {
		h, _ := os.Hostname()
		return h
	}
	return strings.Join(parts, "/")
}

// MachineID identifies the engine's host, as its descriptor publishes it:
// engines with the same id share memory and can use the shm transport.
// TENT_MACHINE_ID overrides it (tests that simulate several hosts on one
// machine); it is read when the engine is created.
func (e *Engine) MachineID() string { return e.machine }
