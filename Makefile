# kvagent: the user's entry points. `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
ASAN_DIR  ?= build-asan
TSAN_DIR  ?= build-tsan
CROSS_DIR ?= build-aarch64
FUZZ_DIR  ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS      ?= $(shell nproc)
CMAKE_FLAGS ?=
# A compiler cache speeds up rebuilds where one is installed (not needed, not installed by deps).
CCACHE := $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
CMAKE_FLAGS += -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE)
endif

.PHONY: all deps configure build test bench demo demo-ha soak asan-build asan-test tsan-build \
	tsan-test cross-aarch64 fuzz-build fuzz format clean package install

all: build

deps:
	@scripts/install-deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: deps configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600 -LE soak

# Long fault runs (kvmaster HA; agents), many faults in a row under load; KVAGENT_SOAK_ROUNDS=N.
soak: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L soak --timeout 3600

bench: build
	@scripts/run-bench.sh $(BUILD_DIR)

demo: build
	@scripts/demo.sh $(BUILD_DIR)

# kvmaster high availability: etcd, three kvmasters, an agent; the leader killed under load.
demo-ha: build
	@scripts/demo-ha.sh $(BUILD_DIR)
# Debian packages (kvagent, kvmaster, libkvclient0, libkvclient-dev, python3-kvagent) in
# $(BUILD_DIR)/packages/, built by CPack from this build (packaging/CMakeLists.txt).
package: build
	@cd $(BUILD_DIR) && cpack -G DEB
	@ls $(BUILD_DIR)/packages/*.deb

# Installs under $(PREFIX): the systemd units name the binaries and configs there, and ldconfig
# runs so that libkvclient.so.0 is found at once.
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# The tests again under AddressSanitizer + UndefinedBehaviorSanitizer (run by CI).
asan-build: deps
	@cmake -S . -B $(ASAN_DIR) -G Ninja $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Debug -DKVAGENT_SANITIZE=ON -DKVAGENT_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS)

asan-test: asan-build
	@cd $(ASAN_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900 -LE 'no_sanitizer|soak'

# The tests again under ThreadSanitizer (run by CI): a race anywhere in our code, the tests or
# the binaries they start fails the test. scripts/tsan-test.sh says what runs and why.
tsan-build: deps
	@KVAGENT_TSAN_BUILD_ONLY=1 scripts/tsan-test.sh $(TSAN_DIR) $(JOBS) $(CMAKE_FLAGS)

tsan-test: deps
	@scripts/tsan-test.sh $(TSAN_DIR) $(JOBS) $(CMAKE_FLAGS)

# The SDK side cross-compiled for aarch64, its per-architecture tests run under qemu (run by CI).
cross-aarch64: deps
	@scripts/cross-aarch64.sh $(CROSS_DIR) $(JOBS) $(CMAKE_FLAGS)

# libFuzzer (clang-14) on every boundary decoder, FUZZ_SECONDS (60) per harness, from the seed
# corpora in fuzz/corpus; crashes land in $(FUZZ_DIR)/fuzz-artifacts.
fuzz-build: deps
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_DIR) -G Ninja $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVAGENT_FUZZ=ON -DKVAGENT_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_all

fuzz: fuzz-build
	@scripts/run-fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(JOBS)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(CROSS_DIR) $(FUZZ_DIR)
