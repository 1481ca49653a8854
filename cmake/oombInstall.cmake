# Install rules: headers, the exported target oomb::oomb, oombConfig.cmake + version file, oomb.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/oomb" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS oomb EXPORT oombTargets)
install(EXPORT oombTargets NAMESPACE oomb:: DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/oomb")

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/oombConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/oombConfig.cmake"
  INSTALL_DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/oomb")
# Header-only: any architecture may consume the same headers.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/oombConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/oombConfig.cmake" "${PROJECT_BINARY_DIR}/oombConfigVersion.cmake"
  DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/oomb")

configure_file("${PROJECT_SOURCE_DIR}/cmake/oomb.pc.in" "${PROJECT_BINARY_DIR}/oomb.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/oomb.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
