package cshared

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Library describes one shared library to build from one C file.
type Library struct {
	Source  string   // the C file
	Out     string   // the library's path
	Soname  string   // DT_SONAME; empty for none
	Defines []string // each passed as -D<define>
	Libs    []string // extra linker arguments, e.g. -lpthread
}

// Build compiles lib with $CC (gcc when unset) at -O1 with -Wall. The
// error names the command and carries the compiler's output.
func Build(lib Library) error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-o", lib.Out}
	if lib.Soname != "" {
		args = append(args, "-Wl,-soname,"+lib.Soname)
	}
	for _, d := range lib.Defines {
		args = append(args, "-D"+d)
	}
	args = append(args, lib.Source)
	args = append(args, lib.Libs...)
	cmd := exec.Command(cc, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, stderr.String())
	}
	return nil
}
