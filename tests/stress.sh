#!/usr/bin/env bash
# make test-stress: the Go tests repeated while other processes keep the
# CPUs busy, to flush out tests that depend on timing. Runs
#
#   go test -race -count=20 ./metadata/etcd/   (20 runs in a row)
#   go test -race -count=3  ./...              (the whole Go suite, 3 runs)
#
# while `stress-ng --cpu N` (or, without stress-ng, N shell busy loops)
# keeps N CPUs busy (STRESS_CPUS, default 2). The load is stopped on every
# exit path: success, failure, Ctrl-C, SIGTERM. Full logs go to
# $STRESS_LOGDIR (default build/stress); the summary counts the tests that
# passed and failed, and the wall time of each step.
set -u -o pipefail
GO=${GO:-go}
CPUS=${STRESS_CPUS:-2}
LOGDIR=${STRESS_LOGDIR:-build/stress}
ETCD_COUNT=${STRESS_ETCD_COUNT:-20}
ALL_COUNT=${STRESS_ALL_COUNT:-3}
mkdir -p "$LOGDIR"

# Every background job gets its own process group (job control), so one
# kill of the group ends it and everything it started. The tests run in
# the background too, with the script waiting for them: bash runs a trap
# only between commands, and `wait` is one it interrupts at once.
set -m
pgids=()
stop_all() {
	local pg
	for pg in "${pgids[@]}"; do
		kill -TERM -- "-$pg" 2>/dev/null
	done
	for pg in "${pgids[@]}"; do
		wait "$pg" 2>/dev/null
	done
	pgids=()
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

if command -v stress-ng >/dev/null 2>&1; then
	# --timeout: even a leaked stress-ng stops within two hours.
	stress-ng --cpu "$CPUS" --timeout 2h --quiet &
	pgids+=("$!")
	echo "test-stress: load: stress-ng --cpu $CPUS (pid $!)"
else
	for _ in $(seq "$CPUS"); do
		bash -c 'while :; do :; done' &
		pgids+=("$!")
	done
	echo "test-stress: load: $CPUS shell busy loops (stress-ng not installed)"
fi

status=0
summary=()
# step NAME COUNT PACKAGES...: one go test run, logged, then counted.
step() {
	local name=$1 count=$2
	shift 2
	local log="$LOGDIR/$name.log" start end rc pass fail
	echo "test-stress: $GO test -race -count=$count $* (log: $log)"
	start=$(date +%s)
	$GO test -race -v -count="$count" -timeout 90m "$@" >"$log" 2>&1 &
	local pid=$!
	pgids+=("$pid")
	wait "$pid"
	rc=$?
	unset 'pgids[-1]'
	end=$(date +%s)
	pass=$(grep -c '^--- PASS' "$log")
	fail=$(grep -c '^--- FAIL' "$log")
	grep -E '^(--- FAIL|FAIL|panic:)' "$log" | head -20
	summary+=("$name: -count=$count: $pass passed, $fail failed (top-level tests), exit $rc, $((end - start)) s")
	if [ "$rc" -ne 0 ]; then
		status=1
	fi
}

step etcd "$ETCD_COUNT" ./metadata/etcd/
step all "$ALL_COUNT" ./...

echo "test-stress: summary (load: $CPUS CPUs busy)"
for line in "${summary[@]}"; do
	echo "  $line"
done
exit "$status"
