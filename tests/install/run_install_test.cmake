# Install test (abseil's cmake_install_test.sh, as a cmake -P script so it needs no shell):
# installs a configured and built tasklet tree into a fresh prefix, checks the installed layout,
# then configures, builds and runs tests/install/consumer against that prefix alone.
#
#   cmake -DBUILD_DIR=<tasklet build dir> -DSOURCE_DIR=<tasklet source dir> -DWORK_DIR=<scratch>
#         [-DCONFIG=<config>] [-DGENERATOR=<gen>] [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>]
#         [-DSANITIZER=|address|thread] [-DTBB_DIR=<dir>] [-DBoost_DIR=<dir>] [-DETCD=ON]
#         -P run_install_test.cmake
#
# The consumer is built with the library's build type, generator and compiler, and finds the
# same oneTBB and Boost packages (a sanitizer lane may use its own oneTBB build); with a sanitizer
# the library's objects need its runtime, so the consumer compiles and links with the same
# -fsanitize flags (as tasklet_sanitize() gives tasklet's own executables).
cmake_minimum_required(VERSION 3.25)

set(test_name "install test")
include("${CMAKE_CURRENT_LIST_DIR}/script_steps.cmake")
require(BUILD_DIR SOURCE_DIR WORK_DIR)

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(config_args "")
set(cpack_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
  set(cpack_args -C "${CONFIG}")
endif()

# 1. Install the build tree.
step("installing ${BUILD_DIR} into ${prefix}"
  COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})

# 2. The installed tree: the package config and exactly the public headers, no private ones.
file(GLOB_RECURSE config_files "${prefix}/*/taskletConfig.cmake")
if(NOT config_files)
  message(FATAL_ERROR "install test: no taskletConfig.cmake under ${prefix}")
endif()
set(headers tasklet.hpp tasklet/tasklet.hpp tasklet/scheduler.hpp tasklet/rules/rules.hpp)
if(ETCD)
  list(APPEND headers tasklet/etcd/etcd.hpp)
endif()
foreach(header IN LISTS headers)
  if(NOT EXISTS "${prefix}/include/${header}")
    message(FATAL_ERROR "install test: public header ${header} was not installed")
  endif()
endforeach()
file(GLOB_RECURSE installed_headers RELATIVE "${prefix}/include" "${prefix}/include/*")
foreach(header IN LISTS installed_headers)
  if(NOT EXISTS "${SOURCE_DIR}/include/${header}" AND NOT EXISTS "${SOURCE_DIR}/rules/include/${header}"
     AND NOT EXISTS "${SOURCE_DIR}/etcd/include/${header}")
    message(FATAL_ERROR "install test: installed ${header} is not a public header of include/, rules/include/ or etcd/include/")
  endif()
endforeach()

# Only the libraries users link: the engine's layers are inside libtasklet.
file(GLOB_RECURSE installed_libraries "${prefix}/lib*/*.a" "${prefix}/lib*/*.so*")
if(NOT installed_libraries)
  message(FATAL_ERROR "install test: no library under ${prefix}")
endif()
foreach(library IN LISTS installed_libraries)
  get_filename_component(name "${library}" NAME)
  if(NOT name MATCHES "^libtasklet(_rules|_etcd)?\\.(a|so)")
    message(FATAL_ERROR "install test: ${name} is installed; only libtasklet, libtasklet_rules and libtasklet_etcd should be")
  endif()
endforeach()

# The library's objects need the sanitizer's runtime: consumers compile and link with its flags.
set(sanitizer_flags "")
if(SANITIZER STREQUAL "address")
  set(sanitizer_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
elseif(SANITIZER STREQUAL "thread")
  set(sanitizer_flags "-fsanitize=thread -fno-omit-frame-pointer")
elseif(NOT "${SANITIZER}" STREQUAL "")
  message(FATAL_ERROR "install test: SANITIZER must be '', address or thread (got '${SANITIZER}')")
endif()

# run_consumer(<name> <prefix> <configure args...>): configures, builds and runs the consumer
# against <prefix> only.
function(run_consumer name prefix)
  set(consumer_build "${WORK_DIR}/consumer-${name}")
  set(configure_args
    -S "${SOURCE_DIR}/tests/install/consumer" -B "${consumer_build}"
    "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  if(GENERATOR)
    list(APPEND configure_args -G "${GENERATOR}")
  endif()
  if(MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()
  if(CXX_COMPILER)
    list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  if(CONFIG)
    list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
  endif()
  foreach(dependency_dir TBB_DIR Boost_DIR)
    if(${dependency_dir})
      list(APPEND configure_args "-D${dependency_dir}=${${dependency_dir}}")
    endif()
  endforeach()
  if(sanitizer_flags)
    list(APPEND configure_args "-DCMAKE_CXX_FLAGS=${sanitizer_flags}"
      "-DCMAKE_EXE_LINKER_FLAGS=${sanitizer_flags}")
  endif()
  list(APPEND configure_args ${ARGN})
  step("configuring the consumer (${name})" COMMAND "${CMAKE_COMMAND}" ${configure_args})

  # The package must have come from the prefix, not from the build tree or the system.
  file(STRINGS "${consumer_build}/CMakeCache.txt" found_dir REGEX "^tasklet_DIR:")
  string(REGEX REPLACE "^tasklet_DIR:[A-Z]+=" "" found_dir "${found_dir}")
  file(REAL_PATH "${prefix}" real_prefix)
  file(REAL_PATH "${found_dir}" real_found_dir)
  string(FIND "${real_found_dir}/" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "install test: the consumer found tasklet in '${found_dir}', not under ${prefix}")
  endif()

  step("building the consumer (${name})" COMMAND "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})
  set(consumer "${consumer_build}/tasklet_install_consumer")
  if(CONFIG AND NOT EXISTS "${consumer}" AND EXISTS "${consumer_build}/${CONFIG}/tasklet_install_consumer")
    set(consumer "${consumer_build}/${CONFIG}/tasklet_install_consumer")  # multi-config generators
  endif()
  step("running the consumer (${name})" COMMAND "${consumer}")
endfunction()

# run_pkg_config_consumer(<name> <prefix>): the consumer built without CMake, with the compiler
# and pkg-config's flags only (tasklet.pc, and tasklet-etcd.pc with the component).
function(run_pkg_config_consumer name prefix)
  file(GLOB_RECURSE pc_files "${prefix}/*/tasklet.pc")
  if(NOT pc_files)
    message(FATAL_ERROR "install test: no tasklet.pc under ${prefix}")
  endif()
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  set(tbb_rpath "")
  if(TBB_DIR AND EXISTS "${TBB_DIR}/../../pkgconfig/tbb.pc")
    # A lane's own oneTBB (a sanitizer's): its tbb.pc, and found at run time as the CMake consumer's.
    get_filename_component(tbb_libdir "${TBB_DIR}/../.." ABSOLUTE)
    set(ENV{PKG_CONFIG_PATH} "${pc_dir}:${tbb_libdir}/pkgconfig")
    set(tbb_rpath "-Wl,-rpath,${tbb_libdir}")
  endif()
  set(packages tasklet)
  set(defines "")
  if(ETCD)
    set(packages tasklet-etcd)
    set(defines -DTASKLET_CONSUMER_ETCD)
  endif()
  find_program(PKG_CONFIG pkg-config REQUIRED)
  execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs ${packages} OUTPUT_VARIABLE pc_flags
                  RESULT_VARIABLE pc_result OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT pc_result EQUAL 0)
    message(FATAL_ERROR "install test: pkg-config --cflags --libs ${packages} failed")
  endif()
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  # A shared libtasklet is found at run time where pkg-config says it lies.
  execute_process(COMMAND "${PKG_CONFIG}" --variable=libdir tasklet OUTPUT_VARIABLE libdir
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  list(APPEND pc_flags "-Wl,-rpath,${libdir}")
  separate_arguments(sanitizer_args UNIX_COMMAND "${sanitizer_flags}")
  set(compiler "${CXX_COMPILER}")
  if(NOT compiler)
    set(compiler c++)
  endif()
  set(consumer "${WORK_DIR}/consumer-${name}")
  step("building the consumer with pkg-config (${name}: ${packages})"
    COMMAND "${compiler}" -std=c++20 ${sanitizer_args} ${defines} "${SOURCE_DIR}/tests/install/consumer/main.cpp"
            -o "${consumer}" ${pc_flags} ${tbb_rpath})
  step("running the consumer built with pkg-config (${name})" COMMAND "${consumer}")
endfunction()

# 3. The consumer against the installed prefix only: with CMake, without the etcd component where
#    libcurl and nlohmann-json cannot be found, and with it when the tree built it; then with
#    pkg-config.
run_consumer(core "${prefix}" -DWITH_ETCD=OFF -DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON)
if(ETCD)
  run_consumer(etcd "${prefix}" -DWITH_ETCD=ON)
endif()
run_pkg_config_consumer(pkg-config "${prefix}")

# 4. The Debian package (libtasklet-dev) that CPack makes of the same tree, unpacked with dpkg-deb
#    into a scratch root: the same consumers against its /usr.
find_program(DPKG_DEB dpkg-deb REQUIRED)
get_filename_component(cmake_dir "${CMAKE_COMMAND}" DIRECTORY)
set(deb_dir "${WORK_DIR}/deb")
step("making the Debian package"
  COMMAND "${cmake_dir}/cpack" -G DEB --config "${BUILD_DIR}/CPackConfig.cmake" -B "${deb_dir}" ${cpack_args})
file(GLOB debs "${deb_dir}/libtasklet-dev_*.deb")
list(LENGTH debs deb_count)
if(NOT deb_count EQUAL 1)
  message(FATAL_ERROR "install test: expected one libtasklet-dev_*.deb in ${deb_dir}, found ${deb_count}")
endif()
set(root "${WORK_DIR}/deb-root")
step("unpacking ${debs}" COMMAND "${DPKG_DEB}" -x "${debs}" "${root}")
run_consumer(deb "${root}/usr" -DWITH_ETCD=${ETCD})
run_pkg_config_consumer(deb-pkg-config "${root}/usr")
message(STATUS "install test: passed")
