// Package gpuaccess lets peertest peers fill and sum buffers in GPU memory
// through the process's CUDA driver (the real one or the test fake), for
// the test binaries that start peers with GPU buffers.
package gpuaccess
