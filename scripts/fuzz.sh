#!/usr/bin/env bash
# The fuzz lane (CI runs it after the sanitizer lanes): builds the libFuzzer targets with the fuzz
# preset (clang, ASan + UBSan, on the oneTBB of scripts/build-tbb.sh asan) and runs each from its
# seed corpus in fuzz/corpus/<target>/ for a fixed time. A crash, a sanitizer report or a failed
# check stops the lane; the input that caused it is kept as
# build/fuzz/artifacts/<target>-crash-<hash> (add it to the target's corpus, or to a test, once
# fixed). New inputs the fuzzer finds go to a scratch directory, not to the repository.
#
#   TASKLET_FUZZ_SECONDS   seconds per target (default 30; run longer by hand, e.g. 3600)
#   TASKLET_JOBS           build parallelism (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${TASKLET_FUZZ_SECONDS:-30}"
jobs="${TASKLET_JOBS:-$(nproc)}"

lane="fuzz lane"
source scripts/lane_steps.sh

bash scripts/install-deps.sh
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh asan
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"
loads_tbb_from "$(pwd)/build/tbb-asan/install/lib" build/fuzz/fuzz/jobs_fuzz

mkdir -p build/fuzz/artifacts
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for corpus in fuzz/corpus/*/; do
  target="$(basename "$corpus")"
  binary="build/fuzz/fuzz/$target"
  [ -x "$binary" ] || { echo "fuzz lane: no target $target for $corpus" >&2; exit 1; }
  echo "== fuzz lane: $target for ${seconds}s"
  mkdir -p "$scratch/$target"
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build/fuzz/artifacts/$target-" "$scratch/$target" "$corpus"
done
echo "== fuzz lane: done"
