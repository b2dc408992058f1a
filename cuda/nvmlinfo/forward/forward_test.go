package forward_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda/fakenvml"
)

// The committed nvml.h and forward_gen.c are what cmd/nvmlforward makes
// of the go-nvml version go.mod names: an upgrade fails here until
// go generate runs.
func TestGeneratedFilesUpToDate(t *testing.T) {
	out, err := exec.Command("go", "run", "../../../cmd/nvmlforward", "-dir", ".", "-check").CombinedOutput()
	require.NoError(t, err, "%s", out)
}

var (
	cCallRE    = regexp.MustCompile(`\bC\.(nvml[A-Za-z0-9_]+)\(`)
	forwardeRE = regexp.MustCompile(`(?m)^(?:nvmlReturn_t|const char\*) (nvml[A-Za-z0-9_]+)\(`)
)

// Every NVML function go-nvml's Go code calls has a forwarder, read from
// go-nvml's sources rather than from the header the generator used.
func TestEveryGoNVMLCallForwarded(t *testing.T) {
	dir, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml/pkg/nvml").Output()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(dir)), "*.go"))
	require.NoError(t, err)
	called := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range cCallRE.FindAllSubmatch(b, -1) {
			called[string(m[1])] = true
		}
	}
	require.Greater(t, len(called), 400, "go-nvml calls hundreds of NVML functions")

	gen, err := os.ReadFile("forward_gen.c")
	require.NoError(t, err)
	defined := map[string]bool{}
	for _, m := range forwardeRE.FindAllSubmatch(gen, -1) {
		defined[string(m[1])] = true
	}
	var missing []string
	for name := range called {
		if !defined[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "NVML functions go-nvml calls without a forwarder")
}

// buildCaller links testdata/callnvml.c with the forwarders alone: no
// NVML library at link time, no undefined nvml* symbol.
func buildCaller(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "callnvml")
	out, err := exec.Command("gcc", "-O1", "-Wall", "-Wno-deprecated-declarations", "-I.", "-o", bin,
		"testdata/callnvml.c", "forward.c", "forward_gen.c", "-ldl", "-pthread").CombinedOutput()
	require.NoError(t, err, "%s", out)
	nm, err := exec.Command("nm", "--undefined-only", bin).Output()
	require.NoError(t, err)
	require.NotRegexp(t, `\bnvml`, string(nm), "undefined nvml* symbols")
	return bin
}

func TestForwarders(t *testing.T) {
	bin := buildCaller(t)
	run := func(env []string) string {
		cmd := exec.Command(bin)
		// LD_BIND_NOW: every reference bound at load, as with RTLD_NOW.
		cmd.Env = append(env, "LD_BIND_NOW=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	// LD_LIBRARY_PATH to an empty directory: on a machine with the driver
	// the real library is still found, so its answer is only checked here.
	if _, err := exec.LookPath("nvidia-smi"); err != nil {
		require.Equal(t, "init=12 count=12:0 power=12 error_string=NVML library not found (libnvidia-ml.so.1)",
			run(os.Environ()), "no library: NVML_ERROR_LIBRARY_NOT_FOUND from every forwarder")
	}
	dir := fakenvml.Dir(t)
	require.Equal(t, "init=0 count=0:3 power=13 error_string=Function Not Found",
		run(fakenvml.Environ(dir, "FAKENVML_GPUS=3")),
		"the fake's functions answer; one it lacks is NVML_ERROR_FUNCTION_NOT_FOUND")
}
