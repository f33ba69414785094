#!/usr/bin/env bash
# `make cross-aarch64`: proves the client side builds for aarch64 (Grace/GH200 nodes run engines
# that link the SDK). Cross-compiles the SDK, ipc and common as static libraries with Debian's
# g++-aarch64-linux-gnu (cmake/aarch64-linux-gnu.cmake), and the tests of the code with
# per-architecture paths (CRC32C, ring pause and wake words, futex, streaming copies) as one
# static executable, which runs under qemu-aarch64-static on a CPU with the CRC32 extension.
set -euo pipefail
dir=${1:-build-aarch64}
jobs=${2:-$(nproc)}
shift 2 || true
cd "$(dirname "$0")/.."
cmake -S . -B "$dir" -G Ninja "$@" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir" -j "$jobs" --target kvagent_client kvagent_ipc kvagent_common cross_unit_tests
KVAGENT_EXPECT_CRC32C=armv8-crc qemu-aarch64-static -cpu max "$dir/cross_unit_tests" --gtest_brief=1
echo "cross-aarch64: SDK, ipc and common built for aarch64; their per-architecture tests passed under qemu"
