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
