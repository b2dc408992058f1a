# tent — build and test.
#
#   make            build/libtent.so, build/include/tent.h and the C demo
#   make demo       build and run the demo (cpp_examples/demo_register.c)
#   make test       installs missing Debian packages (tools/deps.sh; DEPS=off
#                   skips that), then every suite in TEST_TARGETS (go vet, Go
#                   tests with -race, C, C++, fork, fuzz, Python, two "hosts"
#                   in network namespaces, install), and a summary: failed
#                   suites, and SKIPPED: <suite>: <reason> for whatever could
#                   not run (with CI=true a skip fails the run)
#   make wheel      the Python wheel (dist/), bundling libtent.so
#   make install    PREFIX=/usr/local (and DESTDIR): libtent.so, tent.h,
#                   tent.hpp, the CMake package (tent::tent) and tent.pc
#   make uninstall  the same PREFIX/DESTDIR
#   make clean
#
# A new suite is one line: TEST_TARGETS += test-foo, and a test-foo rule.
# A suite that cannot run something says so with
# `bash tools/skips.sh record test-foo "why"`; Go suites run through
# tools/gotest.sh, which records every t.Skip.

GO      ?= go
CC      ?= gcc
CXX     ?= g++
PYTHON  ?= python3
export CGO_ENABLED := 1
# go-nvml's generated bindings call deprecated NVML functions; without this
# every cgo build of it prints pages of warnings.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

BUILD   := build
LIB     := $(BUILD)/libtent.so
HEADER  := include/tent.h
# Only the tent_* functions are exported (see capi/exports.map).
# The map's digest is part of the flags because Go caches links by their
# flags, not by the content of files the flags name.
LIB_LDFLAGS := -extldflags "-Wl,--version-script=$(CURDIR)/capi/exports.map -Wl,-soname,libtent.so" \
               -X main.exportsDigest=$(shell cksum < capi/exports.map | cut -d' ' -f1)
GO_TEST_TIMEOUT ?= 4m

# The version, from one place: tent.h's TENT_VERSION_* macros
# (python/tent/_version.py is checked against them by the Python suite).
version_part = $(shell sed -n 's/^\#define TENT_VERSION_$(1) \([0-9][0-9]*\).*/\1/p' $(HEADER))
TENT_VERSION_MAJOR := $(call version_part,MAJOR)
TENT_VERSION_MINOR := $(call version_part,MINOR)
TENT_VERSION_PATCH := $(call version_part,PATCH)
TENT_VERSION       := $(TENT_VERSION_MAJOR).$(TENT_VERSION_MINOR).$(TENT_VERSION_PATCH)

CFLAGS_TEST := -std=c11 -Wall -Wextra -Werror -Iinclude -Itests/c -g
RPATH       := -Wl,-rpath,'$$ORIGIN'

# Anything that can change the library (Go, cgo C and headers, modules).
LIB_SRCS := $(shell find . \( -path ./build -o -path ./tests -o -path ./cpp_examples -o -path ./python \
                     -o -path ./.git \) -prune -o \( -name '*.go' -o -name '*.c' -o -name '*.h' \) -print) \
            go.mod go.sum capi/exports.map

TEST_TARGETS := test-vet
TEST_TARGETS += test-go
TEST_TARGETS += test-c
TEST_TARGETS += test-fork
TEST_TARGETS += test-badinput
TEST_TARGETS += test-fuzz
TEST_TARGETS += test-cpp
TEST_TARGETS += test-python
TEST_TARGETS += test-multihost
TEST_TARGETS += test-install
TEST_TARGETS += test-nvml
TEST_TARGETS += test-gpu-dry
TEST_TARGETS += test-tools

.PHONY: all lib demo test deps $(TEST_TARGETS) test-stress clean gpu-build gpu-check gpu-dry-run \
        install uninstall

all: lib $(BUILD)/demo_register

# build/ is itself a prefix CMake can find: CMAKE_PREFIX_PATH=build
# (cpp_examples/ does that by default).
lib: $(LIB) $(BUILD)/include/tent.h $(BUILD)/include/tent.hpp $(BUILD)/tentConfig.cmake $(BUILD)/tentConfigVersion.cmake

$(LIB): $(LIB_SRCS)
	@mkdir -p $(BUILD)
	$(GO) build -buildmode=c-shared -ldflags='$(LIB_LDFLAGS)' -o $@ ./capi
	@rm -f $(BUILD)/libtent.h # cgo's generated header is internal; include/tent.h is the contract

$(BUILD)/include/tent.h: $(HEADER)
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/demo_register: cpp_examples/demo_register.c $(HEADER) $(LIB)
	$(CC) $(CFLAGS_TEST) -o $@ $< -L$(BUILD) -ltent $(RPATH)

# The main job: the C registration demo, then two processes on this machine
# moving 64 MiB over each transport with checksums (python -m tent demo, from
# the wheel installed into a fresh venv), printing what moved, how fast, and
# over which transport.
VENV_DEMO := $(BUILD)/venv-demo

demo: all wheel
	./$(BUILD)/demo_register
	rm -rf $(VENV_DEMO) && $(PYTHON) -m venv $(VENV_DEMO)
	$(VENV_DEMO)/bin/python -m pip install -q --no-deps $(WHEEL_GLOB)
	$(VENV_DEMO)/bin/python -m tent demo

# make test: the packages first (before anything runs: a missing one stops
# here with the apt-get line to run), then each suite in its own sub-make,
# going on after a failure, then the summary (tools/skips.sh). Every skip
# lands in SKIP_LOG on its way.
SKIP_LOG := $(CURDIR)/$(BUILD)/skipped.txt
DEPS     ?= on

deps:
ifeq ($(DEPS),off)
	@echo "make test: DEPS=off, not checking Debian packages (tools/deps.sh check lists them)"
else
	@bash tools/deps.sh install
endif

test: deps
	@mkdir -p $(BUILD) && rm -f $(SKIP_LOG)
	@failed=""; for t in $(TEST_TARGETS); do \
	  echo "==== make $$t"; \
	  TENT_SKIP_LOG=$(SKIP_LOG) $(MAKE) -k --no-print-directory $$t || failed="$$failed $$t"; \
	done; \
	bash tools/skips.sh summary $(SKIP_LOG) $(TEST_TARGETS) -- $$failed

test-vet:
	$(GO) vet ./...

test-go:
	GO=$(GO) bash tools/gotest.sh test-go -race -count=1 -timeout $(GO_TEST_TIMEOUT) ./...

# Not in TEST_TARGETS (about half an hour on 2 CPUs): the etcd package 20
# times in a row and the whole Go suite 3 times, with -race, while
# stress-ng (or a busy loop) keeps both CPUs busy; see tests/stress.sh.
test-stress:
	GO=$(GO) bash tests/stress.sh

# Every native fuzz target, briefly (their seed corpora already run in
# test-go). A longer hunt: make test-fuzz FUZZTIME=5000000x.
# The list: everything that parses a peer's bytes, the slab's operation
# sequences, and the C boundary's registration. The budget is a count of
# executions, not a duration: with a duration, Go 1.26's fuzz coordinator
# can report "context deadline exceeded" as a failure when the time runs
# out under load (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 10000x
FUZZ_TARGETS := memory/host/slab:FuzzSlabOps wire:FuzzUnmarshalSegmentDesc wire:FuzzReadFrame wire:FuzzServerHandshake \
                wire:FuzzClientHandshake wire:FuzzDecodeStatus core:FuzzServeControl \
                transport/internal/lease:FuzzDecodeRequest transport/internal/lease:FuzzDecodeAnswerEntry \
                transport/rdma:FuzzDecodeReply internal/netaddr:FuzzCheck \
                transport/tcp:FuzzHeaders transport/tcp:FuzzServe transport/shm:FuzzDecodeLease \
                transport/shm:FuzzDecodeGrant transport/shm:FuzzDecodeRevoke capi:FuzzRegister capi:FuzzTransferRequests capi:FuzzTransferColumns capi:FuzzSplitTransports \
                core:FuzzControlReplies

test-fuzz:
	@mkdir -p $(BUILD); set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "$(GO) test -run '^$$' -fuzz '^$$fn$$' -fuzztime $(FUZZTIME) ./$$pkg"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg >$(BUILD)/fuzz.log 2>&1 || { cat $(BUILD)/fuzz.log; exit 1; }; \
	done

# ---- Multi-host on one machine (tests/multihost) ---------------------------
# Engines in two network namespaces joined by a veth pair: cross-host
# traffic is tcp, needs the secret, and carries no memfd or CUDA fd. Needs
# root and iproute2; otherwise it skips (noted in $TENT_SKIP_LOG), and
# fails under CI=true.

test-multihost:
	$(GO) vet -tags multihost ./tests/multihost/
	GO=$(GO) bash tools/gotest.sh test-multihost -race -count=1 -timeout $(GO_TEST_TIMEOUT) -tags multihost ./tests/multihost/

# ---- C tests ---------------------------------------------------------------

C_TESTS := $(BUILD)/tests/test_capi $(BUILD)/tests/test_transfer $(BUILD)/tests/test_log $(BUILD)/tests/test_fork $(BUILD)/tests/test_dlopen \
           $(BUILD)/tests/header_check_c $(BUILD)/tests/header_check_cxx

$(BUILD)/tests/%: tests/c/%.c tests/c/check.h tests/c/symbols.h $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_TEST) -o $@ $< -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..' -pthread

$(BUILD)/tests/test_dlopen: tests/c/test_dlopen.c tests/c/symbols.h $(HEADER)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_TEST) -o $@ $< -ldl

# The header as strict C11 and as C++17; linking proves every listed export exists.
$(BUILD)/tests/header_check_c: tests/c/header_check.c tests/c/symbols.h $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_TEST) -pedantic -o $@ $< -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..'

$(BUILD)/tests/header_check_cxx: tests/c/header_check.c tests/c/symbols.h $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 -Wall -Wextra -Werror -pedantic -Iinclude -Itests/c -o $@ $< \
	  -x none -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..'

test-c: $(C_TESTS) $(BUILD)/demo_register
	bash tests/c/check_symbols.sh $(HEADER) tests/c/symbols.h $(LIB)
	./$(BUILD)/tests/header_check_c
	./$(BUILD)/tests/header_check_cxx
	./$(BUILD)/tests/test_dlopen $(LIB)
	./$(BUILD)/tests/test_capi
	./$(BUILD)/tests/test_transfer
	./$(BUILD)/tests/test_log
	./$(BUILD)/tests/test_fork
	./$(BUILD)/demo_register >/dev/null

# The bad-input matrix: every function of tent.h with NULL, near-NULL,
# PROT_NONE, read-only and page-straddling pointers and absurd sizes, one
# process per case (tests/c/test_badinput.c); check_badinput_args.py fails
# if a pointer parameter of tent.h has no entry in it.
test-badinput: $(BUILD)/tests/test_badinput $(BUILD)/tests/test_badstate $(BUILD)/tests/test_alias
	$(PYTHON) tests/c/check_badinput_args.py $(HEADER) tests/c/test_badinput.c
	./$(BUILD)/tests/test_badinput
	./$(BUILD)/tests/test_badstate
	./$(BUILD)/tests/test_alias

# ---- NVML in libtent.so (go-nvml through cuda/nvmlinfo/forward) ----------
# No undefined or exported nvml* symbol; Python (RTLD_NOW, LD_BIND_NOW=1) and
# a C++ program linked with plain -ltent load it with no NVML and with the
# fake libnvidia-ml.so.1 (cuda/fakenvml), whose report the topology matches.

test-nvml: $(LIB)
	bash tests/nvml/test_nvml.sh $(LIB)

# ---- C++: include/tent.hpp, cpp_examples/, tests/cpp/ (rules in tests/cpp/cpp.mk) ----

# (before the Python rules: their prerequisites name CPP_HPP and CPP_EX)
include tests/cpp/cpp.mk

# ---- Fork tests from Python (ctypes on build/libtent.so) -------------------

test-fork: $(LIB)
	@if $(PYTHON) -c 'import pytest' 2>/dev/null; then \
	  echo "$(PYTHON) -m pytest -q tests/fork"; $(PYTHON) -m pytest -q tests/fork; \
	else \
	  echo "$(PYTHON) tests/fork/test_fork.py"; $(PYTHON) tests/fork/test_fork.py; \
	fi

# ---- Python package (python/) and its tests (tests/python) ----------------
#
# make wheel        dist/tent-<version>-py3-none-<platform>.whl, bundling
#                   build/libtent.so (platform tag: python/tools/wheel_tag.py)
# make test-python  installs that wheel into a fresh venv (build/venv-test,
#                   with numpy, pytest and matplotlib) and runs tests/python against it
# make wheel also builds dist/tent_compat-<version>-py3-none-any.whl: the
#                   top-level mooncake and nixl shim packages on tent
#                   (python/compat-shim; docs/COMPAT.md), which test-python
#                   installs next to the tent wheel

PY_VERSION   = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' python/tent/_version.py)
WHEEL_GLOB   = dist/tent-$(PY_VERSION)-py3-none-*.whl
COMPAT_WHEEL = dist/tent_compat-$(PY_VERSION)-py3-none-any.whl
VENV_BUILD  := $(BUILD)/venv-build
VENV_TEST   := $(BUILD)/venv-test
PY_SRCS     := $(shell find python -name '*.py' -not -path '*/build/*') python/pyproject.toml python/README.md

$(VENV_BUILD)/.stamp:
	rm -rf $(VENV_BUILD)
	$(PYTHON) -m venv $(VENV_BUILD)
	$(VENV_BUILD)/bin/python -m pip install -q 'setuptools>=70.1'
	touch $@

$(VENV_TEST)/.stamp:
	rm -rf $(VENV_TEST)
	$(PYTHON) -m venv $(VENV_TEST)
	$(VENV_TEST)/bin/python -m pip install -q numpy pytest matplotlib  # matplotlib: bench/sweep/sweep.py --plot
	touch $@

# The wheel carries the CMake package too, at tent/share/cmake/tent
# (tent.get_cmake_dir()), next to tent/libtent.so and tent/include/.
WHEEL_CMAKE := $(BUILD)/wheel-cmake

$(BUILD)/wheel.stamp: $(LIB) $(HEADER) $(CPP_HPP) $(PY_SRCS) $(VENV_BUILD)/.stamp \
                      $(WHEEL_CMAKE)/tentConfig.cmake $(WHEEL_CMAKE)/tentConfigVersion.cmake
	cp $(LIB) python/tent/libtent.so && (strip --strip-debug python/tent/libtent.so 2>/dev/null || true)
	mkdir -p python/tent/include && cp $(HEADER) $(CPP_HPP) python/tent/include/
	rm -rf python/tent/share && mkdir -p python/tent/share/cmake/tent && \
	  cp $(WHEEL_CMAKE)/tentConfig.cmake $(WHEEL_CMAKE)/tentConfigVersion.cmake python/tent/share/cmake/tent/
	rm -rf python/build dist/tent-*.whl
	$(VENV_BUILD)/bin/python -m pip wheel -q --no-deps --no-build-isolation -w dist ./python
	rm -rf python/build python/tent.egg-info
	@ls $(WHEEL_GLOB)
	touch $@

$(COMPAT_WHEEL): $(PY_SRCS) $(VENV_BUILD)/.stamp
	rm -rf python/compat-shim/build dist/tent_compat-*.whl
	$(VENV_BUILD)/bin/python -m pip wheel -q --no-deps --no-build-isolation -w dist ./python/compat-shim
	rm -rf python/compat-shim/build python/compat-shim/*.egg-info
	@ls $@

.PHONY: wheel
wheel: $(BUILD)/wheel.stamp $(COMPAT_WHEEL)

# (bench/bench.mk adds the benchmark tools that test_bench.py drives)
test-python: wheel $(VENV_TEST)/.stamp
	$(VENV_TEST)/bin/python -m pip install -q mypy==2.4.1
	cd python && $(CURDIR)/$(VENV_TEST)/bin/python -m mypy   # the package's type hints ([tool.mypy] in pyproject.toml)
	$(VENV_TEST)/bin/python -m pip install -q --force-reinstall --no-deps $(WHEEL_GLOB) $(COMPAT_WHEEL)
	cd tests/python && TENT_WHEEL="$$(ls $(CURDIR)/$(WHEEL_GLOB))" TENT_COMPAT_WHEEL=$(CURDIR)/$(COMPAT_WHEEL) \
	  TENT_SOURCE_DIR=$(CURDIR) \
	  $(CURDIR)/$(VENV_TEST)/bin/python -m pytest -q -p no:cacheprovider .

# ---- Install: the library, both headers, the CMake package, pkg-config ----
#
#   make install PREFIX=/opt/tent [DESTDIR=/staging]
#     lib/libtent.so                           (SONAME libtent.so)
#     include/tent.h, include/tent.hpp
#     lib/cmake/tent/tentConfig.cmake          find_package(tent 0.1) -> tent::tent
#     lib/cmake/tent/tentConfigVersion.cmake
#     lib/pkgconfig/tent.pc                    pkg-config --cflags --libs tent
#   make uninstall PREFIX=... [DESTDIR=...]
#
# The CMake files come from cmake/*.in (tools/configure.sh), in one variant
# per layout; each finds the library relative to its own location.

PREFIX  ?= /usr/local
DESTDIR ?=
INSTALL_ROOT := $(DESTDIR)$(PREFIX)
INSTALL_CMAKE := $(BUILD)/install-cmake
CMAKE_IN := cmake/tentConfig.cmake.in cmake/tentConfigVersion.cmake.in
VERSION_VARS = TENT_VERSION=$(TENT_VERSION) TENT_VERSION_MAJOR=$(TENT_VERSION_MAJOR) \
               TENT_VERSION_MINOR=$(TENT_VERSION_MINOR)

# $(call cmake_package,DIR,CONFIG_TO_LIBDIR,CONFIG_TO_INCLUDEDIR)
define cmake_package
$(1)/tentConfig.cmake: cmake/tentConfig.cmake.in $(HEADER) tools/configure.sh
	bash tools/configure.sh $$< $$@ $$(VERSION_VARS) CONFIG_TO_LIBDIR=$(2) CONFIG_TO_INCLUDEDIR=$(3)
$(1)/tentConfigVersion.cmake: cmake/tentConfigVersion.cmake.in $(HEADER) tools/configure.sh
	bash tools/configure.sh $$< $$@ $$(VERSION_VARS)
endef
$(eval $(call cmake_package,$(BUILD),.,include))
$(eval $(call cmake_package,$(INSTALL_CMAKE),../..,../../../include))
$(eval $(call cmake_package,$(WHEEL_CMAKE),../../..,../../../include))

install: $(LIB) $(HEADER) $(CPP_HPP) $(INSTALL_CMAKE)/tentConfig.cmake $(INSTALL_CMAKE)/tentConfigVersion.cmake
	@case "$(PREFIX)" in /*) ;; *) echo "make install: PREFIX must be an absolute path (got $(PREFIX))" >&2; exit 1;; esac
	install -d $(INSTALL_ROOT)/lib/cmake/tent $(INSTALL_ROOT)/lib/pkgconfig $(INSTALL_ROOT)/include
	install -m 0755 $(LIB) $(INSTALL_ROOT)/lib/libtent.so
	install -m 0644 $(HEADER) $(CPP_HPP) $(INSTALL_ROOT)/include/
	install -m 0644 $(INSTALL_CMAKE)/tentConfig.cmake $(INSTALL_CMAKE)/tentConfigVersion.cmake $(INSTALL_ROOT)/lib/cmake/tent/
	bash tools/configure.sh cmake/tent.pc.in $(INSTALL_ROOT)/lib/pkgconfig/tent.pc TENT_VERSION=$(TENT_VERSION) PREFIX=$(PREFIX)

uninstall:
	rm -f $(INSTALL_ROOT)/lib/libtent.so $(INSTALL_ROOT)/include/tent.h $(INSTALL_ROOT)/include/tent.hpp \
	  $(INSTALL_ROOT)/lib/cmake/tent/tentConfig.cmake $(INSTALL_ROOT)/lib/cmake/tent/tentConfigVersion.cmake \
	  $(INSTALL_ROOT)/lib/pkgconfig/tent.pc
	-rmdir $(INSTALL_ROOT)/lib/cmake/tent 2>/dev/null
	-rmdir --ignore-fail-on-non-empty $(INSTALL_ROOT)/lib/cmake $(INSTALL_ROOT)/lib/pkgconfig 2>/dev/null

# Installs into a temporary prefix and builds, from a directory outside the
# repository, a C++ project that does find_package(tent) and one that uses
# pkg-config; a version the package does not satisfy must fail.
test-install: $(LIB)
	MAKE=$(MAKE) bash tests/install/test_install.sh

# The scripts under tools/ (deps.sh, skips.sh, configure.sh).
test-tools: $(VENV_TEST)/.stamp
	bash tests/tools/test_tools.sh

clean:
	rm -rf $(BUILD)

# ---- Benchmarks (not tests: figures go to docs/BENCHMARKS.md) ---------------
# make bench, bench-compare, bench-register, bench-overhead: rules in bench/bench.mk.

include bench/bench.mk

# ---- GPU check (needs a machine with an NVIDIA GPU and driver) ---------------
# make gpu-build    build/gpu/: gpucheck (cmd/gpucheck) and the Go test
#                   binaries that run against the machine's driver, all
#                   built here: the GPU machine needs no Go toolchain
# make gpu-check    gpu-build, then tests/gpu/run.sh: one JSON report,
#                   build/gpu/gpu-report.json ($OUT/gpu-report.json if set);
#                   exit 0 = every check passed
# make gpu-dry-run  the same against the fake CUDA driver (cuda/fakecuda) and
#                   the fake NVML (cuda/fakenvml), on this machine
GPU_BUILD := $(BUILD)/gpu

gpu-build:
	@mkdir -p $(GPU_BUILD)
	$(GO) build -ldflags='-s -w' -o $(GPU_BUILD)/gpucheck ./cmd/gpucheck
	$(GO) test -c -ldflags='-s -w' -o $(GPU_BUILD)/nvmlinfo.test ./cuda/nvmlinfo
	$(GO) test -c -ldflags='-s -w' -o $(GPU_BUILD)/cuda.test ./cuda

gpu-check: gpu-build
	bash tests/gpu/run.sh

$(GPU_BUILD)/fake/libfakecuda.so: cuda/fakecuda/fakecuda.c cuda/fakecuda/fakecuda.h
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -Wall -o $@ $< -lpthread

$(GPU_BUILD)/fake/libnvidia-ml.so.1: cuda/fakenvml/c/fakenvml.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O1 -Wall -Wl,-soname,libnvidia-ml.so.1 -o $@ $<

gpu-dry-run: gpu-build $(GPU_BUILD)/fake/libfakecuda.so $(GPU_BUILD)/fake/libnvidia-ml.so.1
	bash tests/gpu/run.sh --fake $(GPU_BUILD)/fake

# In make test: the GPU check's script and binaries, end to end on the fakes.
test-gpu-dry: gpu-dry-run
