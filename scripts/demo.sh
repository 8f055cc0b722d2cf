#!/usr/bin/env bash
# Quick start 1: installs what is missing, builds the library and runs the main demo: jobs with
# path rules on a copy of this repository's tree (examples/tree_demo.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target tree_demo
./build/release/examples/tree_demo "$PWD"
