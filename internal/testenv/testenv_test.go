package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the goroutine, so the behaviour can be checked.
type recorder struct {
	testing.TB
	name    string
	skipped string
	failed  string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Name() string                      { return r.name }
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }
func (r *recorder) Logf(string, ...any)               {}

func TestSkipWritesTheLogAndSkips(t *testing.T) {
	log := filepath.Join(t.TempDir(), "skips")
	t.Setenv(SkipLogEnv, log)
	t.Setenv(CIEnv, "")
	r := &recorder{TB: t, name: "TestThing/sub"}
	Skip(r, "no %s here", "widget")
	require.Equal(t, "no widget here", r.skipped)
	require.Empty(t, r.failed)
	Skip(&recorder{TB: t, name: "TestOther"}, "line one\nline two")
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	require.Equal(t, "TestThing/sub: no widget here\nTestOther: line one line two\n", string(b))
}

func TestSkipWithoutLog(t *testing.T) {
	t.Setenv(SkipLogEnv, "")
	t.Setenv(CIEnv, "false")
	r := &recorder{TB: t, name: "TestX"}
	Skip(r, "missing")
	require.Equal(t, "missing", r.skipped)
}

func TestSkipFailsInCI(t *testing.T) {
	log := filepath.Join(t.TempDir(), "skips")
	t.Setenv(SkipLogEnv, log)
	t.Setenv(CIEnv, "true")
	r := &recorder{TB: t, name: "TestY"}
	Skip(r, "etcd not found")
	require.Empty(t, r.skipped)
	require.Contains(t, r.failed, "etcd not found")
	require.Contains(t, r.failed, "CI=true")
	_, err := os.Stat(log)
	require.True(t, os.IsNotExist(err), "a failure is not logged as a skip")
}

// Parallel skips append whole lines.
func TestSkipLogParallel(t *testing.T) {
	log := filepath.Join(t.TempDir(), "skips")
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, appendSkip(log, "TestP", strings.Repeat("r", 200)))
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	require.Len(t, lines, 50)
	for _, l := range lines {
		require.Equal(t, "TestP: "+strings.Repeat("r", 200), l)
	}
}

func TestRequireBinary(t *testing.T) {
	t.Setenv(CIEnv, "")
	t.Setenv(SkipLogEnv, "")
	// sh is on every machine these tests run on.
	r := &recorder{TB: t, name: "TestSh"}
	p := RequireBinary(r, "sh")
	require.NotEmpty(t, p)
	require.Empty(t, r.skipped)

	r = &recorder{TB: t, name: "TestNone"}
	require.Empty(t, RequireBinary(r, "tent-no-such-program"))
	require.Contains(t, r.skipped, "tent-no-such-program not found")
	require.Contains(t, r.skipped, "TENT_TENT_NO_SUCH_PROGRAM_BIN")

	// The override is the only place looked at.
	t.Setenv("TENT_SH_BIN", filepath.Join(t.TempDir(), "missing"))
	r = &recorder{TB: t, name: "TestOverride"}
	require.Empty(t, RequireBinary(r, "sh"))
	require.Contains(t, r.skipped, "TENT_SH_BIN")
	exe, err := os.Executable()
	require.NoError(t, err)
	t.Setenv("TENT_SH_BIN", exe)
	require.Equal(t, exe, RequireBinary(&recorder{TB: t, name: "TestOverride2"}, "sh"))
}

func TestFindBinaryHint(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	empty := []string{t.TempDir()}
	_, reason := findBinary("etcd", "", empty)
	require.Contains(t, reason, "etcd not found")
	require.Contains(t, reason, "apt-get install etcd-server")
	_, reason = findBinary("tent-unknown", "", empty)
	require.NotContains(t, reason, "apt-get")
}

func TestServerAddrIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	for range 20 {
		addr := ServerAddr(t)
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(port)
		if lo-firstServerPort >= 1000 && (p < firstServerPort || p >= lo) {
			t.Fatalf("port %d outside [%d, %d)", p, firstServerPort, lo)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("ServerAddr gave %s, which cannot be bound: %v", addr, err)
		}
		l.Close()
	}
}
