package coretest

import (
	"fmt"
	"sync"

	"github.com/tent-dev/tent/core"
	"github.com/tent-dev/tent/status"
)

// Methods of the fake that faults can target.
const (
	MethodInstall    = "install"
	MethodRegister   = "register"
	MethodUnregister = "unregister"
	MethodUninstall  = "uninstall"
)

type faultKind int

const (
	kindFail faultKind = iota
	kindPanic
	kindBlock
)

type fault struct {
	nth   int
	kind  faultKind
	err   error
	block *Block
}

// Block is a call held inside the fake until Release.
type Block struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// Entered is closed when the blocked call has started.
func (b *Block) Entered() <-chan struct{} { return b.entered }

// Release lets the blocked call continue. Safe to call more than once.
func (b *Block) Release() { b.once.Do(func() { close(b.release) }) }

// Fake is a transport that records what it is told and misbehaves on demand.
type Fake struct {
	name string

	mu          sync.Mutex
	calls       map[string]int
	faults      map[string][]fault
	registered  map[*core.Region]bool
	uninstalled bool
	errs        []string
}

// NewFake returns a fake transport called name.
func NewFake(name string) *Fake {
	return &Fake{name: name, calls: map[string]int{}, faults: map[string][]fault{}, registered: map[*core.Region]bool{}}
}

// FailAt makes the nth call (1-based, counted from the start) of method
// return err.
func (f *Fake) FailAt(method string, nth int, err error) {
	f.add(method, fault{nth: nth, kind: kindFail, err: err})
}

// PanicAt makes the nth call of method panic.
func (f *Fake) PanicAt(method string, nth int) {
	f.add(method, fault{nth: nth, kind: kindPanic})
}

// BlockAt makes the nth call of method wait for Release.
func (f *Fake) BlockAt(method string, nth int) *Block {
	b := &Block{entered: make(chan struct{}), release: make(chan struct{})}
	f.add(method, fault{nth: nth, kind: kindBlock, block: b})
	return b
}

func (f *Fake) add(method string, ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[method] = append(f.faults[method], ft)
}

// Calls returns how often method has been called.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Registered returns how many regions the fake currently holds.
func (f *Fake) Registered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.registered)
}

// Misuse lists protocol violations the engine committed against the fake
// (double registration, unregistering unknown memory, calls after
// uninstall). Tests require it to be empty.
func (f *Fake) Misuse() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.errs...)
}

// enter counts the call and applies its fault, if any.
func (f *Fake) enter(method string) error {
	f.mu.Lock()
	f.calls[method]++
	n := f.calls[method]
	if f.uninstalled && method != MethodUninstall {
		f.errs = append(f.errs, fmt.Sprintf("%s called after uninstall", method))
	}
	var hit *fault
	for i := range f.faults[method] {
		if f.faults[method][i].nth == n {
			hit = &f.faults[method][i]
		}
	}
	f.mu.Unlock()
	if hit == nil {
		return nil
	}
	switch hit.kind {
	case kindPanic:
		panic(fmt.Sprintf("fake %s: injected panic in %s call %d", f.name, method, n))
	case kindBlock:
		close(hit.block.entered)
		<-hit.block.release
		return nil
	default:
		return hit.err
	}
}

func (f *Fake) Name() string { return f.name }

func (f *Fake) Install(*core.Engine) error { return f.enter(MethodInstall) }

func (f *Fake) RegisterMemory(regions []*core.Region) error {
	if err := f.enter(MethodRegister); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range regions {
		if f.registered[r] {
			f.errs = append(f.errs, fmt.Sprintf("region %#x registered twice", r.Addr))
		}
		f.registered[r] = true
	}
	return nil
}

func (f *Fake) UnregisterMemory(regions []*core.Region) error {
	if err := f.enter(MethodUnregister); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range regions {
		if !f.registered[r] {
			f.errs = append(f.errs, fmt.Sprintf("region %#x unregistered but not registered", r.Addr))
		}
		delete(f.registered, r)
	}
	return nil
}

func (f *Fake) Uninstall() error {
	err := f.enter(MethodUninstall)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.uninstalled {
		f.errs = append(f.errs, "uninstalled twice")
	}
	f.uninstalled = true
	f.registered = map[*core.Region]bool{}
	return err
}

func (f *Fake) Stats() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return map[string]int64{"regions": int64(len(f.registered))}
}

// ErrInjected is the error tests usually inject.
var ErrInjected = status.Errorf(status.TransportError, "injected failure")
