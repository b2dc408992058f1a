#!/usr/bin/env bash
# tests/install/test_install.sh — `make test-install`.
#
# make install into a temporary prefix, then, from a temporary directory
# outside the repository, what a user does with it:
#   - a CMake project: find_package(tent 0.1 REQUIRED), links tent::tent, runs
#   - pkg-config --cflags --libs tent: compile, link, run
#   - find_package with versions the package must refuse (0.2, 0.0, 1.0, a
#     range above it) fails; ones it must accept (0.1.0 EXACT, 0.1...<0.2) pass
#   - DESTDIR staging: files under DESTDIR/PREFIX, tent.pc naming PREFIX, and
#     the staged copy still usable (the CMake package is relocatable)
#   - make uninstall leaves no file behind
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
make=${MAKE:-make}

step() { echo "--- test-install: $*"; }
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }

missing=()
for tool in cmake pkg-config g++ readelf; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  bash tools/skips.sh record test-install "not found: ${missing[*]} (Debian: cmake pkg-config build-essential; make test installs them)"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tent-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
case "$work/" in "$repo"/*) fail "the temporary directory $work is inside the repository" ;; esac
prefix=$work/prefix
version=$(sed -n 's/^#define TENT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/tent.h | paste -sd.)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

installed_files="lib/libtent.so include/tent.h include/tent.hpp lib/cmake/tent/tentConfig.cmake
lib/cmake/tent/tentConfigVersion.cmake lib/pkgconfig/tent.pc"

step "make install PREFIX=$prefix"
$make --no-print-directory install PREFIX="$prefix" >/dev/null
for f in $installed_files; do
  [ -f "$prefix/$f" ] || fail "make install did not install $f"
done
cmp -s include/tent.h "$prefix/include/tent.h" || fail "installed tent.h differs from include/tent.h"
cmp -s include/tent.hpp "$prefix/include/tent.hpp" || fail "installed tent.hpp differs from include/tent.hpp"
soname=$(readelf -d "$prefix/lib/libtent.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libtent.so ] || fail "installed libtent.so has SONAME '$soname', want libtent.so"

# configure SRC BUILD PREFIX_PATH: cmake's configure step, output in BUILD.log
configure() {
  cmake -S "$1" -B "$2" "${gen[@]}" -DCMAKE_PREFIX_PATH="$3" >"$2.log" 2>&1
}

# build_and_run PREFIX_PATH NAME: the consumer project against that prefix
build_and_run() {
  local src=$work/$2-src bld=$work/$2-build
  cp -r tests/install/consumer "$src"
  configure "$src" "$bld" "$1" || { cat "$bld.log"; fail "find_package(tent 0.1 REQUIRED) with CMAKE_PREFIX_PATH=$1"; }
  cmake --build "$bld" >"$bld.build.log" 2>&1 || { cat "$bld.build.log"; fail "building the consumer against $1"; }
  local needed
  needed=$(readelf -d "$bld/consumer" | sed -n 's/.*(NEEDED).*\[\(libtent[^]]*\)\]/\1/p')
  [ "$needed" = libtent.so ] || fail "the consumer records '$needed' as NEEDED, want the SONAME libtent.so"
  local out
  out=$("$bld/consumer") || fail "the consumer built against $1 failed: $out"
  echo "$out"
  [[ $out == "consumer ok: libtent $version moved 65536 bytes" ]] || fail "unexpected consumer output: $out"
  local deps; deps=$(ldd "$bld/consumer")
  grep -q "=> $1/lib/libtent.so" <<<"$deps" || fail "the consumer did not load $1/lib/libtent.so: $(ldd "$bld/consumer")"
}

step "a CMake project in $work: find_package(tent 0.1 REQUIRED), tent::tent"
build_and_run "$prefix" cmake

step "pkg-config --cflags --libs tent"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
got=$(pkg-config --modversion tent)
[ "$got" = "$version" ] || fail "pkg-config --modversion tent says $got, want $version"
# shellcheck disable=SC2046 # pkg-config prints several flags
g++ -std=c++17 -Wall -Wextra -Werror -o "$work/pc-consumer" tests/install/consumer/main.cc \
  $(pkg-config --cflags --libs tent) -pthread -Wl,-rpath,"$prefix/lib" || fail "compiling with pkg-config's flags"
out=$("$work/pc-consumer") || fail "the pkg-config consumer failed: $out"
echo "$out"
unset PKG_CONFIG_PATH

# find_version REQUEST: configures a project doing find_package(tent REQUEST REQUIRED)
# (its log: $find_log)
find_version() {
  local src=$work/find-${1//[^A-Za-z0-9._-]/_}
  find_log=$src/build.log
  mkdir -p "$src"
  printf 'cmake_minimum_required(VERSION 3.19)\nproject(v LANGUAGES CXX)\nfind_package(tent %s REQUIRED)\nmessage(STATUS "found tent ${tent_VERSION}")\n' "$1" >"$src/CMakeLists.txt"
  configure "$src" "$src/build" "$prefix"
}

step "find_package(tent <version>): same major, and for 0.x the same minor"
for want in "0.1.0 EXACT" "0.1...<0.2" "0.0...0.5"; do
  find_version "$want" || { cat "$find_log"; fail "find_package(tent $want) refused $version"; }
  echo "accepted: find_package(tent $want)"
done
for want in 0.2 0.0 1.0 0.1.1 "0.2...0.4" "0.0...<0.1"; do
  if find_version "$want"; then fail "find_package(tent $want) accepted $version"; fi
  grep -q "considered but not accepted" "$find_log" && grep -q "tentConfig.cmake, version: $version" "$find_log" ||
    { cat "$find_log"; fail "find_package(tent $want) failed for another reason"; }
  echo "refused:  find_package(tent $want)"
done

step "make install DESTDIR=$work/stage PREFIX=/opt/tent"
$make --no-print-directory install DESTDIR="$work/stage" PREFIX=/opt/tent >/dev/null
for f in $installed_files; do
  [ -f "$work/stage/opt/tent/$f" ] || fail "DESTDIR install did not stage $f"
done
grep -qx 'prefix=/opt/tent' "$work/stage/opt/tent/lib/pkgconfig/tent.pc" || fail "tent.pc does not name PREFIX=/opt/tent"
# The staged tree was never installed at /opt/tent: it works only if the
# package finds everything relative to itself.
build_and_run "$work/stage/opt/tent" staged

step "make uninstall"
$make --no-print-directory uninstall PREFIX="$prefix" >/dev/null
$make --no-print-directory uninstall DESTDIR="$work/stage" PREFIX=/opt/tent >/dev/null
left=$(find "$prefix" "$work/stage" -type f)
[ -z "$left" ] || fail "make uninstall left: $left"
[ ! -e "$prefix/lib/cmake/tent" ] || fail "make uninstall left lib/cmake/tent"
echo "test-install: ok"
