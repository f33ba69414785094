#!/usr/bin/env bash
# `kvctl ping --wait-ms` started before kvagent answers once the agent is up (exit 0); without
# an agent it gives up with AGENT_UNAVAILABLE (exit 1). Every process started is stopped.
#   ping_wait_test.sh KVAGENT KVCTL
set -euo pipefail
kvagent=$1 kvctl=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvctl-ping-wait.XXXXXX")
agent=""
cleanup() {
  # Only while it is still our job: once bash has reaped it, its pid may be another process's.
  if [[ -n $agent ]]; then
    if jobs -rp | grep -x "$agent" >/dev/null; then kill -KILL "$agent" 2>/dev/null || true; fi
    wait "$agent" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

set +e
"$kvctl" --run-dir "$dir/none" ping --wait-ms 300 2>"$dir/none.err"
rc=$?
set -e
[[ $rc -eq 1 ]] || { echo "no agent: exit $rc, want 1"; exit 1; }
grep -q "AGENT_UNAVAILABLE" "$dir/none.err" || { echo "no agent: $(cat "$dir/none.err")"; exit 1; }

"$kvctl" --run-dir "$dir/run" ping --wait-ms 60000 >"$dir/ping.out" 2>&1 &
ping=$!
sleep 0.3  # kvctl is now retrying against a run dir nobody serves yet
"$kvagent" --run-dir "$dir/run" --pool-size 64MiB 2>"$dir/agent.log" &
agent=$!
set +e
wait "$ping"
rc=$?
set -e
[[ $rc -eq 0 ]] || { echo "ping --wait-ms: exit $rc: $(cat "$dir/ping.out")"; exit 1; }
grep -q "answered in" "$dir/ping.out" || { echo "ping output: $(cat "$dir/ping.out")"; exit 1; }
kill -TERM "$agent"
wait "$agent"
agent=""
echo "ok"
