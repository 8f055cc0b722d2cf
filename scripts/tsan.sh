#!/usr/bin/env bash
# The ThreadSanitizer lane (CI runs it after the ASan lane): builds oneTBB with TSan
# (scripts/build-tbb.sh tsan, once per build tree), builds the `tsan` preset against it, checks
# that the tests really load that oneTBB, and runs `ctest --preset tsan` (labels unit, rules,
# stress, example, install, etcd, server; TSAN_OPTIONS with tests/tsan.supp and halt_on_error=1 come from the
# preset). Extra arguments go to ctest.
#
#   TASKLET_JOBS            build and ctest parallelism (default: number of cores)
#   TASKLET_STRESS_SCALE    stress sizes (default here: 2; the stress label takes ~1 min at 2)
#   TASKLET_TSAN_EXCLUDE    ctest -E regex of tests left out of the lane (default below)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"
export TASKLET_STRESS_SCALE="${TASKLET_STRESS_SCALE:-2}"

# Tests left out of this lane: none. A test would be left out only for a reason that is not a false
# positive (false positives go to tests/tsan.supp with their reason), and named here with it.
exclude="${TASKLET_TSAN_EXCLUDE-}"

lane="tsan lane"
source scripts/lane_steps.sh

step "oneTBB with -DTBB_SANITIZE=thread"
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh tsan

step "configure and build (preset tsan)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"

# The lane is only worth something if the binaries load the instrumented oneTBB (RUNPATH set by
# CMake from the imported targets); Debian's libtbb12 would give false reports or hide races.
loads_tbb_from "$(pwd)/build/tbb-tsan/install/lib" \
  build/tsan/tests/scheduler/unit_scheduler_test build/tsan/examples/request_response

step "ctest --preset tsan (TASKLET_STRESS_SCALE=$TASKLET_STRESS_SCALE${exclude:+, excluding $exclude})"
ctest_args=(--preset tsan -j "$jobs")
[ -n "$exclude" ] && ctest_args+=(-E "$exclude")
ctest "${ctest_args[@]}" "$@"
step "done"
