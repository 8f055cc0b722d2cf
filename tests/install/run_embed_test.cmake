# Embed test: configures, builds and runs tests/install/embed, which builds tasklet from its source
# as part of another project (add_subdirectory, or FetchContent of the git repository's HEAD).
#
#   cmake -DSOURCE_DIR=<tasklet source dir> -DWORK_DIR=<scratch> -DEMBED=subdirectory|fetch_content
#         [-DGENERATOR=<gen>] [-DMAKE_PROGRAM=<path>] [-DCXX_COMPILER=<path>] -P run_embed_test.cmake
cmake_minimum_required(VERSION 3.25)

set(test_name "embed test")
include("${CMAKE_CURRENT_LIST_DIR}/script_steps.cmake")
require(SOURCE_DIR WORK_DIR EMBED)
file(REMOVE_RECURSE "${WORK_DIR}")

set(configure_args -S "${SOURCE_DIR}/tests/install/embed" -B "${WORK_DIR}" "-DTASKLET_SOURCE=${SOURCE_DIR}"
                   "-DEMBED=${EMBED}")
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
step("configuring (${EMBED})" COMMAND "${CMAKE_COMMAND}" ${configure_args})
step("building (${EMBED})" COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}" --target tasklet_embed_consumer)
step("running (${EMBED})" COMMAND "${WORK_DIR}/tasklet_embed_consumer")
message(STATUS "embed test: passed")
