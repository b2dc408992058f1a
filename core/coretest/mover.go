package coretest

import (
	"sync"

	"github.com/tent-dev/tent/core"
)

// Mover is a fake data transport. By default it completes every request at
// once with OK (moving nothing); Hold keeps requests until ReleaseAll, and
// FailWith makes it fail them.
type Mover struct {
	*Fake

	mu       sync.Mutex
	hold     bool
	held     []*core.Request
	fail     error
	eligible func(*core.Request) bool
	canceled int
	entered  chan struct{}
}

// NewMover returns a fake mover called name.
func NewMover(name string) *Mover {
	return &Mover{Fake: NewFake(name), entered: make(chan struct{}, 1024)}
}

// Hold makes Submit keep requests instead of completing them.
func (m *Mover) Hold() { m.mu.Lock(); m.hold = true; m.mu.Unlock() }

// FailWith makes the mover fail requests with err (nil: succeed).
func (m *Mover) FailWith(err error) { m.mu.Lock(); m.fail = err; m.mu.Unlock() }

// SetEligible overrides which requests the mover accepts (default: all).
func (m *Mover) SetEligible(f func(*core.Request) bool) { m.mu.Lock(); m.eligible = f; m.mu.Unlock() }

// Entered receives one value per Submit call.
func (m *Mover) Entered() <-chan struct{} { return m.entered }

// Held returns how many requests the mover holds.
func (m *Mover) Held() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.held) }

// Canceled returns how many requests Cancel was asked to drop.
func (m *Mover) Canceled() int { m.mu.Lock(); defer m.mu.Unlock(); return m.canceled }

// ReleaseAll completes every held request with the current failure mode.
func (m *Mover) ReleaseAll() {
	m.mu.Lock()
	held, err := m.held, m.fail
	m.held = nil
	m.mu.Unlock()
	for _, r := range held {
		complete(r, err)
	}
}

func complete(r *core.Request, err error) {
	if err != nil {
		r.Done(0, err)
		return
	}
	r.Done(r.Len, nil)
}

// ForgetsRequests: the mover completes each request once (Submit, or
// ReleaseAll / Uninstall for held ones, which it then drops), so its
// engine reuses released batches' requests (core.Forgetter). A fake that
// embeds Mover inherits the promise: one that completes late or twice
// outside Submit must not embed it.
func (m *Mover) ForgetsRequests() {}

func (m *Mover) Eligible(r *core.Request) bool {
	m.mu.Lock()
	f := m.eligible
	m.mu.Unlock()
	return f == nil || f(r)
}

func (m *Mover) Submit(reqs []*core.Request) {
	m.mu.Lock()
	if m.hold {
		m.held = append(m.held, reqs...)
		m.mu.Unlock()
		m.entered <- struct{}{}
		return
	}
	err := m.fail
	m.mu.Unlock()
	m.entered <- struct{}{}
	for _, r := range reqs {
		complete(r, err)
	}
}

// Cancel counts the requests; they stay held until ReleaseAll or
// Uninstall, like a transport that cannot abort a copy in progress.
func (m *Mover) Cancel(reqs []*core.Request) {
	m.mu.Lock()
	m.canceled += len(reqs)
	m.mu.Unlock()
}

// Uninstall fails whatever is held, as a real transport must.
func (m *Mover) Uninstall() error {
	m.mu.Lock()
	held := m.held
	m.held = nil
	m.mu.Unlock()
	for _, r := range held {
		r.Done(0, core.ErrUninstalled)
	}
	return m.Fake.Uninstall()
}
