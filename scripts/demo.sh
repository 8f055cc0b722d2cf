#!/usr/bin/env bash
# Quick start 1: installs what is missing, builds the library and runs the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target request_response
./build/release/examples/request_response
