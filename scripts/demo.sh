#!/usr/bin/env bash
# make demo: kvmaster + one kvagent on loopback in a temporary run directory, an engine storing
# session-tagged KV blocks through the SDK, and `kvctl events tail` printing what a KV-aware
# router would learn from the agent's event socket. Then every process it started is stopped,
# and a summary is printed.
#
#   scripts/demo.sh BUILD_DIR      (make demo builds first, then runs this)
#
# Exit 0 when every step worked and the events match what the engine did; otherwise one line
# says what failed, the logs are kept and their place is printed. Nothing is left running
# either way (trap on EXIT/INT/TERM: SIGTERM, up to 5 s, then SIGKILL).
set -euo pipefail

build=${1:-build}
sessions=4
blocks=8
drop=$(( blocks / 4 > 0 ? blocks / 4 : 1 ))  # engine_client removes the last quarter of a chain
started=$SECONDS

say() { printf '%s\n' "$*"; }
die() {
  printf 'demo: FAILED: %s\n' "$*" >&2
  exit 1
}

binary() {
  local path=$build/$1
  [[ -x $path ]] || die "$path is missing; build first: make build (or make demo)"
  printf '%s' "$path"
}
kvmaster=$(binary master/kvmaster)
kvagent=$(binary agent/kvagent)
kvctl=$(binary tools/kvctl)
engine_client=$(binary examples/engine_client)
command -v python3 >/dev/null || die "python3 is missing; run make deps"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvagent-demo.XXXXXX")
run=$tmp/run
pids=()   # every process we started, in start order
names=()

# True while `pid`, a background job of this shell, has not ended. (Asking ps about the pid
# would also find a process that was given the same pid after ours ended: pids come round
# quickly on a busy machine, and a stop would then signal a stranger.)
alive() {
  jobs -rp | grep -x "$1" >/dev/null
}

stop() {  # stop PID NAME: SIGTERM, up to 5 s, then SIGKILL; always reaped
  local pid=$1 name=$2
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      say "demo: $name did not stop within 5 s of SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
}

stop_all() {  # newest first: the tails, then the agent, then the master
  local i
  for (( i=${#pids[@]} - 1; i >= 0; i-- )); do stop "${pids[i]}" "${names[i]}"; done
  pids=()
  names=()
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all
  if [[ $rc -eq 0 ]]; then
    rm -rf "$tmp"
  else
    rm -f "$tmp/events.fifo"
    say "demo: logs are in $tmp (kvmaster.log, kvagent.log, events.err, events.jsonl)" >&2
  fi
  exit "$rc"
}
trap finish EXIT
trap 'say "demo: FAILED: \`$BASH_COMMAND\` exited with $? (scripts/demo.sh line $LINENO)" >&2' ERR
trap 'say "demo: interrupted" >&2; exit 130' INT
trap 'say "demo: terminated" >&2; exit 143' TERM

remember() {  # remember NAME: the process just started in the background, for stop_all
  pids+=($!)
  names+=("$1")
}

# wait_until SECONDS PID WHAT LOG COMMAND...: until COMMAND succeeds; fails when PID exits or
# the time is up, showing the end of LOG.
wait_until() {
  local limit=$1 pid=$2 what=$3 log=$4
  shift 4
  local deadline=$(( SECONDS + limit ))
  until "$@"; do
    if ! alive "$pid"; then
      tail -n 5 "$log" | sed 's/^/  | /' >&2
      die "$what: the process exited (log above)"
    fi
    if (( SECONDS >= deadline )); then
      tail -n 5 "$log" | sed 's/^/  | /' >&2
      die "$what: not done after ${limit} s (log above)"
    fi
    sleep 0.1
  done
}

say "== kvagent demo in $tmp"

# 1. kvmaster on loopback; the OS picks the ports, the ready file names them.
"$kvmaster" --listen tcp://127.0.0.1:0 --events tcp://127.0.0.1:0 \
  --events-replay tcp://127.0.0.1:0 --ready-file "$tmp/kvmaster.ready" >"$tmp/kvmaster.log" 2>&1 &
remember kvmaster
wait_until 20 "${pids[0]}" "kvmaster start" "$tmp/kvmaster.log" test -s "$tmp/kvmaster.ready"
rpc=$(sed -n 's/^rpc=//p' "$tmp/kvmaster.ready")
events=$(sed -n 's/^events=//p' "$tmp/kvmaster.ready")
replay=$(sed -n 's/^replay=//p' "$tmp/kvmaster.ready")
say "kvmaster: requests on $rpc, events on $events (replay $replay)"

# 2. One kvagent following it, its data plane on loopback too.
"$kvagent" --master "$rpc" --master-events "$events" --master-events-replay "$replay" \
  --run-dir "$run" --pool-size 256MiB --data-listen 127.0.0.1:0 >"$tmp/kvagent.log" 2>&1 &
remember kvagent
agent_ready() {
  "$kvctl" --run-dir "$run" --timeout-ms 2000 stat --raw 2>/dev/null |
    grep -q "^agent.master_link"$'\t'"1"
}
wait_until 30 "${pids[1]}" "kvagent start (kvctl stat: master link up)" "$tmp/kvagent.log" \
  agent_ready
say "kvagent: ready, run dir $run (pool 256 MiB, master link up)"

# 3. Two tails of the agent's event socket from seq 0, so nothing is missed whenever they join:
# one readable on the terminal (through a FIFO, so each process has a pid of its own), one JSON
# to count from.
say "== kvctl events tail --from-seq 0 (in the background; its lines start with [events])"
mkfifo "$tmp/events.fifo"
sed -u 's/^/[events] /' <"$tmp/events.fifo" &
remember "events printer"
"$kvctl" --run-dir "$run" events tail --from-seq 0 >"$tmp/events.fifo" 2>>"$tmp/events.err" &
remember "kvctl events tail"
"$kvctl" --run-dir "$run" events tail --json --from-seq 0 >"$tmp/events.jsonl" \
  2>>"$tmp/events.err" &
remember "kvctl events tail --json"
json_tail=$!

count_events() {  # count_events TYPE [SESSION]: events of TYPE (of SESSION) in the JSON tail
  python3 - "$tmp/events.jsonl" "$@" <<'PY'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
session = sys.argv[3] if len(sys.argv) > 3 else None
n = 0
with open(path, encoding="utf-8") as f:
    for line in f:
        if not line.endswith("\n"):
            break  # still being written
        e = json.loads(line)
        if e.get("type") == kind and (session is None or e.get("session_id") == session):
            n += 1
print(n)
PY
}
at_least() {  # at_least N TYPE [SESSION]
  local want=$1
  shift
  (( $(count_events "$@") >= want ))
}

# 4. kvctl stores a value for session "demo-cli" and reads it back. Its BlockStored reaching
# the tail also tells that the agent's relay follows the master live, so what the engine does
# next is reported once, as it happens.
say "== kvctl put / get"
"$kvctl" --run-dir "$run" put greeting --value "hello from kvctl" --session demo-cli ||
  die "kvctl put failed (its line above says why)"
wait_until 20 "$json_tail" "the relay announcing kvctl's put" "$tmp/events.err" \
  at_least 1 BlockStored demo-cli
got=$("$kvctl" --run-dir "$run" get greeting) || die "kvctl get failed (its line above says why)"
[[ $got == "hello from kvctl" ]] || die "kvctl get greeting returned '$got'"
say "kvctl get greeting -> $got"

# 5. The engine: sessions storing chains of KV blocks, reading some back, removing some.
say "== examples/engine_client"
if ! "$engine_client" --run-dir "$run" --sessions "$sessions" --blocks "$blocks" \
  --block-bytes 64KiB 2>&1 | sed -u 's/^/[engine] /'; then
  die "engine_client failed (its last line above says why)"
fi
say "== kvctl ls --prefix engine/ --limit 3"
"$kvctl" --run-dir "$run" ls --prefix engine/ --limit 3 ||
  die "kvctl ls failed (its line above says why)"

# 6. Wait until the tail has every event the engine caused, then stop everything.
wait_until 20 "$json_tail" "the events of engine_client reaching the tail" "$tmp/events.err" \
  at_least $(( sessions * drop )) BlockRemoved
sleep 0.3  # a last batch in flight reaches the terminal too
stop_all

# 7. Summary, from the JSON tail: events per type and per session; each engine session must
# have stored exactly its chain.
say "== summary"
python3 - "$tmp/events.jsonl" "$sessions" "$blocks" "$drop" <<'PY' ||
import collections, json, sys
path, sessions, blocks, drop = sys.argv[1], *map(int, sys.argv[2:])
types, stored = collections.Counter(), collections.Counter()
with open(path, encoding="utf-8") as f:
    for line in f:
        if not line.endswith("\n"):
            break  # cut short when its tail was stopped
        e = json.loads(line)
        if "type" not in e:
            print("notice:", line.strip())
            continue
        types[e["type"]] += 1
        if e["type"] == "BlockStored":
            stored[e.get("session_id", "(untagged)")] += 1
print("events seen:        " + ", ".join(f"{n} {t}" for t, n in sorted(types.items())))
print("blocks per session: " + ", ".join(f"{s} {n}" for s, n in stored.items()))
engine = [s for s in stored if s != "demo-cli"]
bad = [s for s in engine if stored[s] != blocks]
if len(engine) != sessions or bad or types["BlockRemoved"] != sessions * drop:
    sys.exit(1)
PY
  die "expected $sessions engine sessions with $blocks BlockStored each and \
$(( sessions * drop )) BlockRemoved; see the counts above"
say "processes: kvmaster, kvagent and the event tails stopped; $tmp removed"
say "demo: OK in $(( SECONDS - started )) s"
