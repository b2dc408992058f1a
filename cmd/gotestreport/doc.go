// Command gotestreport reads `go test -json` events on stdin and prints
// what a plain `go test` prints (ok/FAIL per package, the output of failing
// tests), plus every skipped test with its reason, loudly: a test that
// skipped is a test that did not run. With TENT_SKIP_LOG set, each skip is
// also appended there as "<suite>: <package> <test>: <reason>", the file
// `make test` summarizes at the end.
//
//	go test -json ./... | go run ./cmd/gotestreport -suite test-go
//
// It exits 1 when any test or package failed (tools/gotest.sh also checks
// go test's own exit status).
package main
