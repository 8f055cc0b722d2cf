#!/usr/bin/env bash
# The AddressSanitizer + UndefinedBehaviorSanitizer lane (CI runs it after the README's tests):
# builds oneTBB with its resumable tasks on threads (scripts/build-tbb.sh asan, once per build
# tree: ASan cannot follow the stack switches of Debian's build), builds the `asan` preset against
# it, checks that the tests really load that oneTBB, and runs `ctest --preset asan` (every test;
# ASAN_OPTIONS and UBSAN_OPTIONS come from the preset). Extra arguments go to ctest.
#
#   TASKLET_JOBS            build and ctest parallelism (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"

lane="asan lane"
source scripts/lane_steps.sh

step "oneTBB with resumable tasks on threads"
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh asan

step "configure and build (preset asan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
loads_tbb_from "$(pwd)/build/tbb-asan/install/lib" \
  build/asan/tests/scheduler/unit_scheduler_test build/asan/examples/request_response

step "ctest --preset asan"
ctest --preset asan -j "$jobs" "$@"
step "done"
