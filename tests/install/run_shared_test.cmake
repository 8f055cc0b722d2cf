# Shared-library test: builds tasklet with BUILD_SHARED_LIBS=ON (the libraries only), checks that
# they export the public API and nothing of the engine (check_exports.py), then runs the install
# test on that build: its CMake, pkg-config and Debian-package consumers link the shared libraries.
#
#   cmake -DSOURCE_DIR=<tasklet source dir> -DWORK_DIR=<scratch> [-DETCD=ON] [-DGENERATOR=<gen>]
#         [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>] -P run_shared_test.cmake
cmake_minimum_required(VERSION 3.25)

set(test_name "shared test")
include("${CMAKE_CURRENT_LIST_DIR}/script_steps.cmake")
require(SOURCE_DIR WORK_DIR)
file(REMOVE_RECURSE "${WORK_DIR}")
set(build "${WORK_DIR}/build")

if(NOT ETCD)
  set(ETCD OFF)
endif()
set(configure_args -S "${SOURCE_DIR}" -B "${build}" -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release
                   -DTASKLET_BUILD_TESTS=OFF -DTASKLET_BUILD_EXAMPLES=OFF "-DTASKLET_BUILD_ETCD=${ETCD}")
foreach(forwarded GENERATOR MAKE_PROGRAM CXX_COMPILER)
  if(${forwarded})
    if(forwarded STREQUAL "GENERATOR")
      list(APPEND configure_args -G "${GENERATOR}")
    else()
      list(APPEND configure_args "-DCMAKE_${forwarded}=${${forwarded}}")
    endif()
  endif()
endforeach()
step("configuring a shared build" COMMAND "${CMAKE_COMMAND}" ${configure_args})
step("building it" COMMAND "${CMAKE_COMMAND}" --build "${build}")

file(GLOB_RECURSE libraries "${build}/*.so")
list(LENGTH libraries count)
if(count LESS 2)
  message(FATAL_ERROR "shared test: expected libtasklet.so and libtasklet_rules.so in ${build}, found ${count}")
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
step("checking what they export" COMMAND "${Python3_EXECUTABLE}" "${SOURCE_DIR}/tests/install/check_exports.py"
     --source "${SOURCE_DIR}" ${libraries})

step("installing and consuming it"
  COMMAND "${CMAKE_COMMAND}" "-DBUILD_DIR=${build}" "-DSOURCE_DIR=${SOURCE_DIR}" "-DWORK_DIR=${WORK_DIR}/install"
          "-DGENERATOR=${GENERATOR}" "-DMAKE_PROGRAM=${MAKE_PROGRAM}" "-DCXX_COMPILER=${CXX_COMPILER}"
          "-DCONFIG=Release" "-DETCD=${ETCD}" -P "${SOURCE_DIR}/tests/install/run_install_test.cmake")
message(STATUS "shared test: passed")
