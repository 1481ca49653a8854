# Enables CUDA for oomb's own targets. nvcc must be there: with OOMB_ENABLE_CUDA=ON a missing
# compiler is a configure error, never a silent skip.
# Architectures default to 90a (Hopper's wgmma/TMA need it; such binaries run only on sm_90) and
# only when oomb is the top-level project: a consumer's choice is never overridden. `native`
# would fail on the machines without a GPU where CI compiles the CUDA side.
if(OOMB_TOP_LEVEL AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "OOMB_ENABLE_CUDA is ON but no CUDA compiler (nvcc) was found "
                      "(PATH=$ENV{PATH}). Install the CUDA toolkit, put nvcc on PATH or set "
                      "CMAKE_CUDA_COMPILER, or configure with -DOOMB_ENABLE_CUDA=OFF.")
endif()
enable_language(CUDA)
if(NOT DEFINED CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)  # nvcc's default; Debian's fmt 9.1 fails in .cu files under C++20
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endif()
find_package(CUDAToolkit REQUIRED)
message(STATUS "oomb: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
