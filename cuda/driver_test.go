package cuda_test

import (
	"errors"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	"github.com/tent-dev/tent/status"
)

const testGran = 64 << 10

// loadFake starts a fresh fake driver and loads it; the Driver is closed
// and the fake checked for leaks when the test ends.
func loadFake(t *testing.T, opts ...fakecuda.Option) (*fakecuda.Fake, *cuda.Driver) {
	t.Helper()
	f := fakecuda.New(t, append([]fakecuda.Option{fakecuda.Granularity(testGran)}, opts...)...)
	d, err := cuda.Load(f.Path)
	require.NoError(t, err)
	t.Cleanup(func() {
		f.AssertClean(t)
		require.NoError(t, d.Close())
		require.Zero(t, f.Counters().Contexts, "primary contexts still retained after Close")
	})
	return f, d
}

func requireCUDAError(t *testing.T, err error, code status.Code, r cuda.Result, call string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.CodeOf(err), "%v", err)
	var ce *cuda.Error
	require.True(t, errors.As(err, &ce), "%v is not a *cuda.Error", err)
	require.Equal(t, r, ce.Result, "%v", err)
	require.Equal(t, r.String(), ce.Name)
	require.Contains(t, err.Error(), call)
	require.True(t, strings.HasSuffix(err.Error(), ": "+r.String()), "%q", err.Error())
}

func TestLoadMissingLibrary(t *testing.T) {
	_, err := cuda.Load("/nonexistent/libcuda.so.1")
	require.Error(t, err)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.True(t, errors.Is(err, status.ErrUnsupported))
	require.Equal(t, "no CUDA driver (/nonexistent/libcuda.so.1 not found): GPU features disabled", err.Error())

	// cached: the same answer again
	_, err2 := cuda.Load("/nonexistent/libcuda.so.1")
	require.Equal(t, err, err2)
}

func TestDefaultWithoutDriver(t *testing.T) {
	t.Setenv(cuda.EnvDriver, "")
	cuda.ResetDefault()
	t.Cleanup(cuda.ResetDefault)
	d, err := cuda.Default()
	if err == nil {
		// A machine with the driver: Default is that driver, loaded once.
		require.NotEmpty(t, d.VersionString())
		d2, err := cuda.Default()
		require.NoError(t, err)
		require.Same(t, d, d2)
		return
	}
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	if strings.Contains(err.Error(), "not found") {
		require.Equal(t, "no CUDA driver (libcuda.so.1 not found): GPU features disabled", err.Error())
	}
	_, err2 := cuda.Default()
	require.Equal(t, err, err2)
}

func TestDefaultFollowsEnv(t *testing.T) {
	f := fakecuda.New(t, fakecuda.Devices(3))
	t.Setenv(cuda.EnvDriver, f.Path)
	cuda.ResetDefault()
	t.Cleanup(cuda.ResetDefault)
	d, err := cuda.Default()
	require.NoError(t, err)
	require.Equal(t, f.Path, d.Path())
	require.Equal(t, 3, d.DeviceCount())
	d2, err := cuda.Default()
	require.NoError(t, err)
	require.Same(t, d, d2)
	require.NoError(t, d.Close())
	d3, err := cuda.Default()
	require.NoError(t, err)
	require.NotSame(t, d, d3, "Close forgets the cached driver")
	require.NoError(t, d3.Close())
}

func TestLoadNotADriver(t *testing.T) {
	_, err := cuda.Load("libm.so.6")
	require.Equal(t, status.Unsupported, status.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "lacks cuInit")
}

func TestLoadNoGPU(t *testing.T) {
	f := fakecuda.New(t, fakecuda.Devices(0))
	_, err := cuda.Load(f.Path)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.Equal(t, "no GPU: cuInit(0): CUDA_ERROR_NO_DEVICE", err.Error())
	var ce *cuda.Error
	require.True(t, errors.As(err, &ce))
	require.Equal(t, cuda.ErrorNoDevice, ce.Result)
}

func TestLoadInitFails(t *testing.T) {
	f := fakecuda.New(t)
	f.Fail("cuInit", 1, int(cuda.ErrorUnknown))
	_, err := cuda.Load(f.Path)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.Contains(t, err.Error(), "cuInit(0): CUDA_ERROR_UNKNOWN")
}

func TestDevices(t *testing.T) {
	f, d := loadFake(t, fakecuda.Devices(3))
	require.Equal(t, 3, d.DeviceCount())
	require.Equal(t, 12080, d.Version())
	require.Equal(t, "12.8", d.VersionString())
	require.Equal(t, cuda.Features{VMM: true, RetainAllocationHandle: true, Fabric: true, DMABuf: true, HostFunc: true,
		PointerAttributes: true, UUID: true}, d.Features())
	for i := 0; i < 3; i++ {
		info, err := d.Device(i)
		require.NoError(t, err)
		require.Equal(t, i, info.Ordinal)
		require.Equal(t, "Fake CUDA Device "+string(rune('0'+i)), info.Name)
		require.Regexp(t, `^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, info.UUID)
		require.Equal(t, []string{"0000:1a:00.0", "0000:1b:00.0", "0000:1c:00.0"}[i], cuda.NormalizePCIBusID(info.PCIBusID))
		require.Equal(t, uint64(80<<30), info.TotalMemory)
		require.Equal(t, 9, info.CCMajor)
		require.True(t, info.VMM)
		require.True(t, info.PosixFD)
		require.False(t, info.Fabric, "fabric is off unless configured")
		require.True(t, info.GPUDirectRDMAWithVMM)
		require.True(t, info.UnifiedAddressing)
		require.Equal(t, 0, info.HostNUMANode)
	}
	_, err := d.Device(3)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	v, err := d.Attribute(1, cuda.AttrPCIBusID)
	require.NoError(t, err)
	require.Equal(t, 0x1b, v)
	_, err = d.Attribute(0, cuda.DeviceAttribute(9999))
	requireCUDAError(t, err, status.InvalidArgument, cuda.ErrorInvalidValue, "cuDeviceGetAttribute(9999, device 0)")
	require.Zero(t, f.Counters().Contexts, "device queries need no context")
}

func TestNormalizePCIBusID(t *testing.T) {
	require.Equal(t, "0000:3b:00.0", cuda.NormalizePCIBusID("00000000:3B:00.0"))
	require.Equal(t, "0000:3b:00.0", cuda.NormalizePCIBusID("0000:3b:00.0"))
	require.Equal(t, "0001:3b:00.0", cuda.NormalizePCIBusID("1:3B:00.0"))
	require.Equal(t, "garbage", cuda.NormalizePCIBusID("garbage"))
}

func TestFormatUUID(t *testing.T) {
	b := [16]byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77}
	require.Equal(t, "GPU-01234567-89ab-cdef-0011-223344556677", cuda.FormatUUID(b))
}

func TestFabricFeature(t *testing.T) {
	_, d := loadFake(t, fakecuda.Fabric(true))
	info, err := d.Device(1)
	require.NoError(t, err)
	require.True(t, info.Fabric)
}

func TestOldDriverWithoutVMM(t *testing.T) {
	f, d := loadFake(t, fakecuda.Without(fakecuda.WithoutVMM, fakecuda.WithoutHostFns))
	feat := d.Features()
	require.False(t, feat.VMM)
	require.False(t, feat.Fabric)
	require.False(t, feat.RetainAllocationHandle)
	require.False(t, feat.HostFunc)
	info, err := d.Device(0)
	require.NoError(t, err)
	require.False(t, info.VMM)
	require.False(t, info.PosixFD)

	_, err = d.Granularity(0)
	require.Equal(t, status.Unsupported, status.CodeOf(err), "%v", err)
	_, err = d.ImportFD(0)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	_, err = d.CreateMapping(0, testGran, cuda.AllocOptions{})
	require.Equal(t, status.Unsupported, status.CodeOf(err))

	// ImportMapping owns the fd even when it cannot do anything with it.
	var fds [2]int
	require.NoError(t, syscall.Pipe2(fds[:], syscall.O_CLOEXEC))
	defer syscall.Close(fds[0])
	_, err = d.ImportMapping(fds[1], testGran, 0)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	requireClosed(t, fds[1])

	s, err := d.NewStream(0)
	require.NoError(t, err)
	require.Equal(t, status.Unsupported, status.CodeOf(s.LaunchHostFunc(func() {})))
	require.NoError(t, s.Destroy())

	// plain device memory still works
	p, err := d.MemAlloc(0, 4096)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(p, []byte("hello")))
	got := make([]byte, 5)
	require.NoError(t, d.CopyDtoH(got, p))
	require.Equal(t, "hello", string(got))
	require.NoError(t, d.MemFree(p))
	require.Equal(t, int64(1), f.Counters().Contexts)
}

func TestContextRestored(t *testing.T) {
	_, d := loadFake(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	isNil, err := d.CurrentContextIsNil()
	require.NoError(t, err)
	require.True(t, isNil)

	p, err := d.MemAlloc(1, 4096) // needs device 1's context current
	require.NoError(t, err)
	require.NoError(t, d.MemFree(p))
	m, err := d.CreateMapping(0, testGran, cuda.AllocOptions{})
	require.NoError(t, err)
	require.NoError(t, m.Release())

	isNil, err = d.CurrentContextIsNil()
	require.NoError(t, err)
	require.True(t, isNil, "the wrappers must restore the thread's previous context")
	require.Equal(t, 2, d.RetainedContexts())
}

func TestClosedDriver(t *testing.T) {
	f := fakecuda.New(t)
	d, err := cuda.Load(f.Path)
	require.NoError(t, err)
	p, err := d.MemAlloc(0, 10)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(p))
	require.Equal(t, int64(1), f.Counters().Contexts)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close is idempotent")
	_, err = d.NewStream(0)
	require.Equal(t, status.Closed, status.CodeOf(err))
	f.Reset()
	require.Zero(t, f.Counters().Contexts)
}

// requireClosed checks that fd is not open.
func requireClosed(t *testing.T, fd int) {
	t.Helper()
	var st syscall.Stat_t
	require.Equal(t, syscall.EBADF, syscall.Fstat(fd, &st), "fd %d is still open", fd)
}
