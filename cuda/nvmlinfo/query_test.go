package nvmlinfo

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/require"
)

// mockLibrary is go-nvml's mock with the answers every test shares: NVML
// initializes and has one GPU, dev.
func mockLibrary(dev nvml.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:                func(r nvml.Return) string { return "code " + string(rune('0'+int(r)%10)) },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "580.1", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 13000, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc:     func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
	}
}

// A device that answers nothing but the name: every other query is a
// function the library lacks.
func sparseDevice() *mock.Device {
	notFound := nvml.ERROR_FUNCTION_NOT_FOUND
	return &mock.Device{
		GetNameFunc:          func() (string, nvml.Return) { return "GPU", nvml.SUCCESS },
		GetUUIDFunc:          func() (string, nvml.Return) { return "", notFound },
		GetPciInfoFunc:       func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, notFound },
		GetMemoryInfoFunc:    func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, notFound },
		GetNumaNodeIdFunc:    func() (int, nvml.Return) { return 0, notFound },
		GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) { return nvml.GpuFabricInfo{}, notFound },
	}
}

func TestQueryMissingFunctions(t *testing.T) {
	dev := sparseDevice()
	dev.GetGpuFabricInfoVFunc = func() nvml.GpuFabricInfoHandler { return nvml.GpuFabricInfoHandler{} }
	// GpuFabricInfoHandler{}.V2 calls into the library with a nil device:
	// the forwarders answer for it (FUNCTION_NOT_FOUND or the real one's
	// INVALID_ARGUMENT); either way it is no usable fabric and no crash.
	info, err := query(mockLibrary(dev))
	require.NoError(t, err)
	require.Len(t, info.GPUs, 1)
	g := info.GPUs[0]
	require.Equal(t, "GPU", g.Name)
	require.Equal(t, -1, g.NUMANode)
	require.False(t, g.Fabric.Usable)
	require.False(t, info.FabricCapable)
	require.Equal(t, "1 problem(s): [GPU 0: nvmlDeviceGetUUID: code 3]", info.Reason)
}

func TestQueryInitFailures(t *testing.T) {
	for _, tc := range []struct {
		r      nvml.Return
		reason string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "no NVML (libnvidia-ml.so.1 not found): no GPU topology"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "nvmlInit: the NVIDIA driver is not loaded: no GPU topology"},
		{nvml.ERROR_NO_PERMISSION, "nvmlInit: code 4: no GPU topology"},
	} {
		lib := mockLibrary(nil)
		lib.InitFunc = func() nvml.Return { return tc.r }
		info, err := query(lib)
		require.NoError(t, err)
		require.Equal(t, tc.reason, info.Reason)
		require.NotNil(t, info.GPUs)
		require.Empty(t, info.GPUs)
		want := 1
		if tc.r == nvml.ERROR_LIBRARY_NOT_FOUND {
			want = 0 // nothing was loaded, nothing to let go
		}
		require.Len(t, lib.ShutdownCalls(), want)
	}
}

func TestQueryShutsDown(t *testing.T) {
	lib := mockLibrary(sparseDevice())
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	info, err := query(lib)
	require.NoError(t, err)
	require.Equal(t, "nvmlDeviceGetCount: code 9", info.Reason)
	require.Len(t, lib.InitCalls(), 1)
	require.Len(t, lib.ShutdownCalls(), 1)
}

func TestQueryRecoversFromPanic(t *testing.T) {
	lib := mockLibrary(nil)
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { panic("boom") }
	info, err := query(lib)
	require.NoError(t, err)
	require.Empty(t, info.GPUs)
	require.NotNil(t, info.GPUs)
	require.Equal(t, "NVML failed: boom", info.Reason)
	require.Len(t, lib.ShutdownCalls(), 1, "the deferred Shutdown still runs")
}
