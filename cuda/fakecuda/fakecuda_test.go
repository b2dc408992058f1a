package fakecuda

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewAndControl(t *testing.T) {
	f := New(t, Devices(3), Granularity(64<<10), Fabric(true))
	require.Equal(t, Counters{}, f.Counters())
	require.Empty(t, f.Counters().Leaks())
	require.Empty(t, f.Describe())
	require.Equal(t, []string{"TENT_CUDA_DRIVER=" + f.Path, "FAKECUDA_DEVICES=3", "FAKECUDA_GRANULARITY=65536",
		"FAKECUDA_FABRIC=1"}, f.Env())

	f.Fail("cuInit", 1, 999)
	f.FailTimes("cuMemMap", 2, 3, 1)
	f.ClearFailures()
	f.Reset()
	require.Equal(t, Counters{}, f.Counters())

	g := New(t)
	require.NotEqual(t, f.Path, g.Path, "each New is a separate instance")

	f2, err := Open(f.Path)
	require.NoError(t, err)
	require.Equal(t, f.Counters(), f2.Counters())
}

func TestVariantsBuild(t *testing.T) {
	for _, v := range []string{WithoutVMM, WithoutRetain, WithoutHostFns} {
		New(t, Without(v))
	}
}

func TestOpenErrors(t *testing.T) {
	_, err := Open("/nonexistent/libfakecuda.so")
	require.Error(t, err)
	_, err = Open("libm.so.6")
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "not a fake driver"), err.Error())
}

func TestLeaks(t *testing.T) {
	require.Equal(t, "handles=1 fds=2", Counters{Handles: 1, FDs: 2, Contexts: 5, Calls: 9}.Leaks())
}
