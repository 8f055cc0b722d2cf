#!/usr/bin/env bash
# Checks a trace timeline page (the HTML that Trace::write_html writes) in headless Chromium:
# the page draws on load (its <body> data-* counts, and the lanes and arrows really in the DOM),
# raises no uncaught JavaScript error, and a screenshot of it is a real, non-blank PNG.
#
# usage: timeline_check.sh <timeline.html> <screenshot.png>
# Exits 0 only if every check passes; each failure says what was expected and what was found.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <timeline.html> <screenshot.png>" >&2
  exit 2
fi
page=$1
shot=$2
if [[ ! -f $page ]]; then
  echo "FAIL: expected a timeline page at '$page', found no such file" >&2
  exit 1
fi

browser=""
for candidate in chromium chromium-browser google-chrome; do
  if command -v "$candidate" >/dev/null 2>&1; then
    browser=$(command -v "$candidate")
    break
  fi
done
if [[ -z $browser ]]; then
  echo "FAIL: expected a Chromium binary (chromium, chromium-browser or google-chrome) on PATH, found none;" \
    "install Debian's 'chromium' package" >&2
  exit 1
fi

# Absolute paths: Chromium resolves --screenshot against its own working directory.
page_abs=$(realpath "$page")
shot_abs=$(realpath -m "$shot")
mkdir -p "$(dirname "$shot_abs")"
url="file://$page_abs"
url=${url//%/%25}
url=${url// /%20}
url=${url//#/%23}
url=${url//\?/%3F}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Headless on a root, display-less, network-less machine: --no-sandbox is required as root (without
# it Chromium exits at once); the rest keep it off the GPU, /dev/shm and the network and away from
# first-run work, and --virtual-time-budget lets any timers of the page run before the DOM is dumped
# or the shot taken. D-Bus errors in its log are harmless. The page's console goes to the log.
flags=(
  --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --no-default-browser-check
  --disable-extensions --disable-background-networking --disable-component-update --disable-sync
  --disable-default-apps --mute-audio --virtual-time-budget=5000 --enable-logging=stderr --v=0
)

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run_chromium NAME ARGS...: one Chromium run with its own profile; stdout to $work/NAME.out,
# stderr (Chromium's log, with the page's console) to $work/NAME.log. Returns Chromium's status.
run_chromium() {
  local name=$1
  shift
  local start end status=0
  start=$(date +%s%N)
  timeout 120 "$browser" "${flags[@]}" --user-data-dir="$work/profile-$name" "$@" \
    >"$work/$name.out" 2>"$work/$name.log" || status=$?
  end=$(date +%s%N)
  echo "chromium $name run: $(((end - start) / 1000000)) ms"
  if [[ $status -eq 124 ]]; then
    fail "expected the $name run of $browser to finish within 120 s, found it timed out"
  elif [[ $status -ne 0 ]]; then
    fail "expected the $name run of $browser to exit 0, found exit status $status; its log ends:"
    tail -n 15 "$work/$name.log" >&2
  fi
  # A JavaScript error on the page shows in the log as an "Uncaught ..." console message.
  if grep -q 'Uncaught' "$work/$name.log"; then
    fail "expected no uncaught JavaScript error in the $name run, found:"
    grep 'Uncaught' "$work/$name.log" | head -n 5 >&2
  fi
  return 0
}

# --- 1. The DOM after load ---
run_chromium dom --window-size=1600,1000 --dump-dom "$url"
dom=$work/dom.out
body=$(grep -o -m 1 '<body[^>]*>' "$dom" || true)
if [[ -z $body ]]; then
  fail "expected the dumped DOM to hold a <body> tag, found none ($(wc -c <"$dom") bytes dumped)"
fi
attr() { # attr NAME: the value of data-NAME on <body>, or empty
  sed -n "s/.* data-$1=\"\\([^\"]*\\)\".*/\\1/p" <<<"$body"
}

rendered=$(attr rendered)
if [[ $rendered != yes ]]; then
  fail "expected <body data-rendered=\"yes\">, found '${rendered:-no data-rendered attribute}'"
fi

declare -A want=([lanes]=2 [slices]=1 [waits]=1 [holds]=1 [arrows]=1)
for name in events lanes slices waits holds arrows rules; do
  value=$(attr "$name")
  echo "data-$name=${value:-missing}"
  [[ -v want[$name] ]] || continue
  if [[ ! $value =~ ^[0-9]+$ ]]; then
    fail "expected <body data-$name> to be a count >= ${want[$name]}, found '${value:-missing}'"
  elif ((value < want[$name])); then
    fail "expected data-$name >= ${want[$name]}, found $value"
  fi
done

# The counts must be what was really drawn.
lanes_in_dom=$(grep -o '<g class="lane"' "$dom" | wc -l || true)
arrows_in_dom=$(grep -o '<path class="arrow"' "$dom" | wc -l || true)
echo "lane groups in the DOM: $lanes_in_dom, arrow paths in the DOM: $arrows_in_dom"
lanes=$(attr lanes)
arrows=$(attr arrows)
if [[ $lanes_in_dom != "$lanes" ]]; then
  fail "expected as many <g class=\"lane\"> groups as data-lanes (${lanes:-missing}), found $lanes_in_dom"
fi
if [[ $arrows_in_dom != "$arrows" ]]; then
  fail "expected as many <path class=\"arrow\"> paths as data-arrows (${arrows:-missing}), found $arrows_in_dom"
fi

# --- 2. A screenshot ---
rm -f "$shot_abs"
run_chromium screenshot --window-size=1600,1000 --hide-scrollbars --screenshot="$shot_abs" "$url"
# A blank 1600x1000 page shoots to about 7 KB, the page's "no events" message to about 17 KB, and
# even a two-slice trace to over 40 KB.
min_bytes=20480
if [[ ! -f $shot_abs ]]; then
  fail "expected a screenshot at $shot_abs, found no file"
else
  size=$(stat -c %s "$shot_abs")
  signature=$(head -c 8 "$shot_abs" | od -An -tx1 | tr -d ' \n')
  echo "screenshot: $shot_abs, $size bytes"
  if [[ $signature != 89504e470d0a1a0a ]]; then
    fail "expected the screenshot to start with the PNG signature 89504e470d0a1a0a, found '$signature'"
  fi
  if ((size <= min_bytes)); then
    fail "expected the screenshot to be larger than $min_bytes bytes (a drawn timeline), found $size bytes"
  fi
fi

if ((failures > 0)); then
  echo "timeline check: $failures check(s) failed for $page" >&2
  exit 1
fi
echo "timeline check: all checks passed for $page"
