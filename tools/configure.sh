#!/usr/bin/env bash
# tools/configure.sh IN OUT NAME=VALUE... — writes IN to OUT with every
# @NAME@ replaced by VALUE (CMake's configure_file, for the files under
# cmake/). Fails if IN still has an @NAME@ no argument gave.
set -euo pipefail
in=$1 out=$2
shift 2
args=()
for kv in "$@"; do
  name=${kv%%=*} value=${kv#*=}
  value=${value//\\/\\\\}
  value=${value//|/\\|}
  value=${value//&/\\&}
  args+=(-e "s|@${name}@|${value}|g")
done
mkdir -p "$(dirname "$out")"
sed "${args[@]}" "$in" > "$out.tmp"
if left=$(grep -o '@[A-Z_][A-Z0-9_]*@' "$out.tmp" | sort -u | tr '\n' ' ') && [ -n "$left" ]; then
  rm -f "$out.tmp"
  echo "tools/configure.sh: $in: no value for $left" >&2
  exit 1
fi
mv "$out.tmp" "$out"
