#!/usr/bin/env bash
# Installs the Debian 12 packages tasklet needs, only those missing. Safe to run repeatedly.
set -euo pipefail

packages=(g++ cmake ninja-build libtbb-dev libboost-dev libgtest-dev libgmock-dev libbenchmark-dev
          python3  # the docs' snippet check (scripts/check_snippets.py), a test
          nlohmann-json3-dev  # the trace test reads the Chrome trace it writes; tasklet::etcd's JSON
          libcurl4-openssl-dev  # tasklet::etcd speaks to etcd's JSON gateway
          etcd-server etcd-client  # the etcd tests start their own etcd on loopback
          chromium  # the timeline test renders the HTML timeline headless
          clang libclang-rt-14-dev  # clang and its libFuzzer runtime: the fuzz lane (scripts/fuzz.sh)
          clang-tidy  # the tidy lane (scripts/tidy.sh)
          pkg-config  # the install test builds a consumer with tasklet.pc
          wrk)  # the server test loads examples/file_server
missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "tasklet: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "tasklet: run as root or install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
