package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/logsink"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestProcessLogDefaults(t *testing.T) {
	var stderr bytes.Buffer
	p := openProcessLog(env(nil), &stderr)
	require.Equal(t, logsink.Warn, p.Level())
	p.Logger().Info("hidden")
	p.Logger().Warn("shown")
	require.NotContains(t, stderr.String(), "hidden")
	require.Contains(t, stderr.String(), "level=WARN msg=shown")
}

func TestProcessLogLevelFromEnv(t *testing.T) {
	for in, want := range map[string]logsink.Level{"debug": logsink.Debug, "info": logsink.Info, "ERROR": logsink.Error, "off": logsink.Off} {
		var stderr bytes.Buffer
		p := openProcessLog(env(map[string]string{"TENT_LOG": in}), &stderr)
		require.Equal(t, want, p.Level(), in)
		require.Empty(t, stderr.String(), in)
	}
}

func TestProcessLogBadLevelWarnsAndKeepsDefault(t *testing.T) {
	var stderr bytes.Buffer
	p := openProcessLog(env(map[string]string{"TENT_LOG": "loud"}), &stderr)
	require.Equal(t, logsink.Warn, p.Level())
	require.Contains(t, stderr.String(), "level=WARN")
	require.Contains(t, stderr.String(), `TENT_LOG: unknown log level \"loud\"`)
}

func TestProcessLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tent.log")
	var stderr bytes.Buffer
	p := openProcessLog(env(map[string]string{"TENT_LOG": "debug", "TENT_LOG_FILE": path}), &stderr)
	p.Logger().Debug("into the file")
	p.SetCallback(func(logsink.Level, string) {})
	p.SetWriter(p.defaultOut) // what tent_log_set_callback(NULL) does
	p.Logger().Debug("back in the file")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), `msg="into the file"`)
	require.Contains(t, string(b), `msg="back in the file"`)
	require.Empty(t, stderr.String())
}

func TestProcessLogUnwritableFileWarns(t *testing.T) {
	var stderr bytes.Buffer
	p := openProcessLog(env(map[string]string{"TENT_LOG_FILE": filepath.Join(t.TempDir(), "no", "such", "dir")}), &stderr)
	require.Contains(t, stderr.String(), "TENT_LOG_FILE")
	require.Contains(t, stderr.String(), "logging to stderr")
	p.Logger().Warn("still here")
	require.Contains(t, stderr.String(), "msg=\"still here\"")
}
