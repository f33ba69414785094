#!/usr/bin/env bash
# Runs every benchmark binary that exists in the build directory; each prints BENCH lines.
set -euo pipefail
build=${1:-build}
ran=0
for b in ipc_bench master_bench transfer_bench e2e_bench events_bench relay_bench sdk_c_bench; do
  exe=$(find "$build/bench" -name "$b" -type f -perm -u+x 2>/dev/null | head -n1)
  if [[ -n "$exe" ]]; then
    echo "== $b"
    "$exe"
    ran=$((ran + 1))
  fi
done
[[ $ran -gt 0 ]] || { echo "no benchmarks built" >&2; exit 1; }
# Python benchmarks run the package from the source tree against this build's binaries.
if [[ -x "$build/agent/kvagent" && -e "$build/sdk/c/libkvclient.so.0" ]]; then
  echo "== mooncake_bench"
  /usr/bin/python3 "$(dirname "$0")/../bench/mooncake/mooncake_bench.py" "$build"
fi
