#!/usr/bin/env bash
# Measures the tcp transport against one iperf3 stream on loopback, in the
# same run, alternating the two so that a noisy machine affects both.
#
#   bench/go/tcp_iperf3.sh [ROUNDS] [BENCH-REGEXP]   (go test -bench in transport/tcp)
#
# Prints iperf3's GB/s before and after each round of `go test -bench`.
# iperf3 cycles one hot 128 KiB buffer; TENT_BENCH_SPAN_MIB=1 makes the
# benchmark do the same (requests reuse the same memory), the default
# moves 128 MiB of real memory on each side.
set -euo pipefail
rounds=${1:-2}
pattern=${2:-Transfer}
cd "$(dirname "$0")/../../transport/tcp"
bin=$(mktemp -d)/tcp.test
go test -c -o "$bin" .
port=$((20000 + RANDOM % 20000))
iperf() {
	iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	local srv=$!
	sleep 0.3
	iperf3 -c 127.0.0.1 -p "$port" -t 3 -f g | awk '/receiver/ {printf "iperf3 1 stream: %.2f GB/s\n", $7/8}'
	wait "$srv" || true
}
for r in $(seq "$rounds"); do
	echo "== round $r, $(uptime | sed 's/.*load/load/')"
	iperf
	"$bin" -test.run '^$' -test.bench "$pattern" -test.benchtime "${BENCHTIME:-2s}" | grep -E '^Benchmark' |
		awk '{ for (i = 3; i <= NF; i++) v[$i] = $(i-1)
		       printf "%-40s %7s GB/s  %6s cpu-s/GB  p50 %9s µs  p99 %9s µs\n", $1, v["GB/s"], v["cpu-s/GB"], v["p50-µs"], v["p99-µs"] }'
	iperf
done
