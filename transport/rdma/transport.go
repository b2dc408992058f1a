package rdma

import (
	"errors"
	"fmt"
	"os"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/transport/rdma/verbs"
)

// Transport is the rdma transport of one engine. Make it with New (or
// through Spec); the engine calls the rest.
type Transport struct {
	opts Options
	e    *core.Engine
	lib  *verbs.Library
	nics []nicInfo
	// why is the reason the transport cannot serve here (no library, no
	// device); "" once it can.
	why string
}

// New makes an rdma transport with options o; Install opens libibverbs.
func New(o Options) *Transport { return &Transport{opts: o} }

// Name is "rdma".
func (t *Transport) Name() string { return Name }

// Install opens libibverbs and its devices. A machine without either is
// not an error: the transport reports why through Unavailable and the
// engine leaves it out.
func (t *Transport) Install(e *core.Engine) error {
	t.e = e
	path := t.opts.Library
	if path == "" {
		path = verbs.LibraryPath(os.Getenv)
	}
	lib, err := verbs.Open(path)
	if err != nil {
		t.why = fmt.Sprintf("no verbs library: %v", err)
		return nil
	}
	devs, err := lib.Devices()
	switch {
	case errors.Is(err, verbs.ErrNoDevice):
		t.why = fmt.Sprintf("no RDMA device (%s lists none)", path)
	case err != nil:
		t.why = fmt.Sprintf("listing RDMA devices: %v", err)
	case len(devs) == 0:
		t.why = fmt.Sprintf("no RDMA device (%s lists none)", path)
	}
	if t.why != "" {
		lib.Close()
		return nil
	}
	t.lib = lib
	for _, name := range deviceNames(devs) {
		numa, pci := sysfsAffinity(t.opts.SysfsRoot, name)
		t.nics = append(t.nics, nicInfo{Name: name, NUMA: numa, PCI: pci})
	}
	return nil
}

// Unavailable is why the transport cannot serve on this machine, or "".
func (t *Transport) Unavailable() string { return t.why }

// RegisterMemory is a no-op until the data path registers with the NICs.
func (t *Transport) RegisterMemory([]*core.Region) error { return nil }

// UnregisterMemory is the counterpart of RegisterMemory.
func (t *Transport) UnregisterMemory([]*core.Region) error { return nil }

// Uninstall closes the library.
func (t *Transport) Uninstall() error {
	if t.lib != nil {
		t.lib.Close()
		t.lib = nil
	}
	return nil
}

// Stats reports the NICs opened.
func (t *Transport) Stats() map[string]int64 {
	return map[string]int64{"nics": int64(len(t.nics))}
}
