#!/usr/bin/env bash
# tent next to Mooncake's transfer engine and NIXL on this machine (see compare.py).
#
#   bench/compare/run.sh            # the full comparison: 3 runs, ~20-30 minutes
#   bench/compare/run.sh --quick    # 1 short run, 4 block sizes: a few minutes
#   make bench-compare [ARGS=--quick]
#
# The peers are installed into bench/compare/.venv-peers (gitignored), never
# into the test venv: mooncake-transfer-engine-non-cuda (its engine.so needs
# libibverbs1, librdmacm1, libnuma1 from Debian, installed here if missing),
# nixl (which pulls nixl-cu12/cu13 and torch; it runs without a GPU), and
# matplotlib for the plot; plus the tent wheel from `make wheel` and the C
# floors build/bench/tcp_pingpong and build/bench/memcpy_floor.
# Results: bench/compare/results/ (compare.md, compare.json, compare.png).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv-peers"
py="${PYTHON:-python3}"

missing=()
for p in libibverbs1 librdmacm1 libnuma1 iperf3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "run.sh: installing ${missing[*]}" >&2
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
# Each peer separately: one that fails to install is reported by the comparison, not fatal here.
"$venv/bin/python" -m pip install -q numpy matplotlib
"$venv/bin/python" -m pip install -q mooncake-transfer-engine-non-cuda \
  || echo "run.sh: pip install mooncake-transfer-engine-non-cuda FAILED (see above)" >&2
"$venv/bin/python" -m pip install -q nixl || echo "run.sh: pip install nixl FAILED (see above)" >&2

make -C "$root" -s wheel build/bench/tcp_pingpong build/bench/memcpy_floor
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$root"/dist/tent-*.whl

exec "$venv/bin/python" "$here/compare.py" "$@"
