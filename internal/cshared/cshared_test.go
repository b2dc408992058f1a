package cshared

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuildsASharedLibraryWithItsSoname(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f.c")
	require.NoError(t, os.WriteFile(src, []byte("#ifdef WANT\nint f(void) { return 1; }\n#endif\n"), 0o644))
	out := filepath.Join(dir, "libf.so.1")
	require.NoError(t, Build(Library{Source: src, Out: out, Soname: "libf.so.1", Defines: []string{"WANT"}}))
	f, err := elf.Open(out)
	require.NoError(t, err)
	defer f.Close()
	require.Equal(t, elf.ET_DYN, f.Type)
	names, err := f.DynString(elf.DT_SONAME)
	require.NoError(t, err)
	require.Equal(t, []string{"libf.so.1"}, names)
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	found := false
	for _, s := range syms {
		found = found || s.Name == "f"
	}
	require.True(t, found, "the define did not reach the compiler")
}

func TestCompilerErrorNamesTheCommand(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bad.c")
	require.NoError(t, os.WriteFile(src, []byte("this is not C\n"), 0o644))
	err := Build(Library{Source: src, Out: filepath.Join(dir, "libbad.so")})
	require.Error(t, err)
	require.Contains(t, err.Error(), src)
	require.Contains(t, err.Error(), "error")
}
