package core

// Allocation is memory the engine allocated itself (tent_alloc), which it can
// share with peers: a memfd for host memory, an exportable CUDA allocation
// for GPU memory.
type Allocation struct {
	ID   uint64 // unique within the engine, never reused
	FD   int    // memfd backing host memory, or -1
	Size uint64 // bytes mapped (the request rounded up)

	free func() error
}
