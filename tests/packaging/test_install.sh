#!/usr/bin/env bash
# `make install` (cmake --install) with a prefix other than the configured one: the systemd
# units name the binaries and configs under that prefix and their command starts a working
# agent; ldconfig runs; a second install keeps an edited config.
# Usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/kvagent-install-XXXXXX")
agent_pid=""
cleanup() {
  # Only while it is still our job: once bash has reaped it, its pid may be another process's.
  if [[ -n "$agent_pid" ]]; then
    if jobs -rp | grep -x "$agent_pid" >/dev/null; then kill -9 "$agent_pid" 2>/dev/null || true; fi
    wait "$agent_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "test_install: $*" >&2; exit 1; }

prefix="$work/opt/kvagent"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install failed"; }
grep -q "ldconfig: the linker cache is refreshed" "$work/install.log" || { cat "$work/install.log"; fail "ldconfig did not run"; }

unit="$prefix/lib/systemd/system/kvagent.service"
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
[[ "$exec_line" == "$prefix/bin/kvagent --config $prefix/etc/kvagent/agent.toml --run-dir /run/kvagent" ]] ||
  fail "kvagent.service: ExecStart=$exec_line"
grep -q "^Documentation=file://$prefix/share/doc/kvagent/operations.md" "$unit" || fail "Documentation="
master_exec=$(sed -n 's/^ExecStart=//p' "$prefix/lib/systemd/system/kvmaster.service")
[[ "$master_exec" == "$prefix/bin/kvmaster --config $prefix/etc/kvagent/master.toml" ]] ||
  fail "kvmaster.service: ExecStart=$master_exec"
[[ -e "$prefix/share/doc/kvagent/operations.md" ]] || fail "docs missing"

# The unit's command as systemd would run it (run dir, pool and data port overridden for a test).
read -r -a cmd <<<"$exec_line"
"${cmd[@]}" --run-dir "$work/run" --pool-size 64MiB --data-listen 127.0.0.1:0 2>"$work/agent.log" &
agent_pid=$!
"$prefix/bin/kvctl" --run-dir "$work/run" ping --wait-ms 30000 >/dev/null ||
  { cat "$work/agent.log"; fail "the unit's command does not serve"; }

# An operator's edit survives the next install.
echo "# edited by the operator" >>"$prefix/etc/kvagent/agent.toml"
cmake --install "$build" --prefix "$prefix" >"$work/install2.log" 2>&1 || fail "second install failed"
grep -q "edited by the operator" "$prefix/etc/kvagent/agent.toml" || fail "install overwrote agent.toml"
grep -q "Kept: $prefix/etc/kvagent/agent.toml" "$work/install2.log" || fail "no 'Kept:' line"
echo "test_install: all checks passed"
