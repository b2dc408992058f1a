package cuda_test

import (
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/status"
)

// hostBuffer is host memory outside the Go heap, as asynchronous copies
// need (pinned memory on a real GPU).
func hostBuffer(t *testing.T, n int) ([]byte, uintptr) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b, uintptr(unsafe.Pointer(&b[0]))
}

func TestSyncCopies(t *testing.T) {
	f, d := loadFake(t)
	a, err := d.MemAlloc(0, 4096)
	require.NoError(t, err)
	b, err := d.MemAlloc(1, 4096)
	require.NoError(t, err)
	require.Equal(t, int64(2), f.Counters().MemAllocs)

	require.NoError(t, d.CopyHtoD(a, pattern(1, 4096)))
	require.NoError(t, d.CopyDtoD(b, a, 4096))
	got := make([]byte, 4096)
	require.NoError(t, d.CopyDtoH(got, b))
	require.Equal(t, pattern(1, 4096), got)

	host := make([]byte, 100)
	require.NoError(t, d.Memcpy(addrOf(host), a+10, 100))
	require.Equal(t, pattern(1, 4096)[10:110], host)

	requireCUDAError(t, d.CopyHtoD(a+4000, make([]byte, 200)), status.InvalidArgument, cuda.ErrorInvalidValue,
		"cuMemcpyHtoD(") // past the end of the block
	require.NoError(t, d.CopyHtoD(a, nil))

	require.NoError(t, d.MemFree(a))
	require.NoError(t, d.MemFree(b))
	requireCUDAError(t, d.MemFree(b), status.InvalidArgument, cuda.ErrorInvalidValue, "cuMemFree(")
}

func TestStreamsAndEvents(t *testing.T) {
	f, d := loadFake(t)
	dev, err := d.MemAlloc(1, 8192)
	require.NoError(t, err)
	defer d.MemFree(dev)
	hb, hp := hostBuffer(t, 8192)
	copy(hb, pattern(5, 8192))

	s, err := d.NewStream(1)
	require.NoError(t, err)
	require.Equal(t, 1, s.Device())
	e, err := d.NewEvent(1)
	require.NoError(t, err)
	c := f.Counters()
	require.Equal(t, int64(1), c.Streams)
	require.Equal(t, int64(1), c.Events)

	require.NoError(t, s.MemcpyHtoD(dev, hp, 4096))
	require.NoError(t, s.MemcpyDtoD(dev+4096, dev, 4096))
	require.NoError(t, s.Memcpy(uint64(hp)+4096, dev+4096, 2048))
	require.NoError(t, s.MemcpyDtoH(hp+6144, dev, 2048))
	require.NoError(t, e.Record(s))

	// The fake copies at once; make the first query answer "not ready".
	f.Fail("cuEventQuery", 1, int(cuda.ErrorNotReady))
	done, err := e.Query()
	require.NoError(t, err)
	require.False(t, done)
	done, err = e.Query()
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, e.Synchronize())
	require.NoError(t, s.Synchronize())
	require.Equal(t, pattern(5, 8192)[:2048], hb[4096:6144])
	require.Equal(t, pattern(5, 8192)[:2048], hb[6144:8192])

	ran := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { close(ran) }))
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("host function did not run")
	}
	f.Fail("cuLaunchHostFunc", 1, int(cuda.ErrorInvalidValue))
	requireCUDAError(t, s.LaunchHostFunc(func() { t.Error("must not run") }), status.InvalidArgument,
		cuda.ErrorInvalidValue, "cuLaunchHostFunc(device 1)")

	// An event of another device cannot be recorded on this stream.
	e0, err := d.NewEvent(0)
	require.NoError(t, err)
	requireCUDAError(t, e0.Record(s), status.InvalidArgument, cuda.ErrorInvalidHandle, "cuEventRecord(device 0)")
	require.NoError(t, e0.Destroy())

	f.Fail("cuStreamSynchronize", 1, int(cuda.ErrorIllegalAddress))
	requireCUDAError(t, s.Synchronize(), status.TransportError, cuda.ErrorIllegalAddress, "cuStreamSynchronize(device 1)")

	require.NoError(t, e.Destroy())
	require.NoError(t, e.Destroy())
	_, err = e.Query()
	require.Equal(t, status.Closed, status.CodeOf(err))
	require.NoError(t, s.Destroy())
	require.NoError(t, s.Destroy())
	require.Equal(t, status.Closed, status.CodeOf(s.MemcpyDtoD(dev, dev, 1)))
	c = f.Counters()
	require.Zero(t, c.Streams)
	require.Zero(t, c.Events)
}

func TestStreamCreateFails(t *testing.T) {
	f, d := loadFake(t)
	f.Fail("cuStreamCreate", 1, int(cuda.ErrorOutOfMemory))
	_, err := d.NewStream(0)
	requireCUDAError(t, err, status.NoMemory, cuda.ErrorOutOfMemory, "cuStreamCreate(device 0)")
	f.Fail("cuEventCreate_v2", 1, int(cuda.ErrorOutOfMemory)) // the _v2 suffix is optional on both sides
	_, err = d.NewEvent(0)
	requireCUDAError(t, err, status.NoMemory, cuda.ErrorOutOfMemory, "cuEventCreate(device 0)")
}
