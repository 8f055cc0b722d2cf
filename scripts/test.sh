#!/usr/bin/env bash
# Quick start 2: installs what is missing, builds everything with warnings as errors and runs the
# test suite (unit, rules, stress at scale 1, examples, install). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci
ctest --preset ci -j "$(nproc)" "$@"
