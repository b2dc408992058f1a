package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	suite := flag.String("suite", "go", "the suite name written in front of each skip record")
	flag.Parse()

	var skipLog *os.File
	if path := os.Getenv("TENT_SKIP_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gotestreport:", err)
			os.Exit(2)
		}
		defer f.Close()
		skipLog = f
	}
	r := newReport(os.Stdout)
	if err := r.Read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "gotestreport:", err)
		os.Exit(2)
	}
	for _, s := range r.Skips() {
		if skipLog != nil {
			if _, err := fmt.Fprintf(skipLog, "%s: %s %s: %s\n", *suite, s.Package, s.Test, s.Reason); err != nil {
				fmt.Fprintln(os.Stderr, "gotestreport:", err)
				os.Exit(2)
			}
		}
	}
	if n := len(r.Skips()); n > 0 {
		fmt.Printf("SKIPPED: %d test(s) in %s did not run (listed above as --- SKIP)\n", n, *suite)
	}
	if r.Failed() {
		os.Exit(1)
	}
}
