# bench/bench.mk — the benchmarks, included by the Makefile (not tests:
# their figures go to docs/BENCHMARKS.md; tests/python/test_bench.py keeps
# the tools from rotting).
#
#   make bench            bench/sweep/sweep.py (with the wheel installed in
#                         build/venv-test) and its C++ twin build/bench/sweep
#                         (the raw C ABI) over every transport x block size x
#                         READ/WRITE at batch 128, with --check and the
#                         machine's limits (memcpy, iperf3). JSON lines:
#                         build/bench-python.jsonl, build/bench-cpp.jsonl; the
#                         plot build/bench-python.png only where matplotlib
#                         imports (sweep.py refuses --plot without it, exit 2,
#                         before the sweep).
#   make bench-compare [ARGS=--quick]   tent next to Mooncake and NIXL, with a
#                         C TCP ping-pong and a C memcpy as the floors (bench/compare/)
#   make bench-register   registration through the C ABI (bench/c/)
#   make bench-overhead   the Python layer's per-call cost next to C (bench/overhead/)

BENCH_OUT       := $(BUILD)/bench
BENCH_SWEEP_CPP := $(BENCH_OUT)/sweep
BENCH_ARGS ?= --transport local,shm,shm:register,tcp --op write,read --block-size 4K-64M --batch 128 --check

.PHONY: bench bench-compare bench-register bench-overhead

# tests/python/test_bench.py runs the C++ sweep and the tcp floor briefly.
test-python: $(BENCH_SWEEP_CPP) $(BENCH_OUT)/tcp_pingpong $(BENCH_OUT)/memcpy_floor

# The C++ twin includes cpp_examples/example_util.hpp (child processes, paths).
$(BENCH_SWEEP_CPP): bench/sweep/sweep.cc $(CPP_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_CPP) -O2 -o $@ $< -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..' -pthread

$(BENCH_OUT)/bench_register: bench/c/bench_register.c $(HEADER) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -Wall -Wextra -Werror -Iinclude -o $@ $< -L$(BUILD) -ltent -Wl,-rpath,'$$ORIGIN/..' -pthread

# The tcp floor of bench-compare: a C ping-pong over loopback (no libtent).
$(BENCH_OUT)/tcp_pingpong: bench/c/tcp_pingpong.c bench/c/bench_args.h
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -Wall -Wextra -Werror -o $@ $< -pthread -lm

# The copy floor of bench and bench-compare: memcpy in C, the engines' layout (no libtent).
$(BENCH_OUT)/memcpy_floor: bench/c/memcpy_floor.c bench/c/bench_args.h
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -Wall -Wextra -Werror -o $@ $< -pthread -lm

bench: wheel $(VENV_TEST)/.stamp $(BENCH_SWEEP_CPP) $(BENCH_OUT)/memcpy_floor
	$(VENV_TEST)/bin/python -m pip install -q --force-reinstall --no-deps $(WHEEL_GLOB)
	$(VENV_TEST)/bin/python bench/sweep/sweep.py $(BENCH_ARGS) --json $(BUILD)/bench-python.jsonl \
	  $$($(VENV_TEST)/bin/python -c 'import matplotlib' 2>/dev/null && echo --plot $(BUILD)/bench-python.png)
	./$(BENCH_SWEEP_CPP) $(BENCH_ARGS) --json $(BUILD)/bench-cpp.jsonl

bench-compare:
	bash bench/compare/run.sh $(ARGS)

bench-register: $(BENCH_OUT)/bench_register
	./$(BENCH_OUT)/bench_register

bench-overhead: wheel $(VENV_TEST)/.stamp
	$(VENV_TEST)/bin/python -m pip install -q --force-reinstall --no-deps $(WHEEL_GLOB)
	$(VENV_TEST)/bin/python bench/overhead/bench_overhead.py
