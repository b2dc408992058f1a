#!/usr/bin/env bash
# tests/tools/test_tools.sh — `make test-tools`: the scripts under tools/.
#
# tools/deps.sh is tested against a package list of its own
# (TENT_DEPS_PACKAGES) holding a package that does not exist, with a fake
# apt-get (and a fake sudo) on a PATH of only the commands the script
# needs, so nothing is installed or removed on this machine.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
PYTHON=${PYTHON:-python3}

fail() { echo "test-tools: FAIL: $*" >&2; exit 1; }
step() { echo "--- test-tools: $*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tent-tools-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
bash=$(command -v bash)
absent=tent-test-no-such-package
present=dpkg # installed on every Debian system

# ---- tools/deps.sh ----------------------------------------------------------

step "deps.sh check: names the missing package, and only it"
set +e
out=$(TENT_DEPS_PACKAGES="$present $absent" bash tools/deps.sh check 2>"$work/err")
rc=$?
set -e
[ $rc = 1 ] || fail "deps.sh check exited $rc with a package missing, want 1"
[ "$out" = "$absent" ] || fail "deps.sh check listed '$out', want '$absent'"
grep -qF "apt-get install -y --no-install-recommends $absent" "$work/err" ||
  fail "deps.sh check did not print the apt-get line: $(cat "$work/err")"

step "deps.sh check: silent and 0 when nothing is missing"
out=$(TENT_DEPS_PACKAGES="$present" bash tools/deps.sh check 2>&1) || fail "deps.sh check failed with nothing missing: $out"
[ -z "$out" ] || fail "deps.sh check printed '$out' with nothing missing"
out=$(TENT_DEPS_PACKAGES="$present" bash tools/deps.sh install 2>&1) || fail "deps.sh install failed with nothing missing: $out"
[ -z "$out" ] || fail "deps.sh install printed '$out' with nothing missing"

# A PATH with only what deps.sh runs, a fake apt-get that logs its
# arguments, and (in fakesudo/) a fake sudo that logs and runs the rest.
mkdir -p "$work/bin" "$work/fakesudo"
for c in dpkg-query grep id env; do ln -s "$(command -v "$c")" "$work/bin/$c"; done
cat >"$work/bin/apt-get" <<FAKE
#!$bash
echo "apt-get \$*" >>"$work/calls"
FAKE
cat >"$work/fakesudo/sudo" <<FAKE
#!$bash
echo "sudo \$*" >>"$work/calls"
[ "\$1" = -n ] && shift
[ "\$1" = true ] && exit 0
exec "\$@"
FAKE
chmod 755 "$work/bin/apt-get" "$work/fakesudo/sudo"
touch "$work/calls" && chmod 666 "$work/calls"

# as_user CMD...: CMD as an unprivileged user (this one, or nobody when root)
as_user() {
  if [ "$(id -u)" -ne 0 ]; then "$@"; else setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; fi
}
can_drop=yes
if [ "$(id -u)" -eq 0 ] && ! command -v setpriv >/dev/null; then can_drop=""; fi

deps_install() { # PATH_DIRS: deps.sh install with the fake commands
  env -i PATH="$1" TENT_DEPS_PACKAGES="$present $absent" "$bash" tools/deps.sh install
}

if [ -n "$can_drop" ]; then
  step "deps.sh install, not root, no sudo: stops, prints the apt-get line, runs nothing"
  : >"$work/calls"
  set +e
  as_user env -i PATH="$work/bin" TENT_DEPS_PACKAGES="$present $absent" "$bash" tools/deps.sh install 2>"$work/err"
  rc=$?
  set -e
  [ $rc -ne 0 ] || fail "deps.sh install succeeded without root or sudo"
  grep -qF "apt-get install -y --no-install-recommends $absent" "$work/err" ||
    fail "deps.sh install did not print the apt-get line: $(cat "$work/err")"
  [ ! -s "$work/calls" ] || fail "deps.sh install ran $(cat "$work/calls") without root or sudo"

  step "deps.sh install, not root, with sudo: apt-get through sudo"
  : >"$work/calls"
  set +e
  as_user env -i PATH="$work/fakesudo:$work/bin" TENT_DEPS_PACKAGES="$present $absent" "$bash" tools/deps.sh install \
    >/dev/null 2>"$work/err"
  rc=$?
  set -e
  # The fake apt-get installs nothing, so the package is still missing.
  [ $rc -ne 0 ] || fail "deps.sh install reported success with the package still missing"
  grep -q "still missing after apt-get: $absent" "$work/err" || fail "no 'still missing' message: $(cat "$work/err")"
  grep -qx "sudo apt-get update -q" "$work/calls" || fail "no sudo apt-get update: $(cat "$work/calls")"
  grep -qx "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $absent" "$work/calls" ||
    fail "no sudo apt-get install of $absent: $(cat "$work/calls")"
else
  bash tools/skips.sh record test-tools "deps.sh as a non-root user: running as root without setpriv (util-linux)"
fi

if [ "$(id -u)" -eq 0 ]; then
  step "deps.sh install as root: apt-get update, then install of exactly the missing package"
  : >"$work/calls"
  set +e
  deps_install "$work/bin" >/dev/null 2>"$work/err"
  rc=$?
  set -e
  [ $rc -ne 0 ] || fail "deps.sh install reported success with the package still missing"
  [ "$(cat "$work/calls")" = "apt-get update -q
apt-get install -y -q --no-install-recommends $absent" ] || fail "apt-get calls: $(cat "$work/calls")"
fi

step "deps.sh versions: one line each for go, gcc, python3, etcd, cmake"
out=$(bash tools/deps.sh versions)
[ "$(echo "$out" | wc -l)" = 5 ] || fail "deps.sh versions printed: $out"
grep -q '^go version go' <<<"$out" || fail "no go version in: $out"

# ---- tools/skips.sh -------------------------------------------------------

step "skips.sh record: loud, and appended to TENT_SKIP_LOG"
log=$work/skipped.txt
out=$(TENT_SKIP_LOG=$log bash tools/skips.sh record test-a "no etcd (etcd-server)" 2>&1)
[ "$out" = "SKIPPED: test-a: no etcd (etcd-server)" ] || fail "record printed '$out'"
[ "$(cat "$log")" = "test-a: no etcd (etcd-server)" ] || fail "record wrote '$(cat "$log")'"

step "skips.sh summary: lists skips; fails on a failed suite, and on a skip with CI=true"
out=$(CI= bash tools/skips.sh summary "$log" test-a test-b --) || fail "summary failed with a skip and no CI: $out"
grep -qx "SKIPPED: test-a: no etcd (etcd-server)" <<<"$out" || fail "summary did not list the skip: $out"
grep -q "^passed:  test-a test-b$" <<<"$out" || fail "summary passed line: $out"
if CI=true bash tools/skips.sh summary "$log" test-a test-b -- >/dev/null 2>&1; then fail "CI=true passed with a skip"; fi
if out=$(CI= bash tools/skips.sh summary "$work/none.txt" test-a test-b -- test-b); then fail "summary passed with a failed suite"; fi
grep -q "^FAILED:  test-b$" <<<"$out" || fail "summary FAILED line: $out"
grep -q "^passed:  test-a$" <<<"$out" || fail "summary passed line with a failure: $out"
CI=true bash tools/skips.sh summary "$work/none.txt" test-a -- >/dev/null || fail "CI=true failed with no skip"

step "tests/python/skiplog.py: pytest skips reach TENT_SKIP_LOG"
venv_python=build/venv-test/bin/python
if [ -x "$venv_python" ] && "$venv_python" -c 'import pytest' 2>/dev/null; then
  mkdir -p "$work/py"
  printf 'import pytest\n\ndef test_runs():\n    pass\n\n@pytest.mark.skip(reason="needs a GPU")\ndef test_gpu():\n    pass\n\n@pytest.mark.xfail(reason="known")\ndef test_known():\n    assert False\n' \
    >"$work/py/test_sample.py"
  : >"$log"
  (cd "$work/py" && PYTHONPATH="$repo/tests/python" TENT_SKIP_LOG=$log TENT_SKIP_SUITE=test-x \
    "$repo/$venv_python" -m pytest -q -p no:cacheprovider -p skiplog . >/dev/null) || fail "pytest on the sample failed"
  [ "$(cat "$log")" = "test-x: test_sample.py::test_gpu: needs a GPU" ] || fail "skiplog wrote: $(cat "$log")"
else
  bash tools/skips.sh record test-tools "skiplog.py: no pytest in $venv_python (make test-python builds it)"
fi

# ---- tools/configure.sh -----------------------------------------------------

step "configure.sh: substitutes, keeps other text, refuses a missing value"
printf 'a=@A@ b=@B_2@ ${keep} @A@\n' >"$work/in"
bash tools/configure.sh "$work/in" "$work/out" A='x|y&z\w' B_2=/p/q
[ "$(cat "$work/out")" = 'a=x|y&z\w b=/p/q ${keep} x|y&z\w' ] || fail "configure.sh wrote: $(cat "$work/out")"
if bash tools/configure.sh "$work/in" "$work/out2" A=1 2>"$work/err"; then fail "configure.sh accepted a missing @B_2@"; fi
grep -q "@B_2@" "$work/err" || fail "configure.sh did not name @B_2@: $(cat "$work/err")"
[ ! -e "$work/out2" ] || fail "configure.sh left a partial output"

echo "test-tools: ok"
