#!/usr/bin/env bash
# Builds oneTBB (tbb + tbbmalloc) for a sanitizer lane or the libc++ lane:
# scripts/build-tbb.sh tsan|asan|libcxx
#
#   tsan  instrumented for ThreadSanitizer (-DTBB_SANITIZE=thread). Debian's libtbb12 is not
#         instrumented, so TSan cannot see oneTBB's synchronisation and reports false races on
#         everything handed between threads through it.
#   asan  resumable tasks on threads instead of swapped stacks (__TBB_RESUMABLE_TASKS_USE_THREADS,
#         what oneTBB itself picks under sanitizers). AddressSanitizer cannot follow the
#         swapcontext of Debian's build: an exception thrown in a job resumed on another stack
#         leaves stale shadow behind, and a later frame reports a false stack-use-after-scope.
#         Not instrumented, so the gcc (asan preset) and clang (fuzz preset) builds can share it.
#   libcxx  built with clang++-14 -stdlib=libc++ (Debian's clang-14, libc++-14-dev,
#           libc++abi-14-dev): a program built on libc++ cannot link Debian's libtbb, whose
#           interface (std::exception_ptr, std::string, ...) is libstdc++'s.
#
# It fetches the Debian source package of the *installed* libtbb-dev version (same headers, same
# Debian patches) and installs the build into a prefix inside the build tree:
#
#   build/tbb-<flavour>/install        (override: TASKLET_TBB_PREFIX=/abs/path)
#
# It first installs what is missing via apt (dpkg-dev for apt-get source, cmake, ninja, the
# flavour's compiler and standard library). Idempotent: when the prefix holds a build of the same
# source version, compiler and flags (see the stamp file in it) it does nothing more. Otherwise it
# adds a deb-src entry for Debian 12 if none serves the source, runs apt-get update only when the
# source is not found, and builds with ninja (TASKLET_TBB_JOBS, default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

flavour="${1:-}"
case "$flavour" in
  tsan | asan | libcxx) ;;
  *) echo "usage: scripts/build-tbb.sh tsan|asan|libcxx" >&2; exit 2 ;;
esac
work="$root/build/tbb-$flavour"
prefix="${TASKLET_TBB_PREFIX:-$work/install}"
jobs="${TASKLET_TBB_JOBS:-$(nproc)}"

log() { echo "$flavour-tbb: $*"; }
fail() { echo "$flavour-tbb: $*" >&2; exit 1; }
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "build-tbb: run as root (apt) or install the packages by hand" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive

# The project's own packages first (libtbb-dev tells which oneTBB version to build).
bash scripts/install-deps.sh

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]; }
src_package=$(dpkg-query -W -f='${source:Package}' libtbb-dev)
src_version=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
upstream_version=${src_version#*:}
upstream_version=${upstream_version%-*}

# Everything that changes the build goes into the stamp. gcc 12 warns (-Wtsan) for each
# std::atomic_thread_fence in oneTBB (concurrent_monitor's prepare_wait/notify handshake): TSan
# does not model stand-alone fences. Its waits and wake-ups still go through futex/mutex paths
# TSan follows, and the lane has seen no report from there; -Wno-tsan keeps the build log short.
cxx=c++
compiler_packages=(g++)
case "$flavour" in
  tsan) flavour_args=(-DTBB_SANITIZE=thread -DCMAKE_CXX_FLAGS=-Wno-tsan) ;;
  asan) flavour_args=(-DCMAKE_CXX_FLAGS=-D__TBB_RESUMABLE_TASKS_USE_THREADS=1) ;;
  libcxx)
    # CMake passes CMAKE_CXX_FLAGS to the link too, so libtbb links libc++ and libc++abi.
    cxx=clang++-14
    compiler_packages=(clang-14 libc++-14-dev libc++abi-14-dev)
    flavour_args=(-DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS=-stdlib=libc++)
    ;;
esac
cmake_args=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_INSTALL_PREFIX="$prefix"
  -DCMAKE_INSTALL_LIBDIR=lib
  "${flavour_args[@]}"
  -DTBB_TEST=OFF
  -DTBB_EXAMPLES=OFF
  -DTBB_STRICT=OFF
  -DTBBMALLOC_BUILD=ON
  -DTBBMALLOC_PROXY_BUILD=OFF
  -DTBB_DISABLE_HWLOC_AUTOMATIC_SEARCH=ON
  -DTBB_ENABLE_IPO=OFF
)
# Tools: apt-get source needs dpkg-dev (dpkg-source); the build needs cmake, ninja and the
# flavour's compiler (the stamp below asks it for its version).
missing=()
for package in dpkg-dev cmake ninja-build "${compiler_packages[@]}"; do
  installed "$package" || missing+=("$package")
done
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  if ! "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    "${sudo_cmd[@]}" apt-get update -qq
    apt_updated=1
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

compiler_version=$("$cxx" --version)
compiler_version=${compiler_version%%$'\n'*}  # first line; no `| head` under pipefail
stamp_text="$src_package $src_version | $compiler_version | ${cmake_args[*]}"
stamp="$prefix/tasklet-tbb-$flavour.stamp"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ] \
   && [ -f "$prefix/lib/cmake/TBB/TBBConfig.cmake" ]; then
  log "up to date in $prefix ($src_package $src_version)"
  exit 0
fi
log "building $src_package $src_version (${flavour_args[*]}) into $prefix"

# Source: is the exact version served by a deb-src entry?
source_known() {
  # Read whole before grep: with pipefail, an early `grep -q` exit would fail the pipe (SIGPIPE).
  local sources
  sources="$(apt-cache showsrc "$src_package" 2>/dev/null || true)"
  grep -qxF "Version: $src_version" <<<"$sources"
}
if ! source_known; then
  # No deb-src serving it: add one for Debian 12 (main, updates, security), unless one exists.
  if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding deb-src entries for bookworm (main) in /etc/apt/sources.list.d/tasklet-deb-src.sources"
    "${sudo_cmd[@]}" tee /etc/apt/sources.list.d/tasklet-deb-src.sources >/dev/null <<'EOF'
# Added by tasklet's scripts/build-tbb.sh: source packages, to build oneTBB for the sanitizer and libc++ lanes.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  if [ "$apt_updated" -eq 0 ]; then
    "${sudo_cmd[@]}" apt-get update -qq
  fi
  source_known || fail "no deb-src serves $src_package $src_version"
fi

# Fetch and unpack (Debian patches applied) into a clean directory.
src_parent="$root/build/tbb-src"  # shared by the flavours
src_dir="$src_parent/$src_package-$upstream_version"
if [ ! -f "$src_dir/CMakeLists.txt" ] || [ "$(cat "$src_parent/version" 2>/dev/null)" != "$src_version" ]; then
  rm -rf "$src_parent"
  mkdir -p "$src_parent"
  log "apt-get source $src_package=$src_version"
  (cd "$src_parent" && apt-get source -qq "$src_package=$src_version" >/dev/null)
  echo "$src_version" >"$src_parent/version"
fi
[ -f "$src_dir/CMakeLists.txt" ] || fail "no CMakeLists.txt in $src_dir"

# Configure, build (tbb and tbbmalloc only: no tests, examples, proxy or hwloc binding), install.
bin_dir="$work/build"
rm -rf "$bin_dir" "$prefix"
mkdir -p "$work"
cmake -S "$src_dir" -B "$bin_dir" "${cmake_args[@]}" >"$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$bin_dir" -j "$jobs" --target tbb tbbmalloc
cmake --install "$bin_dir" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
echo "$stamp_text" >"$stamp"
log "installed in $prefix"
