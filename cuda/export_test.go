package cuda

// CurrentContextIsNil tells whether the calling OS thread has no current
// CUDA context (lock the goroutine to its thread around the calls).
func (d *Driver) CurrentContextIsNil() (bool, error) { return d.currentContextIsNil() }

// ResetDefault forgets the cached answer of Default.
func ResetDefault() {
	defMu.Lock()
	defDone, defRes = false, loadResult{}
	defMu.Unlock()
}
