//go:build unix

package slab

import (
	"errors"
	"syscall"

	"github.com/tent-dev/tent/status"
)

// mapChunk maps size bytes read-write: private anonymous memory when fd is
// negative, else shared from fd at off so other mappers of the file see it.
func mapChunk(size, fd int, off int64) ([]byte, error) {
	const prot = syscall.PROT_READ | syscall.PROT_WRITE
	if fd < 0 {
		return syscall.Mmap(-1, 0, size, prot, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	}
	return syscall.Mmap(fd, off, size, prot, syscall.MAP_SHARED)
}

func unmapChunk(mem []byte) error { return syscall.Munmap(mem) }

// dupFile duplicates fd close-on-exec, under ForkLock so a concurrent
// fork+exec cannot inherit it in between.
func dupFile(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(nfd)
	return nfd, nil
}

func closeFile(fd int) error { return syscall.Close(fd) }

// fileSize returns the size of fd and whether it is a regular file (for
// which mapping past the end is an error); other kinds report size 0.
func fileSize(fd int) (int64, bool, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, false, err
	}
	if uint32(st.Mode)&syscall.S_IFMT != syscall.S_IFREG {
		return 0, false, nil
	}
	return st.Size, true, nil
}

// sysCode classifies a system call error.
func sysCode(err error) status.Code {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return status.Internal
	}
	switch errno {
	case syscall.ENOMEM, syscall.EAGAIN, syscall.EMFILE, syscall.ENFILE:
		return status.NoMemory
	case syscall.EACCES, syscall.EPERM:
		return status.PermissionDenied
	case syscall.EBADF, syscall.EINVAL, syscall.ENODEV, syscall.EOVERFLOW:
		return status.InvalidArgument
	}
	return status.Internal
}
