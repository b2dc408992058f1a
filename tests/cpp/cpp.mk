# tests/cpp/cpp.mk — the C++ part of the build, included by the Makefile.
#
#   make cpp-examples   build/cpp_examples/{target,initiator,guard} (also part of `make`)
#   make test-cpp       header checks (tent.hpp as C++17 and C++20, tent.h as
#                       C++20), the status list against tent.h, the GoogleTest
#                       suite, the CMake build of cpp_examples/ (build/cmake),
#                       then the GoogleTest suite and the examples again under
#                       AddressSanitizer + UndefinedBehaviorSanitizer
#
# See tests/cpp/README.md for the sanitizer options and why they are needed.

CPP_EX     := $(BUILD)/cpp_examples
CPP_TESTS  := $(BUILD)/cpp_tests
CPP_SAN    := $(BUILD)/cpp_asan
CPP_EX_BIN := $(CPP_EX)/target $(CPP_EX)/initiator $(CPP_EX)/guard
CPP_SAN_EX := $(CPP_SAN)/target $(CPP_SAN)/initiator $(CPP_SAN)/guard
CPP_HPP    := include/tent.hpp
CPP_DEPS   := $(CPP_HPP) $(HEADER) cpp_examples/example_util.hpp $(LIB)

# Examples: what users would write (-Werror: the header must stay warning-free).
CXXFLAGS_CPP  := -std=c++17 -Wall -Wextra -Werror -g -O1 -Iinclude -Icpp_examples
# The test suite at -O0: GoogleTest instantiations make -O1 slow to compile.
CXXFLAGS_GT   := -std=c++17 -Wall -Wextra -Werror -g -O0 -Iinclude -Icpp_examples
# The header checks add the warnings users commonly turn on.
CXXFLAGS_HDR  := -Wall -Wextra -Werror -pedantic -Wshadow -Wconversion -Wsign-conversion -Wold-style-cast \
                 -Wnon-virtual-dtor -Iinclude
GTEST_LIBS    := /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgtest.a
# What test-cpp can run here: without GoogleTest (Debian libgtest-dev) or
# cmake it runs the rest and records the part it skipped (tools/skips.sh).
HAVE_GTEST    := $(if $(wildcard /usr/include/gtest/gtest.h $(GTEST_LIBS)),yes)
HAVE_CMAKE    := $(if $(shell command -v cmake 2>/dev/null),yes)
CPP_LINK      := -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..' -pthread

# AddressSanitizer + UndefinedBehaviorSanitizer. Only our code is
# instrumented; libtent.so (Go) is not. The test binaries link the ASan
# runtime themselves (it comes first in the library list), so no LD_PRELOAD.
#   handle_segv=1 + allow_user_segv_handler=1: ASan installs its SIGSEGV
#     handler first, and the Go runtime (started when libtent.so loads) may
#     install its own on top; Go handles faults in Go code (the library turns
#     a bad caller pointer into TENT_ERR_INVALID_ARGUMENT) and forwards the
#     others to ASan, which reports them. handle_segv=2 or
#     allow_user_segv_handler=0 would let ASan swallow Go's own faults
#     (Tent.BadPointerIsAnErrorNotACrash aborts); handle_segv=0 would turn
#     a C++ bug into a silent SIGSEGV.
#   use_sigaltstack=1: Go requires non-Go signal handlers to run SA_ONSTACK.
#   detect_leaks=1: LeakSanitizer works with the Go runtime loaded (Go's heap
#     is not malloc memory, and libtent keeps no malloc'd block reachable only
#     from Go); keep it on.
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_ENV   := ASAN_OPTIONS=handle_segv=1:allow_user_segv_handler=1:use_sigaltstack=1:detect_leaks=1:halt_on_error=1 \
             UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

CMAKE_GEN := $(if $(shell command -v ninja 2>/dev/null),-G Ninja,)

.PHONY: cpp-examples test-cpp
all: cpp-examples

cpp-examples: $(CPP_EX_BIN) $(BUILD)/include/tent.hpp

$(BUILD)/include/tent.hpp: $(CPP_HPP)
	@mkdir -p $(dir $@)
	cp $< $@

$(CPP_EX)/%: cpp_examples/%.cc $(CPP_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_CPP) -o $@ $< $(CPP_LINK)

$(CPP_SAN)/%: cpp_examples/%.cc $(CPP_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_GT) $(SAN_FLAGS) -o $@ $< $(CPP_LINK)

$(CPP_TESTS)/test_tent: tests/cpp/test_tent.cc $(CPP_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_GT) -o $@ $< $(GTEST_LIBS) $(CPP_LINK)

$(CPP_SAN)/test_tent: tests/cpp/test_tent.cc $(CPP_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_GT) $(SAN_FLAGS) -o $@ $< $(GTEST_LIBS) $(CPP_LINK)

# tent.hpp as C++17 and C++20; tent.h (tests/c/header_check.c, which
# test-c builds as C11 and C++17) also as C++20.
$(CPP_TESTS)/header_check_cxx17: tests/cpp/header_check.cc $(CPP_HPP) $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(CXXFLAGS_HDR) -o $@ $< $(CPP_LINK)

$(CPP_TESTS)/header_check_cxx20: tests/cpp/header_check.cc $(CPP_HPP) $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 $(CXXFLAGS_HDR) -o $@ $< $(CPP_LINK)

$(CPP_TESTS)/header_check_c_cxx20: tests/c/header_check.c tests/c/symbols.h $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++20 -Wall -Wextra -Werror -pedantic -Iinclude -Itests/c -o $@ $< -x none $(CPP_LINK)

CPP_TEST_BINS := $(CPP_TESTS)/header_check_cxx17 $(CPP_TESTS)/header_check_cxx20 \
                 $(CPP_TESTS)/header_check_c_cxx20 $(CPP_EX_BIN) $(CPP_SAN_EX) \
                 $(if $(HAVE_GTEST),$(CPP_TESTS)/test_tent $(CPP_SAN)/test_tent)
NO_GTEST := GoogleTest not installed (Debian: libgtest-dev; make test installs it)
NO_CMAKE := cmake not found (Debian: cmake; make test installs it)

test-cpp: $(CPP_TEST_BINS) lib
	bash tests/cpp/gen_status.sh $(HEADER) $(CPP_HPP) --check
	./$(CPP_TESTS)/header_check_cxx17
	./$(CPP_TESTS)/header_check_cxx20
	./$(CPP_TESTS)/header_check_c_cxx20
	./$(CPP_EX)/guard >/dev/null
	$(if $(HAVE_GTEST),TENT_CPP_EXAMPLES=$(CPP_EX) ./$(CPP_TESTS)/test_tent --gtest_brief=1,bash tools/skips.sh record test-cpp "the GoogleTest suite: $(NO_GTEST)")
	@echo "--- cpp_examples with CMake: find_package(tent) in build/ (imported target tent::tent) -> $(BUILD)/cmake"
	$(if $(HAVE_CMAKE),cmake -S cpp_examples -B $(BUILD)/cmake $(CMAKE_GEN) -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD) >/dev/null,bash tools/skips.sh record test-cpp "the CMake build of cpp_examples/: $(NO_CMAKE)")
	$(if $(HAVE_CMAKE),cmake --build $(BUILD)/cmake)
	$(if $(HAVE_CMAKE),./$(BUILD)/cmake/guard >/dev/null)
	$(if $(HAVE_CMAKE),./$(BUILD)/cmake/initiator >/dev/null)
	@echo "--- again under AddressSanitizer + UndefinedBehaviorSanitizer"
	$(SAN_ENV) ./$(CPP_SAN)/guard >/dev/null
	$(if $(HAVE_GTEST),$(SAN_ENV) TENT_CPP_EXAMPLES=$(CPP_SAN) ./$(CPP_SAN)/test_tent --gtest_brief=1,bash tools/skips.sh record test-cpp "the GoogleTest suite under ASan/UBSan: $(NO_GTEST)")
