// Command nvmlforward generates package cuda/nvmlinfo/forward's C
// forwarders: one definition for every function of go-nvml's nvml.h, with
// the header's own signature, that resolves the real function with dlsym
// from the NVML library the package opens once (see forward/doc.go).
//
//	go run ./cmd/nvmlforward [-dir cuda/nvmlinfo/forward] [-check]
//
// It finds the nvml.h of the go-nvml version go.mod names (go list), runs
// the C preprocessor on it with go-nvml's own flags
// (-DNVML_NO_UNVERSIONED_FUNC_DEFS=1), so the declarations are exactly the
// ones go-nvml's cgo code sees, and writes dir/nvml.h (the header, as is:
// the forwarders are compiled against it) and dir/forward_gen.c. With
// -check it writes nothing and exits 1 when either file differs from what
// it would write: a go-nvml upgrade without `go generate` fails that check.
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

const goNVMLPackage = "github.com/NVIDIA/go-nvml/pkg/nvml"

func main() {
	dir := flag.String("dir", "cuda/nvmlinfo/forward", "package directory to write nvml.h and forward_gen.c into")
	check := flag.Bool("check", false, "write nothing; exit 1 when the files are not up to date")
	flag.Parse()
	if err := run(*dir, *check); err != nil {
		fmt.Fprintln(os.Stderr, "nvmlforward:", err)
		os.Exit(1)
	}
}

func run(dir string, check bool) error {
	hdrDir, version, err := goNVML()
	if err != nil {
		return err
	}
	header, err := os.ReadFile(filepath.Join(hdrDir, "nvml.h"))
	if err != nil {
		return err
	}
	protos, err := prototypes(filepath.Join(hdrDir, "nvml.h"))
	if err != nil {
		return err
	}
	src, err := generate(protos, version, header)
	if err != nil {
		return err
	}
	files := map[string][]byte{"nvml.h": header, "forward_gen.c": src}
	var stale []string
	for name, want := range files {
		path := filepath.Join(dir, name)
		if check {
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, want) {
				stale = append(stale, path)
			}
			continue
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			return err
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%s not generated from go-nvml %s (%d functions): run go generate ./cuda/nvmlinfo/forward",
			strings.Join(stale, ", "), version, len(protos))
	}
	return nil
}

// goNVML returns the directory of go-nvml's nvml package and the module
// version, as the go command resolves them for this module.
func goNVML() (dir, version string, err error) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}} {{.Module.Version}}", goNVMLPackage).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", "", fmt.Errorf("go list %s: %v\n%s", goNVMLPackage, err, ee.Stderr)
		}
		return "", "", fmt.Errorf("go list %s: %v", goNVMLPackage, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return "", "", fmt.Errorf("go list %s: unexpected output %q", goNVMLPackage, out)
	}
	return f[0], f[1], nil
}

// proto is one function declaration of nvml.h.
type proto struct {
	ret    string   // "nvmlReturn_t" or "const char*"
	name   string   // nvmlDeviceGetName
	params []string // each with its declarator renamed a0, a1, ...; empty for (void)
}

var (
	// One declaration: what stands between two of ';', '{', '}'.
	declRE  = regexp.MustCompile(`^\s*((?:__attribute__\(\(deprecated\)\)\s*)?)([A-Za-z_][A-Za-z0-9_ ]*?\s*\*?)\s*\b(nvml[A-Za-z0-9_]+)\s*\(([^()]*)\)\s*$`)
	splitRE = regexp.MustCompile(`[;{}]`)
	paramRE = regexp.MustCompile(`^(.*?)\b([A-Za-z_][A-Za-z0-9_]*)\s*(\[[^\]]*\])?$`)
	spaceRE = regexp.MustCompile(`\s+`)
)

// prototypes preprocesses the header as go-nvml's cgo preamble does and
// parses every function declaration named nvml*.
func prototypes(header string) ([]proto, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	cmd := exec.Command(cc, "-E", "-P", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", header)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -E %s: %v\n%s", cc, header, err, stderr.String())
	}
	text := spaceRE.ReplaceAllString(string(out), " ")
	var protos []proto
	seen := map[string]bool{}
	for _, stmt := range splitRE.Split(text, -1) {
		m := declRE.FindStringSubmatch(stmt)
		if m == nil {
			continue
		}
		ret := strings.TrimSpace(m[2])
		p := proto{ret: strings.ReplaceAll(ret, " *", "*"), name: m[3]}
		if p.ret != "nvmlReturn_t" && p.ret != "const char*" {
			return nil, fmt.Errorf("%s returns %q: the generator knows what an absent function returns only for nvmlReturn_t and const char*", p.name, ret)
		}
		if seen[p.name] {
			return nil, fmt.Errorf("%s declared twice", p.name)
		}
		seen[p.name] = true
		params := strings.TrimSpace(m[4])
		if params != "void" && params != "" {
			for i, prm := range strings.Split(params, ",") {
				pm := paramRE.FindStringSubmatch(strings.TrimSpace(prm))
				if pm == nil || strings.TrimSpace(pm[1]) == "" {
					return nil, fmt.Errorf("%s: parameter %q has no name", p.name, prm)
				}
				p.params = append(p.params, fmt.Sprintf("%s a%d%s", strings.TrimSpace(pm[1]), i, pm[3]))
			}
		}
		protos = append(protos, p)
	}
	if len(protos) == 0 {
		return nil, fmt.Errorf("%s: no nvml* function declarations found", header)
	}
	return protos, nil
}

func generate(protos []proto, version string, header []byte) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `// Code generated by cmd/nvmlforward from go-nvml %s's nvml.h (sha256 %x); DO NOT EDIT.
//
// One forwarder for each of the %d functions of nvml.h: it resolves the
// function in the NVML library (tent_nvml_resolve, forward.c) and calls it,
// or returns what NVML returns for a missing library or function.

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1 /* go-nvml's declarations, versioned names as they are */
#include "nvml.h"
#include "forward.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
`, version, sha256.Sum256(header), len(protos))
	for _, p := range protos {
		args := make([]string, len(p.params))
		for i := range p.params {
			args[i] = fmt.Sprintf("a%d", i)
		}
		params := "void"
		if len(p.params) > 0 {
			params = strings.Join(p.params, ", ")
		}
		fmt.Fprintf(&b, "\n%s %s(%s) {\n", p.ret, p.name, params)
		fmt.Fprintf(&b, "\tstatic void *slot;\n\tvoid *fn;\n")
		fmt.Fprintf(&b, "\tnvmlReturn_t r = tent_nvml_resolve(%q, &slot, &fn);\n", p.name)
		switch p.ret {
		case "nvmlReturn_t":
			fmt.Fprintf(&b, "\tif (r != NVML_SUCCESS) return r;\n")
		case "const char*":
			fmt.Fprintf(&b, "\tif (r != NVML_SUCCESS) return tent_nvml_missing_string(r);\n")
		}
		fmt.Fprintf(&b, "\treturn ((__typeof__(&%s))fn)(%s);\n}\n", p.name, strings.Join(args, ", "))
	}
	return b.Bytes(), nil
}
