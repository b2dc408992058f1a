// Package cuda is GPU memory as a memory kind ("cuda"), on a CUDA driver
// (package cuda at the top of the module, the driver loaded with dlopen).
//
// Detection asks cuPointerGetAttributes: device memory is "cuda:N"; host
// memory, pinned or not, and managed memory (which the host can touch)
// are left to host memory. Alloc is cuMemCreate requesting POSIX fd
// handles (plus FABRIC when the driver and the device support it; if the
// node is not in an NVLink fabric that allocation fails and fds alone are
// used), rounded up to the granularity, reserved, mapped and made
// accessible to the device; freeing releases it in the order unmap,
// release handle, free reservation. The allocation's Detail is an
// *Allocation, which the cuda transport exports to peers. CopyOut and
// CopyIn are synchronous driver copies, the staging the tcp transport
// uses for GPU memory.
//
// A Memory is made from a loaded driver (New), or from the process's
// default driver (Open: $TENT_CUDA_DRIVER, else libcuda.so.1); without a
// driver there is no Memory, and an engine created without one has no GPU
// memory at all.
package cuda
