#!/usr/bin/env bash
# The long stress lane (CI runs it after the fuzz lane): the stress oracle at 10^6 holds under
# ThreadSanitizer (its richest case, every holder kind at once, over 1, 2 and 4 workers), then the
# shutdown storm under AddressSanitizer + UBSan (managers destroyed with 10^5 jobs in every state,
# round after round). It builds the two tests in the tsan and asan build trees (incrementally after
# the earlier lanes) and fails when a test fails or the oracle checked fewer holds than asked.
#
#   TASKLET_JOBS          build parallelism (default: number of cores)
#   TASKLET_LONG_HOLDS    holds the oracle must check (default 1000000)
#   TASKLET_LONG_SCALE    the oracle's TASKLET_STRESS_SCALE (default 150: three cases of ~340,000 holds)
#   TASKLET_STORM_SCALE   the storm's TASKLET_STRESS_SCALE (default 50: 10^5 jobs a round)
#   TASKLET_STORM_REPEAT  how many times the storm's four rounds run (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"
min_holds="${TASKLET_LONG_HOLDS:-1000000}"
oracle_scale="${TASKLET_LONG_SCALE:-150}"
storm_scale="${TASKLET_STORM_SCALE:-50}"
storm_repeat="${TASKLET_STORM_REPEAT:-3}"

lane="stress lane"
source scripts/lane_steps.sh

step "build the oracle under TSan"
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh tsan
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs" --target stress_rule_oracle_test

step "the oracle under TSan (TASKLET_STRESS_SCALE=$oracle_scale, at least $min_holds holds)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
TSAN_OPTIONS="suppressions=$(pwd)/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1" \
  LD_LIBRARY_PATH="$(pwd)/build/tbb-tsan/install/lib" TASKLET_STRESS_SCALE="$oracle_scale" \
  build/tsan/tests/stress/stress_rule_oracle_test --gtest_filter='*EverythingAtOnce*' | tee "$out"
# Each case prints "[ oracle   ] seed S: T tasklets, H holds, ...".
holds="$(awk '/\[ oracle   \]/ { for (i = 2; i <= NF; ++i) if ($i == "holds,") sum += $(i - 1) }
              END { print sum + 0 }' "$out")"
echo "stress lane: the oracle checked $holds holds"
if [ "$holds" -lt "$min_holds" ]; then
  echo "stress lane: fewer than $min_holds holds were checked" >&2
  exit 1
fi

step "build the shutdown storm under ASan + UBSan"
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh asan
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs" --target stress_shutdown_storm_test

step "the shutdown storm under ASan + UBSan (TASKLET_STRESS_SCALE=$storm_scale, $storm_repeat times)"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  TASKLET_STRESS_SCALE="$storm_scale" \
  build/asan/tests/stress/stress_shutdown_storm_test --gtest_repeat="$storm_repeat" --gtest_break_on_failure
step "done"
