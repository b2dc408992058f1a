#!/usr/bin/env bash
# tests/nvml/test_nvml.sh LIB — libtent.so and NVML (go-nvml with the
# forwarders of cuda/nvmlinfo/forward):
#   - no undefined and no exported nvml* symbol;
#   - Python's ctypes (RTLD_NOW) loads it without NVML, with and without
#     LD_BIND_NOW=1, and the topology says there is no NVML;
#   - with the fake libnvidia-ml.so.1 (cuda/fakenvml) on LD_LIBRARY_PATH,
#     the topology is exactly what the fake reports, from Python and from a
#     C++ program linked with plain -ltent, for the current and an older
#     driver (functions it lacks are errors, not crashes).
# On a machine with the NVIDIA driver the no-NVML checks cannot hide it:
# there they check the real topology's shape instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=${1:-build/libtent.so}
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

undefined=$(nm -D --undefined-only "$lib" | grep -c nvml || true)
exported=$(nm -D --defined-only "$lib" | grep -c nvml || true)
echo "nvml* symbols of $lib: $undefined undefined, $exported exported"
[ "$undefined" = 0 ] && [ "$exported" = 0 ] || { echo "FAIL: libtent.so must neither need nor export nvml*" >&2; exit 1; }

# The C++ program: nothing but -ltent on the link line.
${CXX:-g++} -std=c++17 -Wall -Wextra -Werror -Iinclude -o "$work/topology" tests/nvml/topology.cc \
  -L"$(dirname "$lib")" -ltent -Wl,-rpath,"$(cd "$(dirname "$lib")" && pwd)"

if [ -e /dev/nvidiactl ] || grep -q 'libnvidia-ml\.so\.1 ' <<<"$(ldconfig -p 2>/dev/null)"; then
  for bind in "" 1; do
    LD_BIND_NOW=$bind "$py" -c 'import ctypes, json, sys; sys.path.insert(0, "tests/nvml"); import check_topology as c
t = c.from_lib(sys.argv[1]); assert isinstance(t["gpus"], list) and all(g["uuid"].startswith("GPU-") for g in t["gpus"]), t
print("ok: real NVML,", len(t["gpus"]), "GPU(s)")' "$lib"
  done
else
  for bind in "" 1; do
    echo "no NVML, LD_BIND_NOW=${bind:-unset}:"
    LD_BIND_NOW=$bind "$py" tests/nvml/check_topology.py --from-lib "$lib" --no-nvml
    LD_BIND_NOW=$bind "$work/topology" | "$py" tests/nvml/check_topology.py --from-stdin --no-nvml
  done
fi

cc=${CC:-gcc}
mkdir -p "$work/fake" "$work/old"
"$cc" -shared -fPIC -O1 -Wall -o "$work/fake/libnvidia-ml.so.1" cuda/fakenvml/c/fakenvml.c
"$cc" -shared -fPIC -O1 -Wall -DFAKENVML_NO_FABRIC_V -DFAKENVML_NO_NUMA -o "$work/old/libnvidia-ml.so.1" cuda/fakenvml/c/fakenvml.c

check() { # DIR FLAGS SETTINGS...
  local dir=$1 flags=$2
  shift 2
  echo "fake NVML ($(basename "$dir")) $*:"
  env LD_LIBRARY_PATH="$dir" LD_BIND_NOW=1 "$@" "$py" tests/nvml/check_topology.py --from-lib "$lib" $flags
  env LD_LIBRARY_PATH="$dir" LD_BIND_NOW=1 "$@" "$work/topology" | env "$@" "$py" tests/nvml/check_topology.py --from-stdin $flags
}
check "$work/fake" "" FAKENVML_GPUS=2
check "$work/fake" "" FAKENVML_GPUS=4 FAKENVML_NUMA=1,0,-,3 FAKENVML_FABRIC=1
check "$work/fake" "" FAKENVML_GPUS=3 FAKENVML_FABRIC=2
check "$work/fake" "" FAKENVML_GPUS=0
check "$work/old" --old-driver FAKENVML_GPUS=2 FAKENVML_FABRIC=1
echo "test_nvml: all passed"
