package core

// CheckIndex exposes the index invariant check to the external tests.
func (e *Engine) CheckIndex() error { return e.checkIndex() }

// Users exposes how many transfers hold the region right now, so that
// external tests can wait for a peer's copy to be inside it.
func (r *Region) Users() int64 { return r.users.Load() }
