package cuda_test

import (
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/status"
)

func TestCreateExportImportSameProcess(t *testing.T) {
	f, d := loadFake(t)
	g, err := d.Granularity(0)
	require.NoError(t, err)
	require.Equal(t, uint64(testGran), g)

	const size = 3 * testGran
	exp, err := d.CreateMapping(0, size-100, cuda.AllocOptions{}) // rounded up
	require.NoError(t, err)
	require.Equal(t, uint64(size), exp.Size())
	require.Equal(t, -1, exp.FD)
	require.NoError(t, d.CopyHtoD(exp.Ptr(), pattern(3, size)))

	fd, err := exp.ExportFD()
	require.NoError(t, err)
	imp, err := d.ImportMapping(fd, size, 1)
	require.NoError(t, err)
	require.Equal(t, fd, imp.FD)
	require.NotEqual(t, exp.Ptr(), imp.Ptr())

	got := make([]byte, size)
	require.NoError(t, d.CopyDtoH(got, imp.Ptr()))
	require.Equal(t, pattern(3, size), got, "the import shows the exporter's bytes")
	require.NoError(t, d.CopyDtoD(imp.Ptr()+10, exp.Ptr()+20, 1000))

	c := f.Counters()
	require.Equal(t, int64(2), c.Handles)
	require.Equal(t, int64(2), c.Allocations, "an import is an allocation of its own in the fake")
	require.Equal(t, int64(2), c.Reservations)
	require.Equal(t, int64(2), c.Mappings)
	require.Equal(t, int64(2), c.FDs)
	require.Equal(t, int64(1), c.ExportedFDs)

	require.NoError(t, imp.CloseFD())
	require.Equal(t, -1, imp.FD)
	requireClosed(t, fd)
	require.NoError(t, imp.Release())
	require.NoError(t, imp.Release(), "Release is idempotent")
	require.False(t, imp.HasHandle)
	require.Zero(t, imp.Reserved)
	require.Zero(t, imp.Mapped)
	require.Zero(t, imp.Ptr())
	require.NoError(t, exp.Release())
}

func TestImportMappingRecordsAndReleaseOrder(t *testing.T) {
	f, d := loadFake(t)
	const size = 2 * testGran
	exp, err := d.CreateMapping(0, size, cuda.AllocOptions{})
	require.NoError(t, err)
	defer exp.Release()
	fd, err := exp.ExportFD()
	require.NoError(t, err)
	m, err := d.ImportMapping(fd, size, 0)
	require.NoError(t, err)
	require.True(t, m.HasHandle)
	require.Equal(t, uint64(size), m.Reserved)
	require.Equal(t, uint64(size), m.Mapped)
	require.True(t, m.Access)

	// The unmap fails: the handle is still released and the fd closed,
	// but the reservation is kept (its mapping is still there) and both
	// stay recorded for the next Release.
	f.Fail("cuMemUnmap", 1, int(cuda.ErrorUnknown))
	err = m.Release()
	requireCUDAError(t, err, status.TransportError, cuda.ErrorUnknown, "cuMemUnmap(")
	require.False(t, m.HasHandle)
	require.Equal(t, -1, m.FD)
	requireClosed(t, fd)
	require.Equal(t, uint64(size), m.Mapped)
	require.Equal(t, uint64(size), m.Reserved)
	c := f.Counters()
	require.Equal(t, int64(1), c.Handles, "the exporter's")
	require.Equal(t, int64(2), c.Mappings)
	require.Equal(t, int64(2), c.Allocations, "the mapping keeps the released import alive")

	require.NoError(t, m.Release())
	require.Zero(t, m.Mapped)
	require.Zero(t, m.Reserved)
	c = f.Counters()
	require.Equal(t, int64(1), c.Mappings)
	require.Equal(t, int64(1), c.Allocations)
}

// TestImportMappingFaults fails each step of ImportMapping in turn and
// checks that what was done is undone: fake counters back to zero and no
// file descriptor left open.
func TestImportMappingFaults(t *testing.T) {
	f, d := loadFake(t)
	const size = 2 * testGran
	steps := []struct {
		fn   string
		nth  int // the ImportMapping's call to fn
		err  cuda.Result
		code status.Code
	}{
		{"cuMemGetAllocationGranularity", 1, cuda.ErrorUnknown, status.TransportError},
		{"cuMemImportFromShareableHandle", 1, cuda.ErrorInvalidValue, status.InvalidArgument},
		{"cuMemImportFromShareableHandle", 1, cuda.ErrorOutOfMemory, status.NoMemory},
		{"cuMemAddressReserve", 1, cuda.ErrorOutOfMemory, status.NoMemory},
		{"cuMemMap", 1, cuda.ErrorInvalidValue, status.InvalidArgument},
		{"cuMemSetAccess", 1, cuda.ErrorInvalidDevice, status.InvalidArgument},
		{"cuCtxSetCurrent", 1, cuda.ErrorInvalidContext, status.TransportError},
	}
	_, _ = countFDs()
	for _, st := range steps {
		t.Run(fmt.Sprintf("%s_%d", st.fn, int(st.err)), func(t *testing.T) {
			before, err := countFDs()
			require.NoError(t, err)
			h, err := d.Create(0, size, cuda.AllocOptions{})
			require.NoError(t, err)
			fd, err := d.ExportFD(h)
			require.NoError(t, err)

			f.Fail(st.fn, st.nth, int(st.err))
			failures := f.Counters().Failures
			m, err := d.ImportMapping(fd, size, 1)
			require.Nil(t, m)
			requireCUDAError(t, err, st.code, st.err, st.fn)
			require.Equal(t, failures+1, f.Counters().Failures)
			requireClosed(t, fd)

			require.NoError(t, d.Release(h))
			f.AssertClean(t)
			after, err := countFDs()
			require.NoError(t, err)
			require.Equal(t, before, after, "file descriptors leaked")
		})
	}
}

func TestImportMappingBadArguments(t *testing.T) {
	f, d := loadFake(t)
	h, err := d.Create(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	defer d.Release(h)

	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	_, err = d.ImportMapping(fd, testGran+1, 0)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	require.Contains(t, err.Error(), "granularity")
	requireClosed(t, fd)

	fd, err = d.ExportFD(h)
	require.NoError(t, err)
	_, err = d.ImportMapping(fd, testGran, 7)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	requireClosed(t, fd)

	_, err = d.ImportMapping(-1, testGran, 0)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))

	// An fd that is not an exported allocation.
	var fds [2]int
	require.NoError(t, syscall2Pipe(fds[:]))
	_, err = d.ImportMapping(fds[0], testGran, 0)
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemImportFromShareableHandle(fd ")
	requireClosed(t, fds[0])
	closeFD(fds[1])

	// A size larger than the allocation: the map fails, all is undone.
	fd, err = d.ExportFD(h)
	require.NoError(t, err)
	_, err = d.ImportMapping(fd, 2*testGran, 0)
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemMap(")
	requireClosed(t, fd)
	require.Equal(t, int64(1), f.Counters().Handles)
	require.Zero(t, f.Counters().Reservations)
}

// TestCrossProcess exports an allocation to a child process, which imports
// and maps it and writes a pattern; the parent reads it back through its
// own mapping.
func TestCrossProcess(t *testing.T) {
	f, d := loadFake(t)
	const size = 4 * testGran
	m, err := d.CreateMapping(0, size, cuda.AllocOptions{})
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(m.Ptr(), make([]byte, size)))
	fd, err := m.ExportFD()
	require.NoError(t, err)
	file := os.NewFile(uintptr(fd), "exported")
	runChild(t, f, "map-write", []string{"CHILD_SIZE=" + strconv.Itoa(size), "CHILD_DEV=1", "CHILD_SEED=42"}, file)
	require.NoError(t, file.Close())

	got := make([]byte, size)
	require.NoError(t, d.CopyDtoH(got, m.Ptr()))
	require.Equal(t, pattern(42, size), got, "the child's writes show through the parent's mapping")
	require.NoError(t, m.Release())
}

// TestCrossProcessFaults makes each import step fail in a child process
// (FAKECUDA_FAIL); the child checks that everything was undone.
func TestCrossProcessFaults(t *testing.T) {
	f, d := loadFake(t)
	const size = 2 * testGran
	m, err := d.CreateMapping(0, size, cuda.AllocOptions{})
	require.NoError(t, err)
	defer m.Release()
	for _, fn := range []string{"cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess"} {
		t.Run(fn, func(t *testing.T) {
			fd, err := m.ExportFD()
			require.NoError(t, err)
			file := os.NewFile(uintptr(fd), "exported")
			defer file.Close()
			runChild(t, f, "import-fail", []string{
				"CHILD_SIZE=" + strconv.Itoa(size), "CHILD_DEV=0", "CHILD_SEED=0",
				"FAKECUDA_FAIL=" + fn + ":1:1", "CHILD_WANT=" + fn + "(",
			}, file)
		})
	}
}

func TestFabricHandles(t *testing.T) {
	f, d := loadFake(t, fakecuda.Fabric(true))
	const size = 2 * testGran
	m, err := d.CreateMapping(0, size, cuda.AllocOptions{HandleTypes: cuda.HandleTypePosixFD | cuda.HandleTypeFabric})
	require.NoError(t, err)
	defer m.Release()
	require.NoError(t, d.CopyHtoD(m.Ptr(), pattern(9, size)))
	fh, err := m.ExportFabric()
	require.NoError(t, err)

	imp, err := d.ImportFabricMapping(fh, size, 1)
	require.NoError(t, err)
	require.Equal(t, -1, imp.FD)
	got := make([]byte, size)
	require.NoError(t, d.CopyDtoH(got, imp.Ptr()))
	require.Equal(t, pattern(9, size), got)
	require.NoError(t, imp.Release())

	runChild(t, f, "fabric-read", []string{"CHILD_SIZE=" + strconv.Itoa(size), "CHILD_DEV=1", "CHILD_SEED=9",
		"CHILD_FABRIC=" + hex.EncodeToString(fh[:])})

	// A garbled handle is refused.
	bad := fh
	bad[0] ^= 0xff
	_, err = d.ImportFabricMapping(bad, size, 0)
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemImportFromShareableHandle(FABRIC)")
	c := f.Counters()
	require.Equal(t, int64(1), c.Handles)
}

func TestFabricUnavailable(t *testing.T) {
	_, d := loadFake(t) // fabric off
	_, err := d.CreateMapping(0, testGran, cuda.AllocOptions{HandleTypes: cuda.HandleTypeFabric})
	requireCUDAError(t, err, status.Unsupported, cuda.ErrorNotSupported, "cuMemCreate(device 0")
	m, err := d.CreateMapping(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	defer m.Release()
	_, err = m.ExportFabric()
	requireCUDAError(t, err, status.Unsupported, cuda.ErrorNotSupported, "FABRIC")

}

func TestFabricNeedsCUDA123(t *testing.T) {
	t.Setenv("FAKECUDA_DRIVER_VERSION", "12020") // read when the fake is loaded
	_, d := loadFake(t, fakecuda.Fabric(true))
	require.Equal(t, 12020, d.Version())
	require.False(t, d.Features().Fabric)
	info, err := d.Device(0)
	require.NoError(t, err)
	require.False(t, info.Fabric)
	_, err = d.ImportFabric(cuda.FabricHandle{})
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.Contains(t, err.Error(), "12.3")
}

// TestFakeValidation checks that the fake refuses what the real driver
// refuses, so that tent's lifetime bugs fail tests.
func TestFakeValidation(t *testing.T) {
	_, d := loadFake(t)
	h, err := d.Create(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Release(h))
	requireCUDAError(t, d.Release(h), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemRelease(0x")

	_, err = d.Create(0, testGran+1, cuda.AllocOptions{})
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemCreate(")

	addr, err := d.Reserve(2*testGran, 0)
	require.NoError(t, err)
	requireCUDAError(t, d.Unmap(addr, testGran), status.InvalidArgument, cuda.ErrorInvalidValue,
		fmt.Sprintf("cuMemUnmap(%#x, %d)", addr, testGran))
	requireCUDAError(t, d.SetAccess(addr, testGran, cuda.AccessReadWrite, 0), status.InvalidArgument,
		cuda.ErrorInvalidValue, "cuMemSetAccess(")

	h, err = d.Create(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(addr, testGran, 0, h))
	requireCUDAError(t, d.Map(addr, testGran, 0, h), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemMap(")
	requireCUDAError(t, d.Map(addr+2*testGran, testGran, 0, h), status.InvalidArgument, cuda.ErrorInvalidValue,
		"cuMemMap(") // outside the reservation
	requireCUDAError(t, d.AddressFree(addr, 2*testGran), status.InvalidArgument, cuda.ErrorInvalidValue,
		"cuMemAddressFree(") // still mapped
	requireCUDAError(t, d.Unmap(addr, 2*testGran), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemUnmap(")

	// Not yet accessible: the fake refuses the copy (a real GPU faults).
	requireCUDAError(t, d.CopyHtoD(addr, []byte{1}), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemcpyHtoD(")
	require.NoError(t, d.SetAccess(addr, testGran, cuda.AccessReadWrite, 0, 1))
	require.NoError(t, d.CopyHtoD(addr, []byte{1}))

	// Released handle: the mapping keeps the memory.
	require.NoError(t, d.Release(h))
	require.NoError(t, d.CopyHtoD(addr+5, []byte{2}))
	requireCUDAError(t, d.Release(h), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemRelease(")
	h2, err := d.RetainAllocationHandle(addr + 100)
	require.NoError(t, err)
	require.Equal(t, h, h2)
	require.NoError(t, d.Release(h2))

	require.NoError(t, d.Unmap(addr, testGran))
	requireCUDAError(t, d.Unmap(addr, testGran), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemUnmap(")
	requireCUDAError(t, d.AddressFree(addr, testGran), status.InvalidArgument, cuda.ErrorInvalidValue,
		"cuMemAddressFree(") // not the reserved size
	require.NoError(t, d.AddressFree(addr, 2*testGran))
	requireCUDAError(t, d.AddressFree(addr, 2*testGran), status.InvalidArgument, cuda.ErrorInvalidValue,
		"cuMemAddressFree(")
	_, err = d.RetainAllocationHandle(addr)
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemRetainAllocationHandle(")
}

func TestErrorMessage(t *testing.T) {
	_, d := loadFake(t)
	err := d.Map(0x7f0000000000, 2097152, 0, cuda.AllocHandle(0x1234))
	require.Equal(t, "cuMemMap(0x7f0000000000, 2097152, offset 0, 0x1234): CUDA_ERROR_INVALID_VALUE", err.Error())
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
}

func TestPointerInfo(t *testing.T) {
	_, d := loadFake(t)
	const size = 2 * testGran
	m, err := d.CreateMapping(1, size, cuda.AllocOptions{GPUDirectRDMA: true})
	require.NoError(t, err)
	defer m.Release()

	isDev, dev, base, sz, err := d.PointerInfo(m.Ptr() + 12345)
	require.NoError(t, err)
	require.True(t, isDev)
	require.Equal(t, 1, dev)
	require.Equal(t, m.Ptr(), base)
	require.Equal(t, uint64(size), sz)

	pa, err := d.Pointer(m.Ptr())
	require.NoError(t, err)
	require.Equal(t, cuda.MemoryDevice, pa.Type)
	require.True(t, pa.VMM)
	require.False(t, pa.LegacyIPC)
	require.Equal(t, cuda.HandleTypePosixFD, pa.AllowedHandleTypes)
	require.Equal(t, m.Ptr(), pa.MappingBase)
	require.Equal(t, uint64(size), pa.MappingSize)

	p, err := d.MemAlloc(0, 1000)
	require.NoError(t, err)
	defer d.MemFree(p)
	pa, err = d.Pointer(p + 10)
	require.NoError(t, err)
	require.Equal(t, cuda.MemoryDevice, pa.Type)
	require.Equal(t, 0, pa.Device)
	require.False(t, pa.VMM)
	require.True(t, pa.LegacyIPC)
	require.Equal(t, p, pa.Base)
	require.Equal(t, uint64(1000), pa.Size)
	base, sz, err = d.AddressRange(p + 999)
	require.NoError(t, err)
	require.Equal(t, p, base)
	require.Equal(t, uint64(1000), sz)

	host := make([]byte, 64)
	isDev, dev, base, sz, err = d.PointerInfo(addrOf(host))
	require.NoError(t, err)
	require.False(t, isDev)
	require.Equal(t, -1, dev)
	require.Zero(t, base)
	require.Zero(t, sz)
	_, _, err = d.AddressRange(addrOf(host))
	requireCUDAError(t, err, status.NotFound, cuda.ErrorNotFound, "cuMemGetAddressRange(")
}

func TestPointerInfoWithoutRetain(t *testing.T) {
	_, d := loadFake(t, fakecuda.Without(fakecuda.WithoutRetain))
	require.False(t, d.Features().RetainAllocationHandle)
	m, err := d.CreateMapping(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	defer m.Release()
	pa, err := d.Pointer(m.Ptr())
	require.NoError(t, err)
	require.True(t, pa.VMM, "inferred from the legacy IPC attribute")
	_, err = d.RetainAllocationHandle(m.Ptr())
	require.Equal(t, status.Unsupported, status.CodeOf(err))
}

// TestConcurrentMappings runs create/export/import/release cycles on both
// devices from many goroutines (run with -race).
func TestConcurrentMappings(t *testing.T) {
	f, d := loadFake(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if err := cycle(d, g%2, byte(g*31+i)); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(2), f.Counters().Contexts)
}

func cycle(d *cuda.Driver, dev int, seed byte) error {
	exp, err := d.CreateMapping(dev, testGran, cuda.AllocOptions{})
	if err != nil {
		return err
	}
	defer exp.Release()
	if err := d.CopyHtoD(exp.Ptr(), pattern(seed, 512)); err != nil {
		return err
	}
	fd, err := exp.ExportFD()
	if err != nil {
		return err
	}
	imp, err := d.ImportMapping(fd, testGran, 1-dev)
	if err != nil {
		return err
	}
	got := make([]byte, 512)
	if err := d.CopyDtoH(got, imp.Ptr()); err != nil {
		imp.Release()
		return err
	}
	if string(got) != string(pattern(seed, 512)) {
		imp.Release()
		return fmt.Errorf("pattern mismatch")
	}
	return imp.Release()
}

func syscall2Pipe(fds []int) error { return syscall.Pipe2(fds, syscall.O_CLOEXEC) }

func closeFD(fd int) { _ = syscall.Close(fd) }

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
