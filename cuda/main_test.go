package cuda_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/cuda"
	"github.com/tent-dev/tent/cuda/fakecuda"
)

// childEnv selects a child-process mode of the test binary (see childMain).
const childEnv = "TENT_FAKECUDA_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := childMain(mode); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", mode, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runChild re-executes the test binary in child mode with the fake's
// environment, extra environment entries and files (fd 3, 4, ...).
func runChild(t *testing.T, f *fakecuda.Fake, mode string, env []string, files ...*os.File) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(append(os.Environ(), f.Env()...), childEnv+"="+mode), env...)
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child %s:\n%s", mode, out)
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

// countFDs counts the open file descriptors of this process.
func countFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(ents) - 1, nil // minus the descriptor ReadDir itself used
}

func envInt(name string) (int, error) {
	v, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// childMain runs in a child process started by runChild; it loads the
// fake through cuda.Default (TENT_CUDA_DRIVER), like tent would.
func childMain(mode string) (rerr error) {
	d, err := cuda.Default()
	if err != nil {
		return err
	}
	f, err := fakecuda.Open(d.Path())
	if err != nil {
		return err
	}
	size, err := envInt("CHILD_SIZE")
	if err != nil {
		return err
	}
	dev, err := envInt("CHILD_DEV")
	if err != nil {
		return err
	}
	seed, err := envInt("CHILD_SEED")
	if err != nil {
		return err
	}
	if _, err := countFDs(); err != nil { // warm up whatever ReadDir sets up
		return err
	}
	before, err := countFDs()
	if err != nil {
		return err
	}
	defer func() {
		if rerr != nil {
			return
		}
		if err := d.Close(); err != nil {
			rerr = err
			return
		}
		c := f.Counters()
		if leaks := c.Leaks(); leaks != "" || c.Contexts != 0 {
			rerr = fmt.Errorf("leaks after release: %s contexts=%d\n%s", leaks, c.Contexts, f.Describe())
			return
		}
		after, err := countFDs()
		if err != nil {
			rerr = err
			return
		}
		want := before
		if mode != "fabric-read" {
			want-- // fd 3 was handed to ImportMapping, which closed it
		}
		if after != want {
			rerr = fmt.Errorf("open fds: %d before, %d after, want %d", before, after, want)
		}
	}()

	switch mode {
	case "map-write":
		// Import the exporter's fd 3, write a pattern through our own
		// mapping; the parent reads it back through its mapping.
		m, err := d.ImportMapping(3, uint64(size), dev)
		if err != nil {
			return err
		}
		if !m.HasHandle || m.FD != 3 || m.Reserved != uint64(size) || m.Mapped != uint64(size) || !m.Access {
			return fmt.Errorf("unexpected record %v", m)
		}
		isDev, pdev, base, psize, err := d.PointerInfo(m.Ptr() + 100)
		if err != nil {
			return err
		}
		if !isDev || pdev != 0 || base != m.Ptr() || psize != uint64(size) {
			// the memory belongs to the exporter's device 0 whatever device maps it
			return fmt.Errorf("PointerInfo = %v %d %#x %d", isDev, pdev, base, psize)
		}
		if err := d.CopyHtoD(m.Ptr(), pattern(byte(seed), size)); err != nil {
			return err
		}
		return m.Release()
	case "import-fail":
		// FAKECUDA_FAIL arms a failure; ImportMapping must undo its
		// steps and close fd 3.
		m, err := d.ImportMapping(3, uint64(size), dev)
		if err == nil {
			m.Release()
			return errors.New("ImportMapping succeeded despite FAKECUDA_FAIL")
		}
		want := os.Getenv("CHILD_WANT")
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("error %q does not mention %q", err, want)
		}
		if f.Counters().Failures != 1 {
			return fmt.Errorf("injected failures fired: %d", f.Counters().Failures)
		}
		return nil
	case "fabric-read":
		raw, err := hex.DecodeString(os.Getenv("CHILD_FABRIC"))
		if err != nil || len(raw) != cuda.FabricHandleSize {
			return fmt.Errorf("bad CHILD_FABRIC: %v", err)
		}
		var fh cuda.FabricHandle
		copy(fh[:], raw)
		m, err := d.ImportFabricMapping(fh, uint64(size), dev)
		if err != nil {
			return err
		}
		got := make([]byte, size)
		if err := d.CopyDtoH(got, m.Ptr()); err != nil {
			return err
		}
		if !bytes.Equal(got, pattern(byte(seed), size)) {
			return errors.New("fabric mapping does not show the exporter's pattern")
		}
		return m.Release()
	}
	return fmt.Errorf("unknown mode %q", mode)
}
