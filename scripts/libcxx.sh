#!/usr/bin/env bash
# The clang 14 + libc++ lane (CI runs it after the clang-tidy lane): everything else is built with
# GCC 12 and libstdc++; this lane builds the library, tests and examples with clang++-14
# -stdlib=libc++ and -Werror (preset libcxx), on a oneTBB built the same way
# (scripts/build-tbb.sh libcxx) and on googletest built the same way from Debian's source in
# /usr/src/googletest (into build/gtest-libcxx/install): a libc++ program links neither Debian's
# libtbb nor its libgtest, both built on libstdc++. It checks that a test binary really runs on
# libc++ and that oneTBB, then runs `ctest --preset libcxx` (labels unit, rules, example; etcd is
# off in this lane). Extra arguments go to ctest.
#
#   TASKLET_JOBS   build and ctest parallelism (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

jobs="${TASKLET_JOBS:-$(nproc)}"

lane="libc++ lane"
source scripts/lane_steps.sh

step "oneTBB with clang++-14 -stdlib=libc++"
TASKLET_TBB_JOBS="$jobs" bash scripts/build-tbb.sh libcxx  # also installs clang-14 and libc++

# googletest: the source of Debian's googletest package (libgtest-dev, which scripts/install-deps.sh
# installs, depends on it). Rebuilt only when the package version, compiler or flags change.
step "googletest with clang++-14 -stdlib=libc++"
gtest_src=/usr/src/googletest
gtest_work="$root/build/gtest-libcxx"
gtest_args=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DCMAKE_CXX_COMPILER=clang++-14
  -DCMAKE_C_COMPILER=clang-14
  -DCMAKE_CXX_FLAGS=-stdlib=libc++
  -DCMAKE_INSTALL_PREFIX="$gtest_work/install"
  -DCMAKE_INSTALL_LIBDIR=lib
)
[ -f "$gtest_src/CMakeLists.txt" ] || { echo "$lane: no $gtest_src (apt-get install googletest)" >&2; exit 1; }
compiler_version=$(clang++-14 --version)
gtest_stamp_text="googletest $(dpkg-query -W -f='${Version}' googletest) | ${compiler_version%%$'\n'*} | ${gtest_args[*]}"
gtest_stamp="$gtest_work/install/tasklet-gtest.stamp"
if [ -f "$gtest_stamp" ] && [ "$(cat "$gtest_stamp")" = "$gtest_stamp_text" ]; then
  echo "$lane: googletest up to date in $gtest_work/install"
else
  rm -rf "$gtest_work"
  cmake -S "$gtest_src" -B "$gtest_work/build" "${gtest_args[@]}" >/dev/null
  cmake --build "$gtest_work/build" -j "$jobs"
  cmake --install "$gtest_work/build" >/dev/null
  echo "$gtest_stamp_text" >"$gtest_stamp"
fi

step "configure and build (preset libcxx)"
cmake --preset libcxx >/dev/null
cmake --build --preset libcxx -j "$jobs"

# The lane is only worth something if the binaries run on libc++ and on the oneTBB built on it:
# libstdc++ in the same process would mean something was still built against it (Debian's
# libtbb, libgtest), and that the lane tests less than it says.
loads_tbb_from "$root/build/tbb-libcxx/install/lib" \
  build/libcxx/tests/scheduler/unit_scheduler_test build/libcxx/examples/request_response
for binary in build/libcxx/tests/scheduler/unit_scheduler_test build/libcxx/examples/request_response; do
  loaded="$(ldd "$binary")"
  if ! grep -qF "libc++.so.1 => " <<<"$loaded" || grep -qF "libstdc++" <<<"$loaded"; then
    echo "$lane: $binary does not load libc++ alone:" >&2
    echo "$loaded" >&2
    exit 1
  fi
done

step "ctest --preset libcxx"
ctest --preset libcxx -j "$jobs" "$@"
step "done"
