#!/usr/bin/env bash
# `make demo`'s script as a test: it must pass twice in a row, and each run must leave no
# process and no temporary directory behind. It runs in a session of its own (setsid), so any
# process it started and failed to stop is still findable by session id after it exits.
#
#   demo_test.sh DEMO_SCRIPT BUILD_DIR
set -euo pipefail
demo=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for attempt in 1 2; do
  echo "== demo run $attempt"
  rc=0
  TMPDIR=$work setsid --wait bash -c 'echo $$ >"$1"; exec "$2" "$3"' _ \
    "$work/sid" "$demo" "$build" || rc=$?
  sid=$(cat "$work/sid")
  left=$(pgrep -s "$sid" -a || true)
  if [[ -n $left ]]; then
    echo "FAIL: run $attempt left processes behind:" >&2
    echo "$left" >&2
    pkill -KILL -s "$sid" || true
    exit 1
  fi
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: run $attempt exited with $rc" >&2
    exit 1
  fi
  leftover=$(find "$work" -mindepth 1 -maxdepth 1 -name 'kvagent-demo.*')
  if [[ -n $leftover ]]; then
    echo "FAIL: run $attempt left its temporary directory: $leftover" >&2
    exit 1
  fi
done
echo "demo: passed twice, nothing left behind"
