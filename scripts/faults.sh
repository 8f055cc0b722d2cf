#!/usr/bin/env bash
# The fault lane (CI runs it after the tests under ThreadSanitizer): rules shared through a
# three-member etcd by four processes while a seeded nemesis kills, pauses and restarts etcd
# members, pauses holders past their lease and partitions processes from etcd; every hold is fenced
# by a store of the test's own, and a checker of its own reads the store and the processes' logs
# (tests/etcd/etcd_faults_test.cpp). It builds in the ci tree (incrementally after the quick start)
# and runs the tests labelled "faults" (the seed is printed, and TASKLET_FAULTS_SEED replays it),
# then the regression tests of the faults the lane was built against, which every lane runs too:
# a waiter paused past its lease is not granted on resuming, and a canceled request whose
# transaction etcd applies late leaves no keys.
#
#   TASKLET_JOBS           build parallelism (default: number of cores)
#   TASKLET_FAULTS_CYCLES  how many times each kind of fault is injected (default 3, about 2 min)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"

lane="faults lane"
source scripts/lane_steps.sh

step "build (preset ci)"
bash scripts/install-deps.sh
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$jobs" --target etcd_faults_test etcd_fault_worker etcd_processes_test \
  etcd_manager_test

step "ctest --preset faults"
ctest --preset faults

step "the regression tests"
ctest --preset ci --no-tests=error -R 'AWaiterPausedPastItsLeaseIsNotGrantedWhenItResumes|ACanceledRequestWhoseTransactionEtcdAppliesLateLeavesNoKeys'
step "done"
