# Install rules: the headers, the exported targets (deft::deft, deft::cuda
# when DEFT_CUDA=ON, deft::dist when MPI was found), deftConfig.cmake with its version file, and deft.pc.
# Everything is architecture-independent, so the package files go under
# share/ rather than lib/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DEFT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/deft" CACHE STRING
    "Where deftConfig.cmake is installed, relative to the prefix")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/deft" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp")
set(deft_export_targets deft)
if(TARGET deft_cuda)
  list(APPEND deft_export_targets deft_cuda)
endif()
if(TARGET deft_dist)
  list(APPEND deft_export_targets deft_dist)
  set(DEFT_DIST_INSTALLED ON)
else()
  set(DEFT_DIST_INSTALLED OFF)
endif()
install(TARGETS ${deft_export_targets} EXPORT deftTargets)
install(EXPORT deftTargets NAMESPACE deft:: DESTINATION "${DEFT_INSTALL_CMAKEDIR}")

# The config file re-finds at the consumer what the exported targets name.
foreach(flag DEFT_BLAS DEFT_CUDA DEFT_OPENBLAS_FOUND)
  if(${flag})
    set(${flag} ON)
  else()
    set(${flag} OFF)
  endif()
endforeach()
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/deftConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/deftConfig.cmake" INSTALL_DESTINATION "${DEFT_INSTALL_CMAKEDIR}")
# 0.x releases may break the API between minor versions.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/deftConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/deftConfig.cmake" "${PROJECT_BINARY_DIR}/deftConfigVersion.cmake"
        DESTINATION "${DEFT_INSTALL_CMAKEDIR}")

# pkg-config: the same flags the CMake target carries.
set(DEFT_PC_REQUIRES "")
set(DEFT_PC_DEFINES "")
set(DEFT_PC_LIBS "")
if(DEFT_BLAS)
  set(DEFT_PC_DEFINES " -DDEFT_BLAS=1")
  if(DEFT_OPENBLAS_FOUND)
    set(DEFT_PC_REQUIRES " openblas")
  else()
    foreach(lib IN LISTS BLAS_LIBRARIES)
      string(APPEND DEFT_PC_LIBS " ${lib}")
    endforeach()
    string(APPEND DEFT_PC_DEFINES " -I${DEFT_CBLAS_INCLUDE_DIR}")
  endif()
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/deft.pc.in" "${PROJECT_BINARY_DIR}/deft.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/deft.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
# deft-dist.pc: deft plus MPI (Open MPI's ompi-cxx, MPICH's mpich).
if(DEFT_DIST_INSTALLED)
  set(DEFT_PC_MPI "")
  foreach(dir IN LISTS MPI_CXX_INCLUDE_DIRS)
    string(APPEND DEFT_PC_MPI " -I${dir}")
  endforeach()
  set(DEFT_PC_MPI_LIBS "")
  foreach(lib IN LISTS MPI_CXX_LIBRARIES)
    string(APPEND DEFT_PC_MPI_LIBS " ${lib}")
  endforeach()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/deft-dist.pc.in" "${PROJECT_BINARY_DIR}/deft-dist.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/deft-dist.pc" DESTINATION "${CMAKE_INSTALL_DATADIR}/pkgconfig")
endif()
