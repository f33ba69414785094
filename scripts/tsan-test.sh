#!/usr/bin/env bash
# `make tsan-test`: builds the concurrency-heavy tests with ThreadSanitizer in $1 (build-tsan) and
# runs them: the tests labelled `tsan` (ipc, the SDK and its C ABI and Python wrapper, the agent's
# request pipeline and master link, the event relay, and the pipeline tests that start real
# kvagent/kvmaster processes, themselves built with TSan). Only their targets are built, to keep
# CI within its 30 minutes; DEVELOPERS.md says why these.
# TSAN_OPTIONS halt_on_error=1: the first race report fails the process that saw it (a test, or
# a kvagent/kvmaster a test started), so no report goes unnoticed.
# KVAGENT_TSAN_BUILD_ONLY=1 (`make tsan-build`): build only (.ci/run builds while other tests run).
set -euo pipefail
dir=${1:-build-tsan}
jobs=${2:-$(nproc)}
shift 2 || true
cd "$(dirname "$0")/.."
targets=(
  ipc_tests ipc_segment_tests                      # rings, futexes, segments
  sdk_tests sdk_c_tests sdk_c_program kvclient     # SDK: reaper/follower hand-off, C ABI
  agent_unit_tests master_link_tests               # request pipeline, master link threads
  relay_tests relay_driver kvctl_events_driver event_publisher_driver master_test_client
  pipeline_tests kvagent kvmaster kvagent_test_client
)
cmake -S . -B "$dir" -G Ninja "$@" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVAGENT_TSAN=ON \
  -DKVAGENT_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
[[ ${KVAGENT_TSAN_BUILD_ONLY:-0} == 1 ]] && exit 0
cd "$dir"
supp="$(cd .. && pwd)/tests/tsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
ctest --output-on-failure -j "$jobs" --timeout 900 -L tsan
