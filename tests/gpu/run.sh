#!/usr/bin/env bash
# tests/gpu/run.sh [--fake DIR] [GPUCHECK_FLAG...] — tent's GPU check, one
# JSON report. Needs no Go toolchain: it runs what `make gpu-build` put in
# build/gpu/ (gpucheck, and the Go test binaries nvmlinfo.test, cuda.test),
# and python3 to assemble the report.
#
#   On a GPU machine:   bash tests/gpu/run.sh
#   Dry run here:       make gpu-dry-run   (= run.sh --fake build/gpu/fake:
#                       the fake CUDA driver and the fake NVML built there)
#
# Steps: the machine (nvidia-smi, CPUs), gpucheck (cmd/gpucheck: VRAM to
# VRAM 4 KiB..1 GiB between two processes beside cuMemcpyDtoD, host to
# VRAM, tcp staging, registration and locations, uninstall and destroy
# under load with fds, cuMemGetInfo and allocations back to baseline, the
# go-nvml topology), then the Go tests that run against this machine's
# driver. The report: $OUT/gpu-report.json when OUT is set (the device
# machine), else build/gpu/gpu-report.json; logs beside it. Exit 0 when
# every step passed. The whole run is bounded (under 8 minutes).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=build/gpu
fake=""
if [ "${1:-}" = "--fake" ]; then
  fake=$(cd "$2" && pwd)
  shift 2
fi
out=${OUT:-$bin}
mkdir -p "$out"
report=$out/gpu-report.json
for f in gpucheck nvmlinfo.test cuda.test; do
  [ -x "$bin/$f" ] || { echo "run.sh: $bin/$f missing: run make gpu-build first" >&2; exit 2; }
done

args=("$@")
if [ -n "$fake" ]; then
  # The fake driver: host memory behind the CUDA API (memfd allocations
  # shared across processes), no cuMemGetInfo; the fake NVML on the
  # loader's path as libnvidia-ml.so.1, as the real one would be.
  export TENT_CUDA_DRIVER=$fake/libfakecuda.so FAKECUDA_DEVICES=2 FAKECUDA_GRANULARITY=2097152
  export LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FAKENVML_GPUS=2 FAKENVML_NUMA=0,1 FAKENVML_FABRIC=1
  args=(-no-meminfo "${args[@]}")
fi

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; echo "cpus: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
} > "$out/machine.txt" 2>&1

echo "== gpucheck ${args[*]}"
timeout 420 "$bin/gpucheck" "${args[@]}" > "$out/gpucheck.json" 2> "$out/gpucheck.log"
gpucheck_rc=$?
echo "gpucheck: exit $gpucheck_rc"

# The Go tests whose subject is this machine's driver and NVML (with the
# real driver they take its side; the fake-NVML child tests need gcc).
gotest() { # NAME BINARY RUN
  echo "== $1: $2 -test.run '$3'"
  (cd "$(dirname "$2")" && timeout 120 "./$(basename "$2")" -test.v -test.count=1 -test.run "$3") > "$out/$1.log" 2>&1
  echo "$1: exit $?" | tee -a "$out/tests.txt"
}
: > "$out/tests.txt"
nvml_tests='TestTopologyOfThisMachine|TestConcurrentTopology'
command -v "${CC:-gcc}" >/dev/null && nvml_tests="$nvml_tests|TestFakeNVML"
gotest nvmlinfo "$bin/nvmlinfo.test" "$nvml_tests"
gotest cuda "$bin/cuda.test" 'TestDefaultWithoutDriver|TestLoadMissing'

python3 - "$out" "$gpucheck_rc" "$fake" > "$report" <<'PY'
import json, os, re, sys
out, rc, fake = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def read(name):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read()
    except OSError as e:
        return f"missing: {e}"
try:
    check = json.loads(read("gpucheck.json"))
except ValueError:
    check = {"ok": False, "errors": ["gpucheck printed no JSON"], "log_tail": read("gpucheck.log")[-4000:]}
tests = {}
for line in read("tests.txt").splitlines():
    m = re.match(r"(\S+): exit (\d+)", line)
    if m:
        log = read(m.group(1) + ".log")
        tests[m.group(1)] = {"exit": int(m.group(2)),
                             "passed": re.findall(r"--- PASS: (\S+)", log),
                             "failed": re.findall(r"--- FAIL: (\S+)", log),
                             "skipped": re.findall(r"--- SKIP: (\S+)", log)}
ok = rc == 0 and check.get("ok") is True and all(t["exit"] == 0 and t["passed"] for t in tests.values())
json.dump({"ok": ok, "fake": bool(fake), "machine": read("machine.txt"), "gpucheck_exit": rc,
           "gpucheck": check, "tests": tests}, sys.stdout, indent=2)
print()
PY
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("report:", sys.argv[1], "ok:", r["ok"]); sys.exit(0 if r["ok"] else 1)' "$report"
