#!/usr/bin/env bash
# The Debian packages (`make package`), installed offline into a throwaway root with dpkg --root:
# lintian is clean (or each tag is overridden with a reason), the installed kvagent answers
# --help and serves, a C++ program finds the installed SDK with find_package(kvagent) and with
# pkg-config and round-trips a value through it, the installed Python package does the same,
# and the installed units point at the installed binaries and configs (systemd-analyze verify).
# Usage: test_packages.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/kvagent-packages-XXXXXX")
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
fail() { echo "test_packages: $*" >&2; exit 1; }

echo "== cpack"
(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack failed"; }
debs=("$work"/debs/*.deb)
[[ ${#debs[@]} -eq 5 ]] || fail "expected 5 packages, got: ${debs[*]}"
for p in kvagent kvmaster libkvclient0 libkvclient-dev python3-kvagent; do
  ls "$work"/debs/${p}_*.deb >/dev/null || fail "package $p missing"
done

echo "== lintian"
lintian_out=$(lintian --tag-display-limit 0 "${debs[@]}" 2>&1 | grep -v "running with root privileges" || true)
[[ -z "$lintian_out" ]] || fail "lintian: $lintian_out"

echo "== dpkg --root (offline, nothing from the network)"
root="$work/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
# A full install (unpack + configure, conffiles in place) into an empty root: the maintainer
# scripts run without chroot (the root has no shell); the dependencies (Debian's libraries) are
# this machine's, so they are not checked against the empty root.
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --install "${debs[@]}" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --install failed"; }
for p in kvagent kvmaster libkvclient0 libkvclient-dev python3-kvagent; do
  [[ $(dpkg-query --root="$root" -W -f='${Status}' "$p") == "install ok installed" ]] ||
    fail "$p is not installed in the root"
done
dpkg --root="$root" -L kvagent | grep -qx /usr/bin/kvagent || fail "kvagent does not own /usr/bin/kvagent"
libdir=$(dirname "$(find "$root/usr/lib" -name 'libkvclient.so.0' | head -1)")
[[ -n "$libdir" && -e "$libdir/libkvclient.so" ]] || fail "libkvclient.so not installed"
[[ $(cat "$root/var/lib/dpkg/info/libkvclient0.triggers") == "activate-noawait ldconfig" ]] ||
  fail "libkvclient0 has no ldconfig trigger"
grep -qx /etc/kvagent/agent.toml "$root/var/lib/dpkg/info/kvagent.conffiles" || fail "agent.toml is not a conffile"

echo "== installed binaries"
help=$("$root/usr/bin/kvagent" --help) || fail "kvagent --help"
[[ "$help" == *"--metrics-listen"* ]] || fail "kvagent --help lacks --metrics-listen"
[[ $("$root/usr/bin/kvagent" --version) == "kvagent "* ]] || fail "kvagent --version"
"$root/usr/bin/kvmaster" --help >/dev/null || fail "kvmaster --help"
"$root/usr/bin/kvagent" --config "$root/etc/kvagent/agent.toml" --help >/dev/null || fail "agent.toml does not parse"
"$root/usr/bin/kvmaster" --config "$root/etc/kvagent/master.toml" --help >/dev/null || fail "master.toml does not parse"
"$root/usr/bin/kvagent" --run-dir "$work/run" --pool-size 64MiB 2>"$work/agent.log" &
agent_pid=$!
"$root/usr/bin/kvctl" --run-dir "$work/run" ping --wait-ms 30000 >/dev/null || { cat "$work/agent.log"; fail "the installed kvagent does not answer"; }

echo "== a C++ program with find_package(kvagent)"
cmake -S "$src/tests/packaging/sdk_user" -B "$work/app" -G Ninja -DCMAKE_PREFIX_PATH="$root/usr" \
  >"$work/app.log" 2>&1 || { cat "$work/app.log"; fail "find_package(kvagent) failed"; }
cmake --build "$work/app" >>"$work/app.log" 2>&1 || { cat "$work/app.log"; fail "build against kvagent::kvclient failed"; }
out=$(LD_LIBRARY_PATH="$libdir" "$work/app/sdk_user" "$work/run") || fail "sdk_user (CMake): $out"
[[ "$out" == "round trip ok" ]] || fail "sdk_user (CMake) printed: $out"

echo "== the same program with pkg-config"
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" PKG_CONFIG_LIBDIR="" pkg-config --cflags --libs kvclient)
[[ "$flags" == *"-I$root/usr/"* ]] || fail "pkg-config does not point into the root: $flags"
# shellcheck disable=SC2086
g++ -std=c++17 "$src/tests/packaging/sdk_user/main.cc" $flags -o "$work/sdk_user_pc"
out=$(LD_LIBRARY_PATH="$libdir" "$work/sdk_user_pc" "$work/run") || fail "sdk_user (pkg-config): $out"
[[ "$out" == "round trip ok" ]] || fail "sdk_user (pkg-config) printed: $out"

echo "== the Python package"
out=$(cd "$work" && PYTHONPATH="$root/usr/lib/python3/dist-packages" PYTHONDONTWRITEBYTECODE=1 \
  KVAGENT_LIBKVCLIENT="$libdir/libkvclient.so.0" /usr/bin/python3 -c "
import sys, kvagent
assert kvagent.__file__.startswith('$root'), kvagent.__file__
c = kvagent.Client(run_dir=sys.argv[1], name='packaged-python', arena_bytes=1 << 20)
print(c.get_bytes('packaged').decode())
" "$work/run") || fail "python: $out"
[[ "$out" == "stored through the packaged libkvclient "* ]] || fail "python read: $out"

echo "== units"
# systemd does not run here: each unit's ExecStart is checked by running it, with the paths it
# names taken inside the root (only the run dir and the pool size are overridden).
for unit in kvagent kvmaster; do
  f="$root/lib/systemd/system/$unit.service"
  grep -q "^WatchdogSec=" "$f" || fail "$unit.service has no WatchdogSec"
  exec_line=$(sed -n 's/^ExecStart=//p' "$f")
  [[ "$exec_line" == "/usr/bin/$unit --config /etc/kvagent/"* ]] || fail "$unit.service: $exec_line"
done
kill -9 "$agent_pid"; wait "$agent_pid" 2>/dev/null || true; agent_pid=""
exec_line=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/kvagent.service")
read -r -a cmd <<<"${exec_line//\/etc\//$root/etc/}"
cmd[0]="$root${cmd[0]}"
"${cmd[@]}" --run-dir "$work/run-unit" --pool-size 64MiB --data-listen 127.0.0.1:0 2>"$work/unit-agent.log" &
agent_pid=$!
"$root/usr/bin/kvctl" --run-dir "$work/run-unit" ping --wait-ms 30000 >/dev/null ||
  { cat "$work/unit-agent.log"; fail "kvagent.service's command does not start"; }
echo "test_packages: all checks passed"
