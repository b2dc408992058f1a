#!/usr/bin/env bash
# tools/deps.sh — the Debian packages the test suites need, in one place
# (used by `make test` and .ci/run).
#
#   tools/deps.sh check      list the missing packages, one a line; exit 1 if any
#   tools/deps.sh install    install the missing packages with apt-get (as root,
#                            or through sudo); without either, print the exact
#                            apt-get line and exit 1. Silent when none is missing.
#   tools/deps.sh versions   the versions of go, gcc, python3, etcd and cmake
#
# TENT_DEPS_PACKAGES replaces the package list (space separated), so the
# script itself can be tested without touching the machine's packages.
set -euo pipefail

me="tools/deps.sh"

# What each package is for:
#   build-essential, pkg-config  the C and C++ suites; test-install (tent.pc)
#   cmake, ninja-build           test-cpp (cpp_examples/) and test-install
#   libgtest-dev                 test-cpp (the GoogleTest suite)
#   etcd-server                  metadata/etcd tests start their own etcd
#   iperf3                       bench and tent-bench's tcp limit
#   stress-ng                    the under-load repeat (CPU load generator)
#   iproute2                     test-multihost (ip netns, veth)
#   libibverbs-dev               transport/rdma/verbs checks its ABI against verbs.h
#   python3-venv                 test-python/demo venvs, only where python3
#                                has no ensurepip (Debian's own python3)
packages() {
  if [ -n "${TENT_DEPS_PACKAGES+set}" ]; then
    echo "$TENT_DEPS_PACKAGES"
    return
  fi
  local list="build-essential pkg-config cmake ninja-build libgtest-dev etcd-server iperf3 stress-ng iproute2 libibverbs-dev"
  if ! python3 -c 'import ensurepip' 2>/dev/null; then list="$list python3-venv"; fi
  echo "$list"
}

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# The missing packages, space separated (empty when none).
missing() {
  local p out=()
  for p in $(packages); do
    installed "$p" || out+=("$p")
  done
  echo "${out[*]:-}"
}

apt_line() {
  echo "apt-get install -y --no-install-recommends $*"
}

cmd_check() {
  if ! command -v dpkg-query >/dev/null; then
    echo "$me: not a Debian/Ubuntu system (no dpkg-query); cannot check packages" >&2
    return 2
  fi
  local m
  m=$(missing)
  [ -z "$m" ] && return 0
  printf '%s\n' $m
  echo "$me: missing Debian packages; as root: $(apt_line $m)" >&2
  return 1
}

cmd_install() {
  if ! command -v dpkg-query >/dev/null; then
    echo "$me: not a Debian/Ubuntu system (no dpkg-query): install the equivalents of" \
         "$(packages) yourself, then run make test DEPS=off" >&2
    return 1
  fi
  local m
  m=$(missing)
  [ -z "$m" ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
      sudo=(sudo)
    else
      echo "$me: missing Debian packages: $m" >&2
      echo "$me: not root and no sudo; run this as root, then run the tests again:" >&2
      echo "    $(apt_line $m)" >&2
      return 1
    fi
  fi
  echo "$me: installing $m"
  "${sudo[@]}" apt-get update -q
  # shellcheck disable=SC2086 # one word per package
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $m
  m=$(missing)
  if [ -n "$m" ]; then
    echo "$me: still missing after apt-get: $m" >&2
    return 1
  fi
}

first_line() {
  if command -v "$1" >/dev/null; then "$@" 2>&1 | sed -n 1p; else echo "$1: not found"; fi
}

cmd_versions() {
  first_line go version
  first_line gcc --version
  first_line python3 --version
  first_line etcd --version
  first_line cmake --version
}

case "${1:-}" in
  check) cmd_check ;;
  install) cmd_install ;;
  versions) cmd_versions ;;
  *) echo "usage: $me check|install|versions" >&2; exit 2 ;;
esac
