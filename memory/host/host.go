package host

import (
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	tmem "github.com/tent-dev/tent/memory"
	"github.com/tent-dev/tent/status"
)

// Memory is the host memory kind. It has no state: one value serves every
// engine.
type Memory struct{}

// New returns the host memory kind.
func New() Memory { return Memory{} }

func (Memory) Name() string { return tmem.HostKind }

// numaNodeDir lists the machine's NUMA nodes (node0, node1, ...).
const numaNodeDir = "/sys/devices/system/node"

// CheckDevice checks that NUMA node dev exists. Node 0 and "no node" (-1)
// always do, also where sysfs does not say.
func (Memory) CheckDevice(dev int) error {
	if dev <= 0 {
		return nil
	}
	if _, err := os.Stat(numaNodeDir + "/node" + strconv.Itoa(dev)); err != nil {
		return status.Errorf(status.InvalidArgument,
			"this machine has no NUMA node %d (%s)", dev, numaNodeDir)
	}
	return nil
}

// Detect claims every address: host memory is what no other kind claims.
func (Memory) Detect(uint64) (int, bool, error) { return -1, true, nil }

// memfdSeals fix a shared memfd's size: a peer holding the descriptor can
// then neither shrink it (which would make the target's own accesses fault
// with SIGBUS) nor grow it, and F_SEAL_SEAL keeps it from adding seals
// (F_SEAL_FUTURE_WRITE would stop other peers from mapping it writable).
const memfdSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Alloc maps a sealed memfd of size bytes rounded up to pages, so
// same-host peers can map the same pages. The NUMA node is not enforced
// (the kernel's policy places the pages).
func (Memory) Alloc(size uint64, _ int) (*tmem.Allocation, error) {
	page := uint64(unix.Getpagesize())
	size = (size + page - 1) &^ (page - 1)
	fd, err := unix.MemfdCreate("tent-alloc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, status.Errorf(status.NoMemory, "memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.NoMemory, "ftruncate memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.Internal, "sealing memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, status.Errorf(status.NoMemory, "mmap %d bytes: %w", size, err)
	}
	return &tmem.Allocation{
		Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: size, FD: fd,
		Free: func() error {
			err1 := unix.Munmap(mem)
			err2 := unix.Close(fd)
			if err1 != nil || err2 != nil {
				return status.Errorf(status.Internal, "freeing allocation: munmap: %v, close: %v", err1, err2)
			}
			return nil
		},
	}, nil
}

// CopyOut copies the host memory at src into dst; a fault (memory the
// owner unmapped) is an error.
func (Memory) CopyOut(dst []byte, src uint64) error {
	_, err := Copy(dst, Bytes(src, uint64(len(dst))))
	return err
}

// CopyIn copies src into the host memory at dst; a fault is an error.
func (Memory) CopyIn(dst uint64, src []byte) error {
	_, err := Copy(Bytes(dst, uint64(len(src))), src)
	return err
}
