#!/usr/bin/env bash
# The scaling lane (CI runs it after the clang-tidy lane): builds tasklet_bench_scaling with the
# rule table's lock timed (preset `scaling`, Release, TASKLET_TABLE_OCCUPANCY) and runs it in
# --quick form up to the machine's cores: every workload at 1, 2, ... workers, its jobs checked,
# the lock's occupancy measured (the benchmark fails when a workload with rules shows none). The
# CSV goes to build/scaling/scaling-quick.csv. Figures come from full runs (docs/performance.md).
#
#   TASKLET_JOBS   build jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"

lane="scaling lane"
source scripts/lane_steps.sh

step "build tasklet_bench_scaling (preset scaling)"
bash scripts/install-deps.sh
cmake --preset scaling >/dev/null
cmake --build --preset scaling -j "$jobs"

step "tasklet_bench_scaling --quick"
csv=build/scaling/scaling-quick.csv
rm -f "$csv"
./build/scaling/bench/tasklet_bench_scaling --quick --csv="$csv"
# Every point of every workload, and an occupancy for each point with rules.
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
workloads = {r["workload"] for r in rows}
expected = {"no rule", "one mutex rule", "disjoint subtrees", "overlapping paths"}
if workloads != expected:
    sys.exit(f"scaling lane: workloads {sorted(workloads)}, expected {sorted(expected)}")
missing = [r for r in rows if r["workload"] != "no rule" and not r["occupancy"]]
if missing:
    sys.exit(f"scaling lane: {len(missing)} points with rules have no occupancy")
print(f"scaling lane: {len(rows)} points, occupancy on every point with rules")
PY
step "done"
