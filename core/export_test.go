package core

// CheckIndex exposes the index invariant check to the external tests.
func (e *Engine) CheckIndex() error { return e.checkIndex() }
