# Install rules: headers, the exported target oomb::oomb, oombConfig.cmake + version file, oomb.pc,
# the licence. The package is architecture-independent (headers only).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(OOMB_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/oomb" CACHE STRING
    "Where oombConfig.cmake is installed (relative to the prefix)")
set(OOMB_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig" CACHE STRING
    "Where oomb.pc is installed (relative to the prefix)")
mark_as_advanced(OOMB_INSTALL_CMAKEDIR OOMB_INSTALL_PKGCONFIGDIR)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/oomb" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT oomb_development FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")
install(TARGETS oomb EXPORT oombTargets)
install(EXPORT oombTargets NAMESPACE oomb:: DESTINATION "${OOMB_INSTALL_CMAKEDIR}"
        COMPONENT oomb_development)
# oomb::cuda in its own export set: the package config loads it only where the consumer's
# find_package(CUDAToolkit) succeeds, so CPU-only consumers never need the toolkit.
if(TARGET oomb_cuda)
  install(TARGETS oomb_cuda EXPORT oombCudaTargets)
  install(EXPORT oombCudaTargets NAMESPACE oomb:: DESTINATION "${OOMB_INSTALL_CMAKEDIR}"
          COMPONENT oomb_development)
endif()

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/oombConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/oombConfig.cmake"
  INSTALL_DESTINATION "${OOMB_INSTALL_CMAKEDIR}")
# While the major version is 0, a minor release may break the API: only the same minor matches.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(oomb_compatibility SameMinorVersion)
else()
  set(oomb_compatibility SameMajorVersion)
endif()
write_basic_package_version_file("${PROJECT_BINARY_DIR}/oombConfigVersion.cmake"
  COMPATIBILITY ${oomb_compatibility} ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/oombConfig.cmake" "${PROJECT_BINARY_DIR}/oombConfigVersion.cmake"
        DESTINATION "${OOMB_INSTALL_CMAKEDIR}" COMPONENT oomb_development)

# oomb.pc finds its prefix from its own directory (${pcfiledir}), so the install is relocatable.
if(IS_ABSOLUTE "${OOMB_INSTALL_PKGCONFIGDIR}")
  set(OOMB_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")  # cannot be found relative to an absolute dir
else()
  file(RELATIVE_PATH oomb_pc_up "/oomb-prefix/${OOMB_INSTALL_PKGCONFIGDIR}" "/oomb-prefix")
  string(REGEX REPLACE "/$" "" oomb_pc_up "${oomb_pc_up}")
  set(OOMB_PC_PREFIX "\${pcfiledir}/${oomb_pc_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(OOMB_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(OOMB_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/oomb.pc.in" "${PROJECT_BINARY_DIR}/oomb.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/oomb.pc" DESTINATION "${OOMB_INSTALL_PKGCONFIGDIR}"
        COMPONENT oomb_development)

install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DOCDIR}"
        COMPONENT oomb_development)
