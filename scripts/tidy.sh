#!/usr/bin/env bash
# The clang-tidy lane (CI runs it after the README's tests): Debian's clang-tidy with the checks
# of .clang-tidy (functions that fit a screen, and a short list of bug-finding and performance
# checks) over every translation unit of src/, rules/ and etcd/, with the compile commands of the
# `ci` preset. Any finding fails the lane.
#
#   TASKLET_JOBS   files checked at once (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${TASKLET_JOBS:-$(nproc)}"

lane="tidy lane"
source scripts/lane_steps.sh

step "clang-tidy and the ci preset's compile commands"
bash scripts/install-deps.sh
command -v clang-tidy >/dev/null || { echo "tidy lane: clang-tidy is not installed" >&2; exit 1; }
cmake --preset ci >/dev/null
[ -f build/ci/compile_commands.json ] || { echo "tidy lane: no build/ci/compile_commands.json" >&2; exit 1; }
# The layers' include roots are links the build makes; configure alone may not have made them all.
cmake --build --preset ci --target tasklet_etcd tasklet_rules -j "$jobs" >/dev/null

step "clang-tidy over src/, rules/ and etcd/"
mapfile -t files < <(python3 - <<'PY'
import json, os
entries = json.load(open("build/ci/compile_commands.json"))
root = os.getcwd()
seen = sorted({os.path.relpath(e["file"], root) for e in entries})
print("\n".join(f for f in seen if f.split("/")[0] in ("src", "rules", "etcd")))
PY
)
[ "${#files[@]}" -gt 0 ] || { echo "tidy lane: no files to check" >&2; exit 1; }
echo "tidy lane: ${#files[@]} files"
# Each file's findings in one block; xargs fails when any clang-tidy does.
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -I{} sh -c 'out=$(clang-tidy -p build/ci --quiet "{}" 2>&1) || { echo "$out"; exit 1; }'
step "done"
