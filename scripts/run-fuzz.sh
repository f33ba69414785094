#!/usr/bin/env bash
# Runs every libFuzzer harness of fuzz/ for a bounded time, starting from its seed corpus, and
# prints one line per harness: executions, coverage, corpus size, and FAILED with the crashing
# input's path when it found one. Exit status 1 when any harness failed.
#
#   scripts/run-fuzz.sh BUILD_DIR SECONDS_PER_HARNESS [PARALLEL]
#
# PARALLEL harnesses run at once (default: the number of CPUs); each is one libFuzzer process
# (one core), so a run takes about ceil(13 / PARALLEL) * SECONDS.
set -uo pipefail
build=${1:?build dir}
seconds=${2:-60}
parallel=${3:-$(nproc)}
src=$(cd "$(dirname "$0")/.." && pwd)
harnesses=(fuzz_agent_request fuzz_master_request fuzz_master_reply fuzz_handshake
           fuzz_data_header fuzz_event_decode fuzz_relay_digest fuzz_master_restore
           fuzz_config fuzz_metrics_request fuzz_etcd_answer fuzz_frame_stream
           fuzz_frame_cipher)
mkdir -p "$build/fuzz-artifacts"
rm -f "$build"/fuzz-artifacts/*.result

# One harness; its result line goes to $build/fuzz-artifacts/$h.result, its exit status is ours.
run_one() {
  local h=$1
  local exe="$build/fuzz/$h"
  local result="$build/fuzz-artifacts/$h.result"
  if [[ ! -x $exe ]]; then
    echo "FUZZ $h missing ($exe); build it first" >"$result"
    return 1
  fi
  # New inputs go to a scratch corpus in the build dir; the committed seeds stay as they are.
  local work="$build/fuzz-corpus/$h"
  mkdir -p "$work"
  local log="$build/fuzz-artifacts/$h.log"
  # One allocation of more than 64 MiB for an input of at most 64 KiB is a finding: work and
  # memory per request are bounded by its size.
  "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 \
    -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$h-" \
    "$work" "$src/fuzz/corpus/$h" >"$log" 2>&1
  local rc=$?
  local execs cov corpus
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(ls "$work" | wc -l)
  if [[ $rc -ne 0 ]]; then
    local crash
    crash=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | cut -d' ' -f5)
    {
      echo "FUZZ $h FAILED (exit $rc) after ${execs:-?} execs: ${crash:-see $log}"
      grep -m3 -E "ERROR|SUMMARY|runtime error" "$log" | sed 's/^/    /'
    } >"$result"
    return 1
  fi
  echo "FUZZ $h ok: ${execs:-?} execs in ${seconds} s, coverage ${cov:-?}, corpus $corpus" \
    >"$result"
}

# A harness counts as passed only by its own "ok" line (exit statuses of jobs reaped by
# `wait -n` are not kept).
for h in "${harnesses[@]}"; do
  while (( $(jobs -rp | wc -l) >= parallel )); do wait -n || true; done
  run_one "$h" &
done
wait
failed=0
for h in "${harnesses[@]}"; do
  result="$build/fuzz-artifacts/$h.result"
  if [[ -f $result ]]; then cat "$result"; else echo "FUZZ $h gave no result"; fi
  grep -q "^FUZZ $h ok:" "$result" 2>/dev/null || failed=1
done
exit $failed
