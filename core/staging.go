package core

// FlagStaged: the request's GPU memory was copied through host memory (on
// this side, the target's, or both) because its transport cannot reach GPU
// memory directly.
const FlagStaged uint32 = 2

// Stager copies between host memory and GPU memory for transports that
// reach GPU memory only through host buffers (tcp). The CUDA support
// installs one from init, before any goroutine can read DeviceStager; it
// is Ready once an engine has found a driver.
type Stager interface {
	Ready() bool
	// ToHost copies len(dst) bytes of GPU memory at src into dst.
	ToHost(dst []byte, src uint64) error
	// ToDevice copies src into GPU memory at dst.
	ToDevice(dst uint64, src []byte) error
}

// DeviceStager is the process's Stager; nil without CUDA support.
var DeviceStager Stager

// CanStage reports whether GPU memory can be staged through host memory
// in this process.
func CanStage() bool {
	s := DeviceStager
	return s != nil && s.Ready()
}

// MarkStaged records that r's data went through host memory; the flag
// shows in its status.
func (r *Request) MarkStaged() { r.flags.Or(FlagStaged) }
