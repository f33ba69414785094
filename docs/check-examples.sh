#!/usr/bin/env bash
# Checks that the documents still describe the code:
#  1. every code block of docs/sdk.md marked `<!-- checked: NAME -->` is extracted, compiled
#     (C++ and C with -Wall -Wextra -Werror) and run against a fresh standalone kvagent; its
#     output must equal the block marked `<!-- output: NAME -->`, when there is one;
#  2. every `--flag` in the kvagent and kvmaster flag tables of docs/operations.md is one that
#     the binary's --help lists, and every flag --help lists is in the table.
#
#   docs/check-examples.sh [BUILD_DIR]     (default: build; needs kvagent, kvmaster, kvclient)
#
# Exit 0 when everything compiled, ran and matched; 1 otherwise. Every kvagent it starts is
# stopped (SIGTERM, then SIGKILL) and its temporary directory removed, also on failure.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvagent-docs.XXXXXX")
agent_pid=""
failed=0

cleanup() {
  if [[ -n $agent_pid ]]; then
    kill -TERM "$agent_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

for f in agent/kvagent master/kvmaster sdk/c/libkvclient.so.0 sdk/libkvagent_client.a; do
  [[ -e $build/$f ]] || { echo "check-examples: $build/$f is missing; build it first" >&2; exit 1; }
done

# ---- 1. the SDK examples --------------------------------------------------------------------
python3 - "$src/docs/sdk.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
blocks = re.findall(r"<!-- checked: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
if not blocks:
    sys.exit("check-examples: no checked blocks in sdk.md")
for name, body in blocks:
    open(f"{sys.argv[2]}/{name}", "w", encoding="utf-8").write(body)
for name, body in re.findall(r"<!-- output: (\S+) -->\n```\w*\n(.*?)```", text, re.S):
    open(f"{sys.argv[2]}/{name}.expected", "w", encoding="utf-8").write(body)
PY

run_against_agent() {  # run_against_agent NAME COMMAND...: COMMAND gets the run dir last
  local name=$1
  shift
  local dir=$work/agent-$name
  mkdir -p "$dir"
  "$build/agent/kvagent" --run-dir "$dir/run" --pool-size 64MiB >"$dir/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 100); do [[ -S $dir/run/agent.sock ]] && break; sleep 0.1; done
  echo "== $name"
  if ! "$@" "$dir/run" | tee "$dir/output"; then
    echo "check-examples: $name failed" >&2
    failed=1
  elif [[ -e $work/$name.expected ]] && ! diff -u "$work/$name.expected" "$dir/output" >&2; then
    echo "check-examples: the output of $name differs from the one shown in sdk.md" >&2
    failed=1
  fi
  kill -TERM "$agent_pid"
  wait "$agent_pid" || true
  agent_pid=""
}

cd "$work"
for f in *; do
  case $f in
    *.expected | *.bin) ;;
    *.cc)
      g++ -std=c++20 -Wall -Wextra -Werror -O2 -I"$src/sdk/include" -I"$src/common/include" "$f" \
        "$build/sdk/libkvagent_client.a" "$build/ipc/libkvagent_ipc.a" \
        "$build/common/libkvagent_common.a" -lpthread -lrt -o "$f.bin"
      run_against_agent "$f" "./$f.bin"
      ;;
    *.c)
      gcc -std=c11 -Wall -Wextra -Werror -O2 -I"$src/sdk/c/include" "$f" -L"$build/sdk/c" \
        -lkvclient -o "$f.bin"
      run_against_agent "$f" env LD_LIBRARY_PATH="$build/sdk/c" "./$f.bin"
      ;;
    mooncake_*.py)  # the Mooncake-compatible package (sdk/python/compat) finds kvagent itself
      run_against_agent "$f" env PYTHONPATH="$src/sdk/python/compat" PYTHONDONTWRITEBYTECODE=1 \
        KVAGENT_LIBKVCLIENT="$build/sdk/c/libkvclient.so.0" /usr/bin/python3 "$f"
      ;;
    *.py)
      run_against_agent "$f" env PYTHONPATH="$src/sdk/python" PYTHONDONTWRITEBYTECODE=1 \
        KVAGENT_LIBKVCLIENT="$build/sdk/c/libkvclient.so.0" /usr/bin/python3 "$f"
      ;;
  esac
done

# ---- 2. the flag tables ---------------------------------------------------------------------
check_flags() {  # check_flags BINARY "### heading of its table"
  local binary=$1 heading=$2
  local documented listed
  documented=$(awk -v h="$heading" '$0 == h {on=1; next} on && /^### / {exit} on' \
                 "$src/docs/operations.md" | grep -o '^| `--[a-z-]*' | sed 's/^| `//' | sort -u)
  # Rows such as "--high-watermark / --low-watermark" name two flags.
  documented=$(printf '%s\n%s\n' "$documented" "$(awk -v h="$heading" \
                 '$0 == h {on=1; next} on && /^### / {exit} on' "$src/docs/operations.md" |
                 grep -o '^| `--[a-z-]*` / `--[a-z-]*' | grep -o -- '--[a-z-]*$')" | sort -u |
               sed '/^$/d')
  listed=$("$build/$binary" --help | grep -o '^  --[a-z-]*' | sed 's/^  //' | grep -v '^--help$' |
           sort -u)
  if [[ $documented != "$listed" ]]; then
    echo "check-examples: the flags of $binary differ from docs/operations.md ($heading):" >&2
    diff <(echo "$listed") <(echo "$documented") | sed 's/^/  /' >&2 || true
    failed=1
  else
    echo "== flags of $binary: $(echo "$listed" | wc -l) documented"
  fi
}
check_flags agent/kvagent "### kvagent flags"
check_flags master/kvmaster "### kvmaster flags"

exit $failed
