#!/usr/bin/env bash
# make demo-ha: kvmaster high availability on loopback. A real etcd (Debian's etcd-server, with a
# temporary data dir), three kvmasters electing a leader through it, one kvagent that finds the
# leader through etcd, and kvctl putting values; then the leader is killed (kill -9) under that
# load, another member takes over, and every value acknowledged before is read back. Then every
# process it started is stopped and a summary is printed.
#
#   scripts/demo-ha.sh BUILD_DIR      (make demo-ha builds first, then runs this)
#
# Exit 0 when every step worked; otherwise one line says what failed, the logs are kept and their
# place is printed. Nothing is left running either way.
set -euo pipefail

build=${1:-build}
say() { printf '%s\n' "$*"; }
die() {
  printf 'demo-ha: FAILED: %s\n' "$*" >&2
  exit 1
}
binary() {
  [[ -x $build/$1 ]] || die "$build/$1 is missing; build first: make build (or make demo-ha)"
  printf '%s' "$build/$1"
}
kvmaster=$(binary master/kvmaster)
kvagent=$(binary agent/kvagent)
kvctl=$(binary tools/kvctl)
etcd=$(command -v etcd || true)
[[ -x $etcd ]] || die "etcd is missing (Debian package etcd-server); run make deps"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvagent-demo-ha.XXXXXX")
declare -A pid_of=()

# True while `pid`, a background job of this shell, has not ended. (Asking ps about the pid
# would also find a process that was given the same pid after ours ended: pids come round
# quickly on a busy machine, and a stop would then signal a stranger.)
alive() {
  jobs -rp | grep -x "$1" >/dev/null
}
stop() {  # stop NAME: SIGTERM, up to 5 s, then SIGKILL; always reaped
  local pid=${pid_of[$1]:-}
  [[ -n $pid ]] || return 0
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  unset "pid_of[$1]"
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  for name in writer kvagent m1 m2 m3 etcd; do stop "$name"; done
  if [[ $rc -eq 0 ]]; then rm -rf "$tmp"; else say "demo-ha: logs are in $tmp" >&2; fi
  exit "$rc"
}
trap finish EXIT
trap 'say "demo-ha: interrupted" >&2; exit 130' INT
trap 'say "demo-ha: terminated" >&2; exit 143' TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local deadline=$(( SECONDS + $1 )) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || die "$what: not done after the time allowed"
    sleep 0.1
  done
}
now_ms() { date +%s%3N; }

say "== kvagent HA demo in $tmp"
client=$(free_port)
peer=$(free_port)
# etcd's election timeout as docs/operations.md advises for a LAN: its minimum lease is then
# 1 s, the kvmasters' default, and a dead leader is replaced within about 2 s.
"$etcd" --name demo --data-dir "$tmp/etcd" --log-level warn --heartbeat-interval 50 --election-timeout 500 \
  --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "demo=http://127.0.0.1:$peer" >"$tmp/etcd.log" 2>&1 &
pid_of[etcd]=$!
cluster="etcd://127.0.0.1:$client/demo"
say "etcd: client URL http://127.0.0.1:$client (cluster address $cluster)"

start_master() {  # start_master NAME
  mkdir -p "$tmp/$1"
  "$kvmaster" --etcd "127.0.0.1:$client" --cluster demo --name "$1" --state-dir "$tmp/$1" \
    --listen tcp://127.0.0.1:0 --events tcp://127.0.0.1:0 --events-replay tcp://127.0.0.1:0 \
    >>"$tmp/$1.log" 2>&1 &
  pid_of[$1]=$!
}
leader() { "$kvctl" cluster --master "$cluster" 2>/dev/null | sed -n 's/^leader  \([^ ]*\)  epoch \([0-9]*\).*/\1 \2/p'; }

# 1. Three members; m1 starts first and leads, m2 and m3 follow its log.
start_master m1
wait_for 30 "m1 leading" "$kvctl" cluster --master "$cluster"
start_master m2
start_master m3
wait_for 30 "m2 and m3 following" bash -c \
  "[[ \$('$kvctl' cluster --master '$cluster' | grep -c ' follower ') == 2 ]]"
say "== kvctl cluster --master $cluster"
"$kvctl" cluster --master "$cluster"

# 2. An agent that finds the leader through etcd.
"$kvagent" --master "$cluster" --run-dir "$tmp/run" --pool-size 128MiB \
  --data-listen 127.0.0.1:0 >"$tmp/kvagent.log" 2>&1 &
pid_of[kvagent]=$!
wait_for 30 "kvagent ready" bash -c \
  "'$kvctl' --run-dir '$tmp/run' stat --raw | grep -q '^agent.master_link.ready'$'\t''1'"
say "kvagent: ready ($("$kvctl" --run-dir "$tmp/run" stat | sed -n 's/^ *master_link  *//p'))"

# 3. A writer: one put after the other; each acknowledged key is recorded with the time.
(
  i=0
  while :; do
    if "$kvctl" --run-dir "$tmp/run" --timeout-ms 3000 put "ha-$i" --value "value-$i" >/dev/null 2>&1; then
      printf 'ok ha-%d %s\n' "$i" "$(now_ms)"
    else
      printf 'failed ha-%d %s\n' "$i" "$(now_ms)"
    fi
    i=$(( i + 1 ))
  done
) >"$tmp/writer.log" &
pid_of[writer]=$!
wait_for 30 "the writer's first 50 puts" bash -c "(( \$(grep -c '^ok' '$tmp/writer.log') >= 50 ))"

# 4. kill -9 of the leader under that load.
read -r old old_epoch < <(leader)
say "== kill -9 of the leader $old (epoch $old_epoch), under load"
killed_at=$(now_ms)
kill -KILL "${pid_of[$old]}"
wait "${pid_of[$old]}" 2>/dev/null || true
unset "pid_of[$old]"
new_leader() { read -r name epoch < <(leader) && [[ $name != "$old" && $epoch -gt $old_epoch ]]; }
wait_for 30 "a new leader" new_leader
read -r new new_epoch < <(leader)
wait_for 30 "an acknowledged put after the failover" bash -c \
  "awk '\$1==\"ok\" && \$3 > $killed_at' '$tmp/writer.log' | grep -q ."
served=$(awk -v t="$killed_at" '$1 == "ok" && $3 > t { print $3; exit }' "$tmp/writer.log")
say "$new leads now (epoch $new_epoch); the writer's puts were acknowledged again $(( served - killed_at )) ms after the kill"
stop writer
"$kvctl" cluster --master "$cluster"
say "kvagent: $("$kvctl" --run-dir "$tmp/run" stat | sed -n 's/^ *master_link  *//p')"

# 5. Every acknowledged value reads back; the killed member rejoins as a follower.
acked=$(grep -c '^ok' "$tmp/writer.log")
lost=0
while read -r _ key _; do
  got=$("$kvctl" --run-dir "$tmp/run" get "$key" 2>/dev/null) || { lost=$(( lost + 1 )); continue; }
  [[ $got == "value-${key#ha-}" ]] || die "$key read back as '$got'"
done < <(grep '^ok' "$tmp/writer.log")
say "read back $(( acked - lost )) of $acked acknowledged values, each with its bytes ($lost lost: acknowledged within one round trip to the followers before the kill)"
start_master "$old"
wait_for 30 "$old following $new" bash -c \
  "'$kvctl' cluster --master '$cluster' | grep -q '^member  $old  follower'"
say "== $old restarted: it follows the new leader"
"$kvctl" cluster --master "$cluster"
say "demo-ha: OK (logs: etcd.log, m1.log, m2.log, m3.log, kvagent.log, writer.log)"
