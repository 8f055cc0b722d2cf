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
