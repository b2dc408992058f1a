#!/usr/bin/env bash
# tools/skips.sh — nothing that could not run goes unnoticed.
#
#   tools/skips.sh record SUITE REASON...
#       prints "SKIPPED: SUITE: REASON" and, when TENT_SKIP_LOG is set (make
#       test sets it), appends "SUITE: REASON" there. Go tests reach the same
#       file through tools/gotest.sh, pytest through tests/python/conftest.py.
#   tools/skips.sh summary LOG SUITE... -- [FAILED_SUITE...]
#       the end of `make test`: passed and failed suites, then every line of
#       LOG as "SKIPPED: ...". Exits 1 if a suite failed, or, with CI=true
#       (or 1/yes), if anything was skipped.
set -euo pipefail

record() {
  local suite=$1
  shift
  echo "SKIPPED: $suite: $*" >&2
  if [ -n "${TENT_SKIP_LOG:-}" ]; then
    mkdir -p "$(dirname "$TENT_SKIP_LOG")"
    echo "$suite: $*" >> "$TENT_SKIP_LOG"
  fi
}

summary() {
  local log=$1
  shift
  local suites=() failed=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do suites+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  failed=("$@")

  local passed=() s f is_failed
  for s in "${suites[@]}"; do
    is_failed=0
    for f in "${failed[@]}"; do [ "$s" = "$f" ] && is_failed=1; done
    [ $is_failed = 0 ] && passed+=("$s")
  done

  local nskip=0
  [ -s "$log" ] && nskip=$(wc -l < "$log")
  echo
  echo "==================== make test: summary ===================="
  echo "passed:  ${passed[*]:-(none)}"
  [ ${#failed[@]} -gt 0 ] && echo "FAILED:  ${failed[*]}"
  if [ "$nskip" -gt 0 ]; then
    sed 's/^/SKIPPED: /' "$log"
    echo "$nskip test(s) or suite(s) did not run (tools/deps.sh check names missing packages)"
  else
    echo "skipped: nothing"
  fi
  echo "============================================================"
  if [ ${#failed[@]} -gt 0 ]; then
    return 1
  fi
  case "${CI:-}" in
    true | 1 | yes)
      if [ "$nskip" -gt 0 ]; then
        echo "CI=$CI: a skipped test is a failure here" >&2
        return 1
      fi
      ;;
  esac
}

case "${1:-}" in
  record)
    [ $# -ge 3 ] || { echo "usage: tools/skips.sh record SUITE REASON..." >&2; exit 2; }
    shift
    record "$@"
    ;;
  summary)
    [ $# -ge 2 ] || { echo "usage: tools/skips.sh summary LOG SUITE... -- [FAILED...]" >&2; exit 2; }
    shift
    summary "$@"
    ;;
  *) echo "usage: tools/skips.sh record|summary ..." >&2; exit 2 ;;
esac
