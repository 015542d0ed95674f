#!/usr/bin/env bash
# Installs every Debian package that building holdfast, running its tests and
# `holdfast dev` need. Idempotent: installs only what is missing, so a second run
# is a no-op. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake make ninja-build pkg-config
  # gRPC and protobuf (our API and etcd's)
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libabsl-dev
  # etcd: the server, its CLI, and its API .proto files (stubs generated at build time)
  etcd-server etcd-client golang-etcd-server-dev
  # libraries
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libssl-dev
  libsqlite3-dev libpq-dev
  # holdfastd's allocator (src/server/allocator.h)
  libjemalloc-dev
  # holdfastd's Prometheus metrics endpoint
  prometheus-cpp-dev
  # the audit store's tests run a real PostgreSQL 15 (as the postgres user, via
  # setpriv from util-linux, when run as root)
  postgresql-15 postgresql-client-15 util-linux
  # tests; clang and libFuzzer for the fuzz target (holdfast-bench needs nothing more)
  libgtest-dev libgmock-dev clang-14 libclang-rt-14-dev
  iproute2  # ip netns: the chaos suite cuts an etcd member off in its own namespace
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
