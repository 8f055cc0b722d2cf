# Sourced by the CI lanes' scripts: `step "what"` prints how long the previous step took and names
# the next, each line prefixed with $lane (e.g. "tsan lane").
step_start=$SECONDS
step() {
  local now=$SECONDS
  [ -n "${step_name:-}" ] && echo "${lane}: ${step_name} took $((now - step_start)) s"
  step_name="$1"
  step_start=$now
  echo "== ${lane}: $1"
}

# `loads_tbb_from DIR BINARY...`: fails unless each binary loads libtbb and libtbbmalloc from DIR
# through its RUNPATH (the oneTBB that scripts/build-tbb.sh built), not Debian's. ldd's output is
# read whole before grep: with pipefail, `ldd | grep -q` fails when grep exits at the first match
# while ldd is still writing (ldd dies of SIGPIPE).
loads_tbb_from() {
  local dir="$1" binary loaded lib
  shift
  for binary in "$@"; do
    loaded="$(env -u LD_LIBRARY_PATH ldd "$binary")" || { echo "${lane}: ldd $binary failed" >&2; exit 1; }
    for lib in libtbb.so.12 libtbbmalloc.so.2; do
      grep -qF "$lib => $dir/$lib" <<<"$loaded" || {
        echo "${lane}: $binary does not load $dir/$lib:" >&2
        echo "$loaded" >&2
        exit 1
      }
    done
  done
}
