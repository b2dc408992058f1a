package nvmlinfo

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda/fakenvml"
	"github.com/tent-dev/tent/cuda/nvmlinfo/forward"
)

// childEnv makes the test binary a child process that prints what NVML
// answers (childReport) as one JSON line and exits.
const childEnv = "TENT_NVMLINFO_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		b, err := json.Marshal(childQuery())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(string(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childReport is what a child process found: the topology, then direct
// go-nvml calls of functions the fake lacks (their NVML return codes).
type childReport struct {
	Topology TopologyInfo `json:"topology"`
	// PowerUsage is nvmlDeviceGetPowerUsage(GPU 0), absent from the fake.
	PowerUsage nvml.Return `json:"power_usage"`
	// NumaNode is nvmlDeviceGetNumaNodeId(GPU 0) as go-nvml returns it.
	NumaNode nvml.Return `json:"numa_node"`
	// ErrorString of a missing function's code, from the library.
	ErrorString string `json:"error_string"`
	// LibraryState is what tent's forwarders found.
	LibraryState forward.LibraryState `json:"library_state"`
}

func childQuery() childReport {
	var rep childReport
	rep.Topology, _ = Topology()
	if nvml.Init() == nvml.SUCCESS {
		if dev, r := nvml.DeviceGetHandleByIndex(0); r == nvml.SUCCESS {
			_, rep.PowerUsage = dev.GetPowerUsage()
			_, rep.NumaNode = dev.GetNumaNodeId()
		}
		rep.ErrorString = nvml.ErrorString(nvml.ERROR_FUNCTION_NOT_FOUND)
		_ = nvml.Shutdown()
	}
	rep.LibraryState = forward.State()
	return rep
}

// inChild runs childQuery in a new process whose NVML is the fake built in
// dir, with the FAKENVML_* settings given.
func inChild(t *testing.T, dir string, settings ...string) childReport {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(fakenvml.Environ(dir, settings...), childEnv+"=1")
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "child: %s", stderr)
	var rep childReport
	require.NoError(t, json.Unmarshal(out, &rep), "child output %q", out)
	return rep
}

func TestFakeNVML(t *testing.T) {
	dir := fakenvml.Dir(t)
	t.Run("init fails", func(t *testing.T) {
		rep := inChild(t, dir, "FAKENVML_INIT_ERROR=9")
		require.Empty(t, rep.Topology.GPUs)
		require.NotNil(t, rep.Topology.GPUs)
		require.Equal(t, "nvmlInit: the NVIDIA driver is not loaded: no GPU topology", rep.Topology.Reason)
		require.Equal(t, forward.Found, rep.LibraryState)
	})
	t.Run("no fabric", func(t *testing.T) {
		rep := inChild(t, dir)
		info := rep.Topology
		require.Empty(t, info.Reason)
		require.Equal(t, "555.42.06", info.DriverVersion)
		require.Equal(t, 12050, info.CUDADriverVersion)
		require.Len(t, info.GPUs, 2)
		for i, g := range info.GPUs {
			require.Equal(t, GPU{
				Index: i, Name: fmt.Sprintf("NVIDIA Fake H100 %d", i),
				UUID:     fmt.Sprintf("GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfe%02x", i),
				PCIBusID: []string{"00000000:1A:00.0", "00000000:1B:00.0"}[i], PCIDeviceID: 0x233510de,
				NUMANode: 0, MemoryTotal: 80 << 30, Fabric: Fabric{State: FabricStateNotSupported},
			}, g)
		}
		require.False(t, info.FabricCapable)
		// A function the fake lacks is an error through go-nvml, not a crash.
		require.Equal(t, nvml.ERROR_FUNCTION_NOT_FOUND, rep.PowerUsage)
		require.Equal(t, nvml.SUCCESS, rep.NumaNode)
		require.Equal(t, forward.Found, rep.LibraryState)
	})
	t.Run("NUMA nodes", func(t *testing.T) {
		rep := inChild(t, dir, "FAKENVML_GPUS=4", "FAKENVML_NUMA=1,0,-,3")
		var nodes []int
		for _, g := range rep.Topology.GPUs {
			nodes = append(nodes, g.NUMANode)
		}
		require.Equal(t, []int{1, 0, -1, 3}, nodes, "a GPU whose node NVML does not know is -1")
		require.Empty(t, rep.Topology.Reason)
	})
	t.Run("fabric registered", func(t *testing.T) {
		rep := inChild(t, dir, "FAKENVML_FABRIC=1", "FAKENVML_GPUS=4")
		info := rep.Topology
		require.Len(t, info.GPUs, 4)
		for _, g := range info.GPUs {
			require.Equal(t, Fabric{Supported: true, State: FabricStateCompleted, Status: "SUCCESS",
				ClusterUUID: "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", CliqueID: 7, Usable: true}, g.Fabric)
		}
		require.True(t, info.FabricCapable)

		b, err := info.JSON()
		require.NoError(t, err)
		var back map[string]any
		require.NoError(t, json.Unmarshal(b, &back))
		gpu0 := back["gpus"].([]any)[0].(map[string]any)
		for _, k := range []string{"index", "name", "uuid", "pci_bus_id", "pci_device_id", "numa_node", "memory_total", "fabric"} {
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
		info := inChild(t, dir, "FAKENVML_FABRIC=2").Topology
		require.Equal(t, FabricStateInProgress, info.GPUs[0].Fabric.State)
		require.False(t, info.GPUs[0].Fabric.Usable)
		require.False(t, info.FabricCapable)
	})
	t.Run("no GPU", func(t *testing.T) {
		info := inChild(t, dir, "FAKENVML_GPUS=0").Topology
		require.Empty(t, info.GPUs)
		require.NotNil(t, info.GPUs)
		require.Equal(t, "NVML sees no GPU", info.Reason)
	})
}

// An older driver: no nvmlDeviceGetGpuFabricInfoV, no NUMA query.
func TestFakeNVMLOldDriver(t *testing.T) {
	dir := fakenvml.Dir(t, fakenvml.WithoutFabricV, fakenvml.WithoutNUMA)
	rep := inChild(t, dir, "FAKENVML_FABRIC=1")
	info := rep.Topology
	require.Len(t, info.GPUs, 2)
	require.Equal(t, Fabric{Supported: true, State: FabricStateCompleted, Status: "SUCCESS",
		ClusterUUID: "b0b1b2b3-b4b5-b6b7-b8b9-babbbcbdbebf", CliqueID: 5, Usable: true}, info.GPUs[1].Fabric)
	require.True(t, info.FabricCapable)
	require.Equal(t, -1, info.GPUs[0].NUMANode)
	require.Equal(t, nvml.ERROR_FUNCTION_NOT_FOUND, rep.NumaNode)
	require.Equal(t, "Function Not Found", rep.ErrorString, "the fake's nvmlErrorString answers")
}

// This process: no NVML on the machine gives an empty topology with the
// reason; a machine with the driver shows its GPUs.
func TestTopologyOfThisMachine(t *testing.T) {
	info, err := Topology()
	require.NoError(t, err)
	switch forward.State() {
	case forward.Found:
		require.NotEmpty(t, info.DriverVersion)
		for _, g := range info.GPUs {
			require.NotEmpty(t, g.Name)
			require.True(t, strings.HasPrefix(g.UUID, "GPU-"), g.UUID)
			require.NotEmpty(t, g.PCIBusID)
		}
		if len(info.GPUs) == 0 {
			require.NotEmpty(t, info.Reason, "an empty topology says why")
		}
		t.Logf("NVML: driver %s, %d GPU(s), reason %q", info.DriverVersion, len(info.GPUs), info.Reason)
	default:
		// go-nvml found no library, so no forwarder ran either.
		require.Empty(t, info.GPUs)
		require.NotNil(t, info.GPUs)
		require.False(t, info.FabricCapable)
		require.Equal(t, "no NVML (libnvidia-ml.so.1 not found): no GPU topology", info.Reason)
		b, err := info.JSON()
		require.NoError(t, err)
		require.JSONEq(t, `{"driver_version":"","cuda_driver_version":0,"gpus":[],"fabric_capable":false,
			"reason":"no NVML (libnvidia-ml.so.1 not found): no GPU topology"}`, string(b))
	}
}

// Concurrent queries share go-nvml's process-wide library (run with -race).
func TestConcurrentTopology(t *testing.T) {
	var wg sync.WaitGroup
	infos := make([]TopologyInfo, 8)
	for i := range infos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], _ = Topology()
		}()
	}
	wg.Wait()
	for _, info := range infos[1:] {
		require.Equal(t, infos[0], info)
	}
}

func TestZeroValueJSON(t *testing.T) {
	b, err := json.Marshal(TopologyInfo{})
	require.NoError(t, err)
	require.Contains(t, string(b), `"gpus":[]`)
	b, err = json.Marshal(&TopologyInfo{Reason: "x"})
	require.NoError(t, err)
	require.Contains(t, string(b), `"gpus":[]`)
}
