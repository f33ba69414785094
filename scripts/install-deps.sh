#!/usr/bin/env bash
# Installs the Debian 12 packages kvagent builds and tests with (the list in DEVELOPERS.md), but
# only those that are missing: one `apt-get update`, then one non-interactive install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libflatbuffers-dev flatbuffers-compiler
  libmsgpack-cxx-dev
  libzmq3-dev cppzmq-dev
  libsodium-dev
  libgoogle-glog-dev
  libgtest-dev
  libibverbs-dev librdmacm-dev
  libsystemd-dev
  libcurl4-openssl-dev nlohmann-json3-dev
  etcd-server etcd-client openssl
  libcli11-dev libtomlplusplus-dev
  python3 python3-msgpack python3-zmq
  python3-torch
  iproute2 procps
  g++-aarch64-linux-gnu qemu-user-static
  prometheus lintian
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "deps: missing ${missing[*]}; run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
