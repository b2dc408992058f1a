package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	cu "github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
	cumem "github.com/tent-dev/tent/memory/cuda"
	"github.com/tent-dev/tent/memory/host"
	"github.com/tent-dev/tent/status"
)

func TestGPUMemoryOnTheFakeDriver(t *testing.T) {
	f := fakecuda.New(t, fakecuda.Devices(2), fakecuda.Granularity(64<<10))
	d, err := cu.Load(f.Path)
	require.NoError(t, err)
	m := cumem.New(d)
	require.Equal(t, "cuda", m.Name())
	require.Same(t, d, m.Driver())
	base := f.Counters()

	require.NoError(t, m.CheckDevice(-1))
	require.NoError(t, m.CheckDevice(1))
	err = m.CheckDevice(2)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))
	require.ErrorContains(t, err, "sees 2 GPU(s)")

	// Detection: device memory is GPU memory of its device, host memory
	// is not this kind's.
	p, err := d.MemAlloc(1, 4096)
	require.NoError(t, err)
	dev, ok, err := m.Detect(p)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, dev)
	buf := make([]byte, 16)
	_, ok, err = m.Detect(host.Addr(buf))
	require.NoError(t, err)
	require.False(t, ok)

	// Explicit locations are checked against the driver.
	require.NoError(t, m.Verify(p, 4096, "cuda", 1))
	require.ErrorContains(t, m.Verify(p, 4096, "cpu", -1), "is GPU memory of cuda:1")
	require.ErrorContains(t, m.Verify(p, 4096, "cuda", 0), "is GPU memory of cuda:1")
	require.ErrorContains(t, m.Verify(host.Addr(buf), 16, "cuda", 0), "not GPU memory")
	require.NoError(t, m.Verify(host.Addr(buf), 16, "cpu", -1))

	// Staging copies are the driver's.
	require.NoError(t, m.CopyIn(p, []byte("to the gpu")))
	out := make([]byte, 10)
	require.NoError(t, m.CopyOut(out, p))
	require.Equal(t, "to the gpu", string(out))
	require.NoError(t, d.MemFree(p))

	// Allocation: a cuMemCreate mapping rounded to the granularity, with
	// its record in Detail, released by Free.
	a, err := m.Alloc(1000, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(64<<10), a.Size)
	require.Equal(t, -1, a.FD)
	rec, ok := a.Detail.(*cumem.Allocation)
	require.True(t, ok)
	require.Equal(t, 0, rec.Device)
	require.False(t, rec.Fabric, "the fake has no fabric unless asked")
	require.Equal(t, a.Addr, rec.Mapping.Ptr())
	dev, ok, err = m.Detect(a.Addr)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 0, dev)
	require.NoError(t, a.Free())
	_, err = m.Alloc(1000, 5)
	require.Equal(t, status.InvalidArgument, status.CodeOf(err))

	c := f.Counters()
	require.Equal(t, base.Allocations, c.Allocations)
	require.Equal(t, base.Mappings, c.Mappings)
	require.Equal(t, base.Reservations, c.Reservations)
	require.Equal(t, base.MemAllocs, c.MemAllocs)
}

func TestAllocWithoutVMM(t *testing.T) {
	f := fakecuda.New(t, fakecuda.Without("FAKECUDA_NO_VMM"))
	d, err := cu.Load(f.Path)
	require.NoError(t, err)
	_, err = cumem.New(d).Alloc(4096, 0)
	require.Equal(t, status.Unsupported, status.CodeOf(err))
	require.ErrorContains(t, err, "virtual memory management")
}
