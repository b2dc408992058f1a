#!/usr/bin/env bash
# tools/gotest.sh SUITE GO_TEST_ARGS... — `go test -json GO_TEST_ARGS`
# shown as plain go test output by cmd/gotestreport, which also lists every
# skipped test with its reason (and appends it to TENT_SKIP_LOG). Fails if
# go test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=$1
shift
go=${GO:-go}
report=build/gotestreport
mkdir -p build
"$go" build -o "$report" ./cmd/gotestreport
# The report records the skips (it reads TENT_SKIP_LOG itself); the tests
# do not also write them (internal/testenv would), so each is listed once.
TENT_SKIP_LOG= "$go" test -json "$@" | "$report" -suite "$suite"
