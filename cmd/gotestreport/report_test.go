package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goTestJSON runs `go test -json` on a throwaway module holding one test
// file, and returns its events: the report is tested on what go test
// really writes, not on hand-made lines.
func goTestJSON(t *testing.T, testFile string) []byte {
	t.Helper()
	return goTestJSONFiles(t, map[string]string{"sample_test.go": testFile})
}

// goTestJSONFiles is goTestJSON for a module of several files (name ->
// content; a name with a slash is in a subpackage), testing ./...
func goTestJSONFiles(t *testing.T, files map[string]string) []byte {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module sample\n\ngo 1.21\n"), 0o644))
	for name, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, _ := cmd.Output() // fails when a test fails; the events say why
	require.Contains(t, string(out), `"Action":`, "go test -json wrote no events")
	return out
}

func TestReportPrintsFailuresAndRecordsSkips(t *testing.T) {
	events := goTestJSON(t, `package sample

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet when passing") }

func TestFails(t *testing.T) { t.Error("the failure message") }

func TestSkips(t *testing.T) { t.Skip("no etcd here") }

func TestParent(t *testing.T) {
	t.Run("child", func(t *testing.T) { t.Skipf("child needs %s", "a GPU") })
}
`)
	var out bytes.Buffer
	r := newReport(&out)
	require.NoError(t, r.Read(bytes.NewReader(events)))

	assert.True(t, r.Failed())
	text := out.String()
	assert.Contains(t, text, "--- FAIL: TestFails")
	assert.Contains(t, text, "the failure message")
	assert.Contains(t, text, "--- SKIP: TestSkips")
	assert.Contains(t, text, "FAIL\tsample")
	assert.NotContains(t, text, "quiet when passing", "a passing test's log is printed only with -v")
	assert.NotContains(t, text, "=== RUN")

	require.Len(t, r.Skips(), 2)
	assert.Equal(t, Skip{Package: "sample", Test: "TestSkips", Reason: "sample_test.go:9: no etcd here"}, r.Skips()[0])
	assert.Equal(t, "TestParent/child", r.Skips()[1].Test)
	assert.Equal(t, "sample_test.go:12: child needs a GPU", r.Skips()[1].Reason)
}

func TestReportAllPassing(t *testing.T) {
	events := goTestJSON(t, `package sample

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet") }
`)
	var out bytes.Buffer
	r := newReport(&out)
	require.NoError(t, r.Read(bytes.NewReader(events)))

	assert.False(t, r.Failed())
	assert.Empty(t, r.Skips())
	assert.True(t, strings.HasPrefix(out.String(), "ok  \tsample\t"), "got %q", out.String())
}

func TestReportPackageWithoutTestsIsNotASkip(t *testing.T) {
	events := goTestJSONFiles(t, map[string]string{
		"sample_test.go": "package sample\n\nimport \"testing\"\n\nfunc TestPasses(t *testing.T) {}\n",
		"notests/lib.go": "package notests\n\nfunc F() int { return 1 }\n",
	})
	require.Contains(t, string(events), `"Package":"sample/notests"`, "go test did not list the package without tests")
	var out bytes.Buffer
	r := newReport(&out)
	require.NoError(t, r.Read(bytes.NewReader(events)))

	assert.False(t, r.Failed())
	assert.Empty(t, r.Skips(), "a package without test files skipped nothing")
	assert.Contains(t, out.String(), "sample/notests\t[no test files]")
}

func TestReportBuildFailure(t *testing.T) {
	events := goTestJSON(t, "package sample\n\nfunc TestBroken(t *testing.T) { undefined() }\n")
	var out bytes.Buffer
	r := newReport(&out)
	require.NoError(t, r.Read(bytes.NewReader(events)))

	assert.True(t, r.Failed())
	assert.Contains(t, out.String(), "undefined")
}

func TestReportPassesThroughNonJSONLines(t *testing.T) {
	var out bytes.Buffer
	r := newReport(&out)
	require.NoError(t, r.Read(strings.NewReader("go: cannot find main module\n")))
	assert.Equal(t, "go: cannot find main module\n", out.String())
}
