#!/usr/bin/env bash
# Runs every libFuzzer harness of fuzz/ for a bounded time, starting from its seed corpus, and
# prints one line per harness: executions, coverage, corpus size, and FAILED with the crashing
# input's path when it found one. Exit status 1 when any harness failed.
#
#   scripts/run-fuzz.sh BUILD_DIR SECONDS_PER_HARNESS
set -uo pipefail
build=${1:?build dir}
seconds=${2:-60}
src=$(cd "$(dirname "$0")/.." && pwd)
harnesses=(fuzz_agent_request fuzz_master_request fuzz_master_reply fuzz_handshake
           fuzz_data_header fuzz_event_decode fuzz_relay_digest)
failed=0
mkdir -p "$build/fuzz-artifacts"
for h in "${harnesses[@]}"; do
  exe="$build/fuzz/$h"
  [[ -x $exe ]] || { echo "FUZZ $h missing ($exe); build it first" >&2; failed=1; continue; }
  # New inputs go to a scratch corpus in the build dir; the committed seeds stay as they are.
  work="$build/fuzz-corpus/$h"
  mkdir -p "$work"
  log="$build/fuzz-artifacts/$h.log"
  "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$h-" \
    "$work" "$src/fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(ls "$work" | wc -l)
  if [[ $rc -ne 0 ]]; then
    crash=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | cut -d' ' -f5)
    echo "FUZZ $h FAILED (exit $rc) after ${execs:-?} execs: ${crash:-see $log}"
    grep -m3 -E "ERROR|SUMMARY|runtime error" "$log" | sed 's/^/    /'
    failed=1
  else
    echo "FUZZ $h ok: ${execs:-?} execs in ${seconds} s, coverage ${cov:-?}, corpus $corpus"
  fi
done
exit $failed
