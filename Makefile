# kvagent: the user's entry points. `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
ASAN_DIR  ?= build-asan
JOBS      ?= $(shell nproc)
CMAKE_FLAGS ?=
# A compiler cache speeds up rebuilds where one is installed (not needed, not installed by deps).
CCACHE := $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
CMAKE_FLAGS += -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE)
endif

.PHONY: all deps configure build test bench demo demo-ha soak asan-test format clean

all: build

deps:
	@scripts/install-deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: deps configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600 -LE soak

# Long fault runs (kvmaster HA: many faults in a row under load); KVAGENT_SOAK_ROUNDS=N.
soak: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L soak --timeout 3600

bench: build
	@scripts/run-bench.sh $(BUILD_DIR)

demo: build
	@scripts/demo.sh $(BUILD_DIR)

# kvmaster high availability: etcd, three kvmasters, an agent; the leader killed under load.
demo-ha: build
	@scripts/demo-ha.sh $(BUILD_DIR)

# The tests again under AddressSanitizer + UndefinedBehaviorSanitizer (run by CI).
asan-test: deps
	@cmake -S . -B $(ASAN_DIR) -G Ninja $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Debug -DKVAGENT_SANITIZE=ON -DKVAGENT_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS)
	@cd $(ASAN_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900 -LE 'no_sanitizer|soak'

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR)
