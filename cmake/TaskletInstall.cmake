include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TASKLET_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/tasklet")
# The layers are inside tasklet (src/api/CMakeLists.txt): only the libraries users link are installed.
install(TARGETS tasklet tasklet_rules
  EXPORT taskletTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT taskletTargets NAMESPACE tasklet:: DESTINATION ${TASKLET_CMAKE_DIR})
# The etcd component: its own export set, so that the package needs libcurl and nlohmann-json
# only when a user asks for it (find_package(tasklet COMPONENTS etcd)).
if(TASKLET_BUILD_ETCD)
  install(TARGETS tasklet_etcd
    EXPORT taskletEtcdTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT taskletEtcdTargets NAMESPACE tasklet:: DESTINATION ${TASKLET_CMAKE_DIR})
endif()
configure_package_config_file(cmake/taskletConfig.cmake.in
  "${PROJECT_BINARY_DIR}/taskletConfig.cmake" INSTALL_DESTINATION ${TASKLET_CMAKE_DIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/taskletConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/taskletConfig.cmake" "${PROJECT_BINARY_DIR}/taskletConfigVersion.cmake"
  DESTINATION ${TASKLET_CMAKE_DIR})

# pkg-config files, for builds without CMake. A static tasklet carries its dependencies in Libs;
# a shared one keeps them private.
if(BUILD_SHARED_LIBS)
  set(TASKLET_PC_REQUIRES "")
  set(TASKLET_PC_REQUIRES_PRIVATE "tbb")
  set(TASKLET_PC_LIBS "-ltasklet -ltasklet_rules")
  set(TASKLET_PC_LIBS_PRIVATE "-ltbbmalloc")
  set(TASKLET_ETCD_PC_REQUIRES "")
  set(TASKLET_ETCD_PC_REQUIRES_PRIVATE "libcurl")
else()
  set(TASKLET_PC_REQUIRES "tbb")
  set(TASKLET_PC_REQUIRES_PRIVATE "")
  set(TASKLET_PC_LIBS "-ltasklet -ltasklet_rules -ltbbmalloc")
  set(TASKLET_PC_LIBS_PRIVATE "")
  set(TASKLET_ETCD_PC_REQUIRES ", libcurl")
  set(TASKLET_ETCD_PC_REQUIRES_PRIVATE "")
endif()
configure_file(cmake/tasklet.pc.in "${PROJECT_BINARY_DIR}/tasklet.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/tasklet.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(TASKLET_BUILD_ETCD)
  configure_file(cmake/tasklet-etcd.pc.in "${PROJECT_BINARY_DIR}/tasklet-etcd.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/tasklet-etcd.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

# The Debian package of the installed tree (cpack -G DEB in the build directory): libtasklet-dev.
# etcd's component needs libcurl's and nlohmann-json's development packages only where it is used.
set(CPACK_PACKAGE_NAME libtasklet-dev)
set(CPACK_PACKAGE_VENDOR tasklet)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "co-operative tasklets and Eclipse-style jobs with scheduling rules, on oneTBB (C++20)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "tasklet developers <tasklet@localhost>")
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libtbb-dev (>= 2021.5), libboost-dev (>= 1.74), pkg-config")
if(TASKLET_BUILD_ETCD)
  set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libcurl4-openssl-dev, nlohmann-json3-dev (>= 3)")
endif()
include(CPack)
