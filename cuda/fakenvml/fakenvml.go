package fakenvml

import (
	"embed"
	"fmt"
	"github.com/tent-dev/tent/internal/cshared"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

//go:embed c/fakenvml.c
var source embed.FS

// LibName is the file name of the library, the one NVML users dlopen.
const LibName = "libnvidia-ml.so.1"

// Variants of the library: each leaves functions out.
const (
	WithoutFabricV = "FAKENVML_NO_FABRIC_V" // no nvmlDeviceGetGpuFabricInfoV
	WithoutNUMA    = "FAKENVML_NO_NUMA"     // no nvmlDeviceGetNumaNodeId
)

// Build compiles the fake into dir/libnvidia-ml.so.1 with gcc ($CC if
// set), defining each of defines, and returns the library's path.
func Build(dir string, defines ...string) (string, error) {
	src, err := source.ReadFile("c/fakenvml.c")
	if err != nil {
		return "", err
	}
	cfile := filepath.Join(dir, "fakenvml.c")
	if err := os.WriteFile(cfile, src, 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, LibName)
	err = cshared.Build(cshared.Library{Source: cfile, Out: out, Soname: LibName, Defines: defines})
	if err != nil {
		return "", fmt.Errorf("fakenvml: %w", err)
	}
	return out, os.Remove(cfile)
}

// Dir builds the fake (variant: defines) into a directory of t's, removed
// when t ends, and returns the directory.
func Dir(t testing.TB, defines ...string) string {
	t.Helper()
	d := t.TempDir()
	if _, err := Build(d, defines...); err != nil {
		t.Fatal(err)
	}
	return d
}

// Environ is the environment of a process that finds the fake in dir as
// its NVML: this process's environment without its FAKENVML_* settings,
// LD_LIBRARY_PATH with dir first, then the settings given
// ("FAKENVML_GPUS=4", ...).
func Environ(dir string, settings ...string) []string {
	var env []string
	path := dir
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "FAKENVML_"):
		case strings.HasPrefix(kv, "LD_LIBRARY_PATH="):
			if old := strings.TrimPrefix(kv, "LD_LIBRARY_PATH="); old != "" {
				path += ":" + old
			}
		default:
			env = append(env, kv)
		}
	}
	return append(append(env, "LD_LIBRARY_PATH="+path), settings...)
}
