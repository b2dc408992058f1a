package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Env names read by this package.
const (
	// SkipLogEnv names the file skips are appended to.
	SkipLogEnv = "TENT_SKIP_LOG"
	// CIEnv set to "true" turns every skip into a failure.
	CIEnv = "CI"
)

// Skip skips t with the reason (or fails it when CI=true), and records
// the skip in $TENT_SKIP_LOG. Like t.Skip, it does not return when it
// skips or fails a real test.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv(CIEnv) == "true" {
		t.Fatalf("%s (CI=true: a missing requirement fails the test instead of skipping it)", reason)
		return
	}
	if err := appendSkip(os.Getenv(SkipLogEnv), t.Name(), reason); err != nil {
		t.Logf("testenv: recording the skip in $%s: %v", SkipLogEnv, err)
	}
	t.Skip(reason)
}

// appendSkip adds "<test>: <reason>" to the log at path ("" does nothing).
// One write with O_APPEND, so parallel test processes do not interleave
// their lines.
func appendSkip(path, test, reason string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	line := test + ": " + strings.ReplaceAll(reason, "\n", " ") + "\n"
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// RequireBinary returns the path of the program name, or skips t (see
// Skip). It looks at $TENT_<NAME>_BIN (for "etcd", TENT_ETCD_BIN), then
// PATH, then /usr/bin and /usr/sbin (a PATH without sbin is common for
// non-root users).
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	path, reason := findBinary(name, os.Getenv(binEnv(name)), systemDirs())
	if path == "" {
		Skip(t, "%s", reason)
	}
	return path
}

// binEnv is the variable that overrides where name is found.
func binEnv(name string) string {
	up := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
	return "TENT_" + up + "_BIN"
}

// systemDirs are looked at after PATH.
func systemDirs() []string { return []string{"/usr/bin", "/usr/sbin"} }

// findBinary returns the path of name (override, when set, is the only
// place looked at; then PATH, then dirs), or "" and why it was not found.
func findBinary(name, override string, dirs []string) (path, reason string) {
	if override != "" {
		if isExecutable(override) {
			return override, ""
		}
		return "", fmt.Sprintf("%s: $%s=%q is not an executable file", name, binEnv(name), override)
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, ""
	}
	for _, dir := range dirs {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, ""
		}
	}
	hint := ""
	if pkg := debianPackage(name); pkg != "" {
		hint = fmt.Sprintf("; install it with: apt-get install %s", pkg)
	}
	return "", fmt.Sprintf("%s not found in PATH or %s (or set $%s)%s", name, strings.Join(dirs, ", "), binEnv(name), hint)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// debianPackage names the Debian package that ships a program the tests use.
func debianPackage(name string) string {
	switch name {
	case "etcd":
		return "etcd-server"
	case "iperf3":
		return "iperf3"
	case "stress-ng":
		return "stress-ng"
	}
	return ""
}
