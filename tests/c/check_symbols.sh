#!/usr/bin/env bash
# Checks that tests/c/symbols.h lists exactly the functions declared in
# include/tent.h (implemented + not yet), and that libtent.so exports
# exactly the implemented ones and nothing else.
# Usage: check_symbols.sh include/tent.h tests/c/symbols.h build/libtent.so
set -euo pipefail
header=$1 symbols=$2 lib=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Declarations start at column 0: "<type> [*]tent_name(".
grep -oE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]tent_[a-z0-9_]+\(' "$header" |
  sed -E 's/.*[ *](tent_[a-z0-9_]+)\($/\1/' | sort -u >"$tmp/declared"
list() { # list NAME: the X(...) entries of one macro in symbols.h
  awk -v m="#define $1(X)" 'index($0, m) == 1 {on = 1} on {print} on && !/\\$/ {on = 0}' "$symbols" |
    { grep -oE 'X\(tent_[a-z0-9_]+\)' || true; } | sed 's/X(//; s/)//' | sort
}
list TENT_IMPLEMENTED >"$tmp/implemented"
list TENT_NOT_YET >"$tmp/not_yet"
sort -u "$tmp/implemented" "$tmp/not_yet" >"$tmp/listed"
nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u >"$tmp/exported"

fail=0 pass=0
check() { # check DESCRIPTION FILE_A FILE_B
  if diff -u "$2" "$3" >"$tmp/diff"; then
    pass=$((pass + 1))
  else
    echo "FAILED: $1" >&2
    sed 's/^/    /' "$tmp/diff" >&2
    fail=$((fail + 1))
  fi
}
check "symbols.h lists every function of tent.h once (--- tent.h, +++ symbols.h)" "$tmp/declared" "$tmp/listed"
if [ -n "$(comm -12 "$tmp/implemented" "$tmp/not_yet")" ]; then
  echo "FAILED: a function is both implemented and not yet: $(comm -12 "$tmp/implemented" "$tmp/not_yet")" >&2
  fail=$((fail + 1))
else
  pass=$((pass + 1))
fi
check "libtent.so exports exactly TENT_IMPLEMENTED (--- symbols.h, +++ libtent.so)" "$tmp/implemented" "$tmp/exported"
echo "check_symbols: $(wc -l <"$tmp/exported") exported, $(wc -l <"$tmp/not_yet") not yet implemented"
echo "check_symbols: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
