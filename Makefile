# holdfast: the two commands a newcomer needs are `make dev` and `make test`.
# Each installs what is missing (scripts/setup.sh), builds, and runs.

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
# Tests run $(JOBS) at a time: each starts its own etcd (and holdfastd) on free
# ports and asserts no timing, so they do not disturb one another; the chaos
# runs are marked RUN_SERIAL and have the machine to themselves.
CTEST_ARGS ?= -j $(JOBS)

.PHONY: all setup configure build dev test unit integration clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Runs holdfast on its embedded default: a single-member etcd under .holdfast-dev/
# and one holdfastd on 127.0.0.1:7420. Ctrl-C stops both.
dev: build
	$(BUILD_DIR)/bin/holdfast dev

# The whole test suite: unit tests and integration tests against a real etcd.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 $(CTEST_ARGS)

unit: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L unit $(CTEST_ARGS)

integration: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L integration $(CTEST_ARGS)

clean:
	rm -rf $(BUILD_DIR)

# Benchmarks: holdfast side by side with its baselines on the same etcd
# (docs/performance.md). BENCH_ARGS adds flags, e.g. BENCH_ARGS="--json out.json".
# `bench` runs the matrix BENCH_ROUNDS times (3, about 9 minutes) and reports medians:
# one round's ratios move too much on a shared machine to read against a target.
BENCH_ROUNDS ?= 3
.PHONY: bench bench-short
BENCH_ARGS ?=

bench: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target holdfast-bench holdfastd
	$(BUILD_DIR)/bin/holdfast-bench --rounds $(BENCH_ROUNDS) $(BENCH_ARGS)

bench-short: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target holdfast-bench holdfastd
	$(BUILD_DIR)/bin/holdfast-bench --short $(BENCH_ARGS)

# The chaos suite (docs/safety.md): a real 3-member etcd, 2 holdfastd, 8 clients and
# a fenced register under a seeded nemesis. CHAOS_ARGS adds flags, e.g.
# CHAOS_ARGS="--seed 42 --duration 600 --clients 12". `chaos-short` (about 65 s)
# is also run by `make test` (CTest chaos_short).
.PHONY: chaos chaos-short
CHAOS_ARGS ?=

chaos: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target holdfast-chaos hf_chaos_client holdfastd
	$(BUILD_DIR)/bin/holdfast-chaos $(CHAOS_ARGS)

chaos-short: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target holdfast-chaos hf_chaos_client holdfastd
	$(BUILD_DIR)/bin/holdfast-chaos --short $(CHAOS_ARGS)
