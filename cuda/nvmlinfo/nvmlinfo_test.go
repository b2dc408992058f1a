package nvmlinfo

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNoNVMLLibrary(t *testing.T) {
	info, err := TopologyFrom("/nonexistent/libnvidia-ml.so.1")
	require.NoError(t, err)
	require.Empty(t, info.GPUs)
	require.NotNil(t, info.GPUs)
	require.False(t, info.FabricCapable)
	require.Equal(t, "no NVML (/nonexistent/libnvidia-ml.so.1 not found): no GPU topology", info.Reason)

	b, err := info.JSON()
	require.NoError(t, err)
	require.JSONEq(t, `{"driver_version":"","cuda_driver_version":0,"gpus":[],"fabric_capable":false,
		"reason":"no NVML (/nonexistent/libnvidia-ml.so.1 not found): no GPU topology"}`, string(b))
}

func TestTopologyDefaultLibrary(t *testing.T) {
	t.Setenv(EnvLibrary, "")
	info, err := Topology()
	require.NoError(t, err)
	if len(info.GPUs) > 0 {
		t.Skipf("this machine has NVML and %d GPU(s)", len(info.GPUs))
	}
	require.NotEmpty(t, info.Reason, "an empty topology says why")
	t.Logf("reason: %s", info.Reason)

	t.Setenv(EnvLibrary, "/nonexistent/nvml.so")
	info, err = Topology()
	require.NoError(t, err)
	require.Contains(t, info.Reason, "/nonexistent/nvml.so not found")
}

func TestZeroValueJSON(t *testing.T) {
	b, err := json.Marshal(TopologyInfo{})
	require.NoError(t, err)
	require.Contains(t, string(b), `"gpus":[]`)
	b, err = json.Marshal(&TopologyInfo{Reason: "x"})
	require.NoError(t, err)
	require.Contains(t, string(b), `"gpus":[]`)
}

func TestRecoversFromPanic(t *testing.T) {
	testHook = func() { panic("boom") }
	defer func() { testHook = nil }()
	info, err := TopologyFrom("/any/libnvidia-ml.so.1")
	require.NoError(t, err)
	require.Empty(t, info.GPUs)
	require.NotNil(t, info.GPUs)
	require.Equal(t, "NVML failed: boom", info.Reason)
}

func TestNotNVML(t *testing.T) {
	info, err := TopologyFrom("libm.so.6")
	require.NoError(t, err)
	require.Empty(t, info.GPUs)
	require.Equal(t, "NVML unusable (libm.so.6 lacks nvmlInit_v2): no GPU topology", info.Reason)
}

var (
	fakeMu   sync.Mutex
	fakeImgs = map[string][]byte{}
)

// fakeNVML copies the fake NVML library (testdata/fakenvml.c, built once)
// to a new path: a separate instance. The fake reads its settings from the
// environment at each call.
func fakeNVML(t *testing.T, defines ...string) string {
	t.Helper()
	key := strings.Join(defines, " ")
	fakeMu.Lock()
	img, ok := fakeImgs[key]
	if !ok {
		dir := t.TempDir()
		out := filepath.Join(dir, "libnvidia-ml.so.1")
		args := []string{"-shared", "-fPIC", "-o", out, filepath.Join("testdata", "fakenvml.c")}
		for _, d := range defines {
			args = append(args, "-D"+d)
		}
		b, err := exec.Command("gcc", args...).CombinedOutput()
		if err != nil {
			fakeMu.Unlock()
			t.Fatalf("gcc: %v\n%s", err, b)
		}
		img, err = os.ReadFile(out)
		if err != nil {
			fakeMu.Unlock()
			t.Fatal(err)
		}
		fakeImgs[key] = img
	}
	fakeMu.Unlock()
	p := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	require.NoError(t, os.WriteFile(p, img, 0o755))
	return p
}

func TestFakeNVML(t *testing.T) {
	t.Run("init fails", func(t *testing.T) {
		t.Setenv("FAKENVML_INIT_ERROR", "9")
		info, err := TopologyFrom(fakeNVML(t))
		require.NoError(t, err)
		require.Empty(t, info.GPUs)
		require.Equal(t, "nvmlInit: the NVIDIA driver is not loaded: no GPU topology", info.Reason)
	})

	path := fakeNVML(t)
	t.Run("no fabric", func(t *testing.T) {
		info, err := TopologyFrom(path)
		require.NoError(t, err)
		require.Empty(t, info.Reason)
		require.Equal(t, "555.42.06", info.DriverVersion)
		require.Equal(t, 12050, info.CUDADriverVersion)
		require.Len(t, info.GPUs, 2)
		for i, g := range info.GPUs {
			require.Equal(t, i, g.Index)
			require.Equal(t, "NVIDIA Fake H100 "+string(rune('0'+i)), g.Name)
			require.True(t, strings.HasPrefix(g.UUID, "GPU-f0f1f2f3-"), g.UUID)
			require.Equal(t, []string{"00000000:1A:00.0", "00000000:1B:00.0"}[i], g.PCIBusID)
			require.Equal(t, uint64(80<<30), g.MemoryTotal)
			require.Equal(t, 0, g.NUMANode)
			require.Equal(t, Fabric{State: FabricStateNotSupported}, g.Fabric)
		}
		require.False(t, info.FabricCapable)
	})
	t.Run("fabric registered", func(t *testing.T) {
		t.Setenv("FAKENVML_FABRIC", "1")
		t.Setenv("FAKENVML_GPUS", "4")
		info, err := TopologyFrom(path)
		require.NoError(t, err)
		require.Len(t, info.GPUs, 4)
		require.Equal(t, Fabric{Supported: true, State: FabricStateCompleted, Status: "SUCCESS",
			ClusterUUID: "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", CliqueID: 7, Usable: true}, info.GPUs[3].Fabric)
		require.True(t, info.FabricCapable)

		b, err := info.JSON()
		require.NoError(t, err)
		var back map[string]any
		require.NoError(t, json.Unmarshal(b, &back))
		gpu0 := back["gpus"].([]any)[0].(map[string]any)
		for _, k := range []string{"index", "name", "uuid", "pci_bus_id", "numa_node", "memory_total", "fabric"} {
			require.Contains(t, gpu0, k)
		}
		for _, k := range []string{"supported", "state", "status", "cluster_uuid", "clique_id", "usable"} {
			require.Contains(t, gpu0["fabric"], k)
		}
		var round TopologyInfo
		require.NoError(t, json.Unmarshal(b, &round))
		require.Equal(t, info, round)
	})
	t.Run("fabric in progress", func(t *testing.T) {
		t.Setenv("FAKENVML_FABRIC", "2")
		info, err := TopologyFrom(path)
		require.NoError(t, err)
		require.Equal(t, FabricStateInProgress, info.GPUs[0].Fabric.State)
		require.False(t, info.GPUs[0].Fabric.Usable)
		require.False(t, info.FabricCapable)
	})
	t.Run("no GPU", func(t *testing.T) {
		t.Setenv("FAKENVML_GPUS", "0")
		info, err := TopologyFrom(path)
		require.NoError(t, err)
		require.Empty(t, info.GPUs)
		require.NotNil(t, info.GPUs)
		require.Equal(t, "NVML sees no GPU", info.Reason)
	})
}

func TestFakeNVMLOldFabricQuery(t *testing.T) {
	path := fakeNVML(t, "FAKENVML_NO_FABRIC_V")
	t.Setenv("FAKENVML_FABRIC", "1")
	info, err := TopologyFrom(path)
	require.NoError(t, err)
	require.Len(t, info.GPUs, 2)
	require.Equal(t, Fabric{Supported: true, State: FabricStateCompleted, Status: "SUCCESS",
		ClusterUUID: "b0b1b2b3-b4b5-b6b7-b8b9-babbbcbdbebf", CliqueID: 5, Usable: true}, info.GPUs[1].Fabric)
	require.True(t, info.FabricCapable)
}
