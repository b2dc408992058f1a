package core

// CheckIndex exposes the index invariant check to the external tests.
func (e *Engine) CheckIndex() error { return e.checkIndex() }

// Users exposes how many transfers hold the region right now, so that
// external tests can wait for a peer's copy to be inside it.
func (r *Region) Users() int64 { return r.users.Load() }

// RequestAt is request i of the batch, for tests that check which
// Request values a batch was given (reuse after ReleaseBatch).
func (b *Batch) RequestAt(i int) *Request { return &b.reqs[i] }

// CallsInProgress is how many calls of the caller's (Status, Wait,
// Cancel) are inside the batch now.
func (b *Batch) CallsInProgress() int64 { return b.uses.Load() / useOne }

// LockEngine takes the engine's lock until the returned func is called, so
// that a test can stop a completion inside batchSettled.
func (e *Engine) LockEngine() (unlock func()) { e.mu.Lock(); return e.mu.Unlock }

// ReleaseOnly is ReleaseBatch without the engine's lock (which a test may
// be holding): the batch is released and recycled if nothing reaches it.
func (b *Batch) ReleaseOnly() { b.release() }

// Recycled says whether the batch's requests went back to the slabs.
func (b *Batch) Recycled() bool { return b.uses.Load()&batchRecycled != 0 }

// OnAcquired runs f(i) in Submit right after request i took its local
// region from the index (nil: no longer).
func (e *Engine) OnAcquired(f func(i int)) {
	if f == nil {
		e.acquiredHook.Store(nil)
		return
	}
	e.acquiredHook.Store(&f)
}

// StartClosing marks r as an unregister does when it starts (new uses
// refused), without waiting for its users; StopClosing undoes it.
func (r *Region) StartClosing() { r.closing.Store(true) }
func (r *Region) StopClosing()  { r.closing.Store(false) }

// DeadlineTimer is the batch's deadline timer, for tests that check it
// goes on to a later batch with the requests.
func (b *Batch) DeadlineTimer() any { return b.timer }
